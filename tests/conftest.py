"""Shared fixtures: a fresh ledger per test on SQLite and on PostgreSQL.

``ledger_url`` is parametrised over ``sqlite`` (a file in tmp_path) and
``postgresql`` (a uniquely named schema in the database named by
$PRIVCAL_TEST_DATABASE_URL, selected with ``options=-csearch_path=…`` and
dropped afterwards — safe under pytest-xdist, each test has its own schema).
Without that variable the PostgreSQL cases are skipped, except under CI=true,
where a missing or unreachable server is a failure.
"""

from __future__ import annotations

import os
import shutil
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

PG_ENV = "PRIVCAL_TEST_DATABASE_URL"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _pg_admin_url() -> str | None:
    url = os.environ.get(PG_ENV)
    if not url:
        if _in_ci():
            pytest.fail(f"CI=true but {PG_ENV} is not set: the PostgreSQL tests must run in CI")
        return None
    return url


def _psycopg_dsn(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(autouse=True)
def _isolated_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No test reads the developer's ledger: PRIVCAL_HOME points at a temp dir."""
    monkeypatch.delenv("PRIVCAL_DATABASE_URL", raising=False)
    monkeypatch.setenv("PRIVCAL_HOME", str(tmp_path_factory.mktemp("privcal_home")))


PLUGIN_DIR = Path(__file__).parent / "plugin_pkg"


@pytest.fixture(scope="session")
def _plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary site directory holding the example plugin distribution of ``plugin_pkg``:
    its package and a ``.dist-info`` with its name, version and entry points, generated from
    its ``pyproject.toml``. Nothing is installed into the environment the tests run in."""
    project = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())["project"]
    site = tmp_path_factory.mktemp("plugin_site")
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, eps in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for pkg in PLUGIN_DIR.iterdir():
        if (pkg / "__init__.py").exists() and not pkg.name.endswith(".egg-info"):
            shutil.copytree(pkg, site / pkg.name, ignore=shutil.ignore_patterns("__pycache__"))
    return site


@pytest.fixture
def example_plugin(_plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example plugin visible to this test only (sys.path and, for subprocesses,
    PYTHONPATH); the registry's cache is cleared before and after."""
    from privcal.calibrators import registry

    monkeypatch.syspath_prepend(str(_plugin_site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(_plugin_site), os.environ.get("PYTHONPATH", "")) if p))
    registry.clear_cache()
    yield _plugin_site
    registry.clear_cache()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[str]:
    """The URL of an empty (unmigrated) ledger on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/ledger.sqlite"
        return
    admin = _pg_admin_url()
    if admin is None:
        pytest.skip(f"{PG_ENV} not set")
    import psycopg

    schema = f"privcal_t_{uuid.uuid4().hex[:16]}"
    try:
        with psycopg.connect(_psycopg_dsn(admin), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        msg = f"PostgreSQL at {admin} is unreachable: {exc}"
        if _in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    sep = "&" if "?" in admin else "?"
    yield f"{admin}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(_psycopg_dsn(admin), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[object]:
    """A migrated :class:`privcal.storage.Ledger` on each backend."""
    from privcal.storage import Ledger

    led = Ledger(ledger_url)
    led.upgrade()
    yield led
    led.close()


@pytest.fixture
def accountant(ledger: object) -> object:
    """An :class:`privcal.accountant.Accountant` on the migrated ledger."""
    from privcal.accountant import Accountant

    return Accountant(ledger)  # type: ignore[arg-type]


# ------------------------------------------------------------------ a tiny calibrator
class FakeCalibrator:
    """A stand-in calibrator for accountant tests: threshold = the r-th smallest score.

    ``cost_value`` is what ``cost`` declares (None: non-private); ``fail`` makes
    ``calibrate`` crash, to test a crash between the charge and the release.
    """

    name = "fake"
    version = "9.9"
    privacy_model = "central-zcdp"
    inputs = frozenset({"scores"})
    summary = "test double"

    def __init__(self, cost_value: object = None, *, fail: bool = False) -> None:
        from privcal.calibrators.base import CalibratorParams

        self.cost_value = cost_value
        self.fail = fail
        self.calls = 0
        self.seen_n: list[int] = []

        class Params(CalibratorParams):
            pass

        self.Params = Params

    def cost(self, params: object, shape: object) -> object:
        return self.cost_value

    def guarantee(self, params: object, shape: object) -> object:
        from privcal.calibrators.base import CoverageGuarantee, conformal_rank

        r = conformal_rank(shape.n, params.alpha)  # type: ignore[attr-defined]
        return CoverageGuarantee(
            target=1 - params.alpha, lower=1 - params.alpha,  # type: ignore[attr-defined]
            over="calibration and test data", rank=r, statement="test", details={"n": shape.n},
        )

    def calibrate(self, data: object, params: object, rng: object) -> object:
        import math

        import numpy as np

        from privcal.calibrators.base import CalibrationResult, conformal_rank

        self.calls += 1
        if self.fail:
            raise RuntimeError("calibrator crashed")
        s = np.sort(np.asarray(data.scores))  # type: ignore[attr-defined]
        self.seen_n.append(int(s.size))
        r = conformal_rank(int(s.size), params.alpha)  # type: ignore[attr-defined]
        thr = math.inf if r > s.size else float(s[r - 1])
        return CalibrationResult(threshold=thr, diagnostics={"n": int(s.size), "rank": r})


@pytest.fixture
def fake_calibrator() -> type[FakeCalibrator]:
    """The FakeCalibrator class (instantiate with the cost it should declare)."""
    return FakeCalibrator
