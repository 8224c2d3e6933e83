"""``privcal audit verify`` / ``Accountant.verify`` recompute every release's guarantees.

The hash chain catches a row edited in the database (it no longer matches its log
entry); to test the *recomputation* itself, the installed calibrator code is
changed instead (monkeypatched guarantee, cost or version): the log still
verifies, but the recorded guarantee no longer matches what the installed code
computes, and verify must fail (exit 4) naming the release.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text

from privcal import Accountant, AuditFailed, Ledger
from privcal.calibrators import registry
from privcal.cli import main
from privcal.costs import ZCDP
from tests.seeded import Seeded

RNG = np.random.default_rng(5)
SCORES = RNG.beta(2, 5, 600)
AGENTS = np.repeat(np.arange(6), 100)


def _cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


@pytest.fixture
def filled(ledger_url: str) -> tuple[str, Accountant, dict[str, int]]:
    """A ledger with one release of most methods, including a shuffled local release charged
    to an (ε, δ) dataset."""
    assert _cli(ledger_url, "db", "upgrade").exit_code == 0
    acct = Accountant(Ledger(ledger_url))
    acct.create_dataset("z", rho=10, subject_epsilon=100, allow_nonprivate=True)
    acct.create_dataset("a", approx_epsilon=5, approx_delta=1e-6, subject_epsilon=100)
    r = Seeded(0)
    ids = {
        "pcoqs": acct.calibrate("pcoqs", dataset="z", scores=SCORES, alpha=0.1, rho=0.5, rng=r).id,
        "exponq": acct.calibrate("exponq", dataset="z", scores=SCORES, alpha=0.1, epsilon=1,
                                 rng=r).id,
        "split": acct.calibrate("split", dataset="z", scores=SCORES, alpha=0.1, rng=r).id,
        "fedcp2-qq": acct.calibrate("fedcp2-qq", dataset="z", scores=SCORES, agents=AGENTS,
                                    alpha=0.1, epsilon=8, rng=r).id,
        "ldp-score": acct.calibrate("ldp-score", dataset="a", scores=SCORES, alpha=0.1,
                                    epsilon=2, shuffled=True, rng=r,
                                    subjects=[f"u{i}" for i in range(len(SCORES))]).id,
    }  # fmt: skip
    acct.charge("z", ZCDP(rho=0.1), purpose="a mechanism outside privcal")
    return ledger_url, acct, ids


def test_verify_passes_and_recomputes_every_release(filled: Any) -> None:
    url, acct, ids = filled
    res = _cli(url, "audit", "verify")
    assert res.exit_code == 0, res.stderr
    assert f"{len(ids)} release guarantees recomputed and match" in res.stdout
    doc = json.loads(_cli(url, "audit", "verify", "--json").stdout)
    assert doc["ok"] is True and doc["guarantees_recomputed"] == len(ids)
    rep = acct.verify()
    assert rep.guarantees_recomputed == len(ids) and rep.releases == len(ids)
    head = _cli(url, "audit", "head").stdout.strip()
    assert _cli(url, "audit", "verify", "--expect-head", head).exit_code == 0


def test_shuffled_release_on_approx_dataset_recomputes(filled: Any) -> None:
    """Regression: the amplified cost charged to an (ε, δ) dataset is part of the recorded
    privacy, and the recomputation must reproduce it (it used to report a mismatch)."""
    _, acct, ids = filled
    rel = acct.release(ids["ldp-score"])
    assert rel.privacy["central_cost"]["kind"] == "approx"
    from privcal.accountant.verification import check_release

    res = check_release(acct, rel)
    assert res.ok, res.problems


def _patch_guarantee(monkeypatch: pytest.MonkeyPatch, method: str, **changes: Any) -> None:
    cal = registry.get(method).calibrator
    original = type(cal).guarantee

    def guarantee(self: Any, params: Any, shape: Any) -> Any:
        return original(self, params, shape).model_copy(update=changes)

    monkeypatch.setattr(type(cal), "guarantee", guarantee)


@pytest.mark.parametrize("method", ["pcoqs", "exponq", "fedcp2-qq"])
def test_changed_lower_bound_fails_naming_the_release(
    filled: Any, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    url, acct, ids = filled
    _patch_guarantee(monkeypatch, method, lower=0.5)
    res = _cli(url, "audit", "verify")
    assert res.exit_code == 4
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1
    assert f"release {ids[method]} ({method}" in line and "coverage.lower" in line
    with pytest.raises(AuditFailed, match=rf"release {ids[method]} \({method}"):
        acct.verify()


def test_changed_failure_probability_is_caught(
    filled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, ids = filled
    _patch_guarantee(monkeypatch, "pcoqs", failure_probability=0.2)
    res = _cli(url, "audit", "verify")
    assert res.exit_code == 4
    assert f"release {ids['pcoqs']}" in res.stderr and "failure_probability" in res.stderr


def test_changed_privacy_cost_is_caught(filled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url, acct, ids = filled
    cal = registry.get("exponq").calibrator
    from privcal.costs import PureDP

    monkeypatch.setattr(type(cal), "cost", lambda self, p, shape: PureDP(eps=p.epsilon / 2))
    res = _cli(url, "audit", "verify")
    assert res.exit_code == 4
    assert f"release {ids['exponq']} (exponq" in res.stderr and "privacy" in res.stderr
    with pytest.raises(AuditFailed, match="privacy"):
        acct.verify()


def test_changed_calibrator_version_is_caught(filled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url, _, ids = filled
    cal = registry.get("split").calibrator
    monkeypatch.setattr(type(cal), "version", "9.0.0")
    res = _cli(url, "audit", "verify")
    assert res.exit_code == 4
    assert f"release {ids['split']} (split" in res.stderr
    assert "installed 9.0.0" in res.stderr


def test_unpatched_again_after_monkeypatch(filled: Any) -> None:
    """The patches above are undone: the same kind of ledger verifies with the real code."""
    url, _, _ = filled
    assert _cli(url, "audit", "verify").exit_code == 0


@pytest.mark.parametrize(
    ("column", "value"),
    [("params", '{"alpha": 0.5, "rho": 0.5}'), ("coverage", '{"lower": 0.1}')],
)
def test_row_edited_in_the_database_is_caught(filled: Any, column: str, value: str) -> None:
    url, acct, ids = filled
    rid = ids["pcoqs"]
    with acct.ledger.engine.begin() as conn:
        if acct.ledger.backend == "postgresql":
            conn.execute(text(f"UPDATE releases SET {column} = CAST(:v AS JSON) WHERE id = :i"),
                         {"v": value, "i": rid})  # fmt: skip
        else:
            conn.execute(text(f"UPDATE releases SET {column} = :v WHERE id = :i"),
                         {"v": value, "i": rid})  # fmt: skip
    res = _cli(url, "audit", "verify")
    assert res.exit_code == 4
    assert res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1
    with pytest.raises(AuditFailed):
        acct.verify()


def test_verify_on_an_empty_ledger(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    assert _cli(url, "db", "upgrade").exit_code == 0
    rep = Accountant(Ledger(url)).verify()
    assert rep.guarantees_recomputed == 0 and rep.entries == 0
