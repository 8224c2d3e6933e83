"""Red team 7 (lead): options a session's method does not use are refused, not dropped.

Before, ``open_session("fedcp-qq", lower=0, upper=5)`` or an ldp-score session with
``bins=7`` opened as if the option meant something (it was silently ignored, and the CLI
and the service forwarded their defaults so nobody could tell given from not given).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.cli import main
from privcal.errors import InvalidInput
from privcal.storage.models import Charge
from privcal.storage.sessions import CollectionSession
from tests.seeded import Seeded


def _state(acct: Accountant) -> tuple[Any, ...]:
    with acct.ledger.read() as s:
        return (acct.ledger.head(),
                s.scalar(select(func.count()).select_from(CollectionSession)),
                s.scalar(select(func.count()).select_from(Charge)))


LDP = dict(alpha=0.1, epsilon=1.0, rounds=2, group_size=3)
FED2 = dict(alpha=0.1, epsilon=2.0, agents=5, local_n=200)
FED = dict(alpha=0.1, agents=3, local_n=50)

UNUSED = [
    ("fedcp-qq", FED, {"lower": 0.0}, "--lower"),
    ("fedcp-qq", FED, {"upper": 5.0}, "--upper"),
    ("fedcp-qq", FED, {"bins": 7}, "--bins"),
    ("fedcp-qq", FED, {"rounds": 2}, "--rounds"),
    ("fedcp-qq", FED, {"nominal": True}, "--nominal"),
    ("fedcp-qq", FED, {"failure_probability": 0.01}, "--failure-probability"),
    ("ldp-score", LDP, {"bins": 7}, "--bins"),
    ("ldp-score", LDP, {"agents": 3}, "--agents"),
    ("ldp-score", LDP, {"local_n": 3}, "--local-n"),
    ("fedcp2-qq", FED2, {"rounds": 2}, "--rounds"),
    ("fedcp2-qq", FED2, {"group_size": 2}, "--group-size"),
    ("fedcp2-qq", FED2, {"nominal": True}, "--nominal"),
    ("fedcp2-qq", FED2, {"delta": 0.01}, "--failure-probability"),
]


@pytest.mark.parametrize(("method", "base", "extra", "flag"), UNUSED)
def test_an_option_the_method_does_not_use_is_refused(accountant: Any, method: str,
                                                      base: dict[str, Any],
                                                      extra: dict[str, Any], flag: str) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5, allow_nonprivate=True)
    before = _state(acct)
    with pytest.raises(InvalidInput, match=f"{method} sessions take no {flag}"):
        S.open_session(acct, method, dataset="d", **base, **extra)
    assert _state(acct) == before
    S.open_session(acct, method, dataset="d", **base)  # the same request without it opens


def test_the_options_a_method_uses_keep_their_defaults(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    info = S.open_session(acct, "fedcp2-qq", dataset="d", **FED2)
    assert (info.params["bins"], info.params["lower"], info.params["upper"]) == (100, 0.0, 1.0)
    ldp = S.open_session(acct, "ldp-score", dataset="d", **LDP)
    assert ldp.params["failure_probability"] == 0.001
    assert (ldp.params["lower"], ldp.params["upper"]) == (0.0, 1.0)


def _url(ledger: Any) -> str:
    """A migrated ledger's URL, for the CLI (a new PostgreSQL schema is not created on use)."""
    return str(ledger.engine.url.render_as_string(hide_password=False))


def test_cli_refuses_bins_on_an_ldp_score_session(ledger: Any) -> None:
    ledger_url = _url(ledger)
    Accountant(ledger).create_dataset("d", epsilon=1, subject_epsilon=5)
    args = ["--db-url", ledger_url, "session", "open", "ldp-score", "--dataset", "d",
            "--alpha", "0.1", "--epsilon", "1", "--rounds", "2", "--group-size", "3"]
    res = CliRunner().invoke(main, [*args, "--bins", "7", "--json"])
    assert res.exit_code == 1, res.output  # bad input: one line, nothing changed
    assert "ldp-score sessions take no --bins" in json.loads(res.stdout)["error"]["message"]
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output


#: runs ``privcal ARGS`` in a fresh interpreter where the ``server`` extra's packages do not
#: import (a base install): a meta-path finder refuses them
_NO_SERVER = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "starlette", "uvicorn", "httpx"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _Block())
from privcal.cli import main
main(sys.argv[1:], prog_name="privcal")
"""


def test_token_create_works_without_the_server_extra(tmp_path: Any) -> None:
    """``privcal token create`` imported FastAPI (its checks lived in a route module): on a
    base install it died with a traceback. It needs no server."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'l.sqlite'}"

    def run(*args: str) -> Any:
        return subprocess.run([sys.executable, "-c", _NO_SERVER, "--db-url", url, *args],
                              capture_output=True, text=True, timeout=120)

    res = run("token", "create", "--role", "admin", "--name", "ops", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["token"].startswith("pcl_")
    assert "Traceback" not in res.stderr
    res = run("token", "list", "--json")
    assert res.returncode == 0 and len(json.loads(res.stdout)) == 1, res.stderr


def test_the_device_client_without_httpx_says_what_to_install() -> None:
    """A device with a base install got a bare ModuleNotFoundError from ``Reporter``; the
    ``client`` extra installs httpx, and the error names it."""
    import subprocess
    import sys

    code = _NO_SERVER.split("from privcal.cli")[0] + (
        "from privcal.client import Reporter\n"
        "from privcal.errors import InvalidInput\n"
        "try:\n    Reporter('http://127.0.0.1:9', 'pcl_x')\n"
        "except InvalidInput as exc:\n    print(exc)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "pip install 'privcal[client]'" in res.stdout
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["client"]] == ["httpx"]


def test_a_sqlite_ledger_commits_with_synchronous_full(tmp_path: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit must be on disk when it returns: privcal sets ``synchronous=FULL`` itself
    instead of trusting the SQLite build's WAL default (NORMAL on some builds, where a
    power cut can lose a charge whose release was already shown). Such a build is
    simulated: every new driver connection starts at NORMAL."""
    import sqlite3

    from privcal.storage import Ledger

    connect = sqlite3.connect

    def normal_by_default(*args: Any, **kw: Any) -> Any:
        conn = connect(*args, **kw)
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    monkeypatch.setattr(sqlite3, "connect", normal_by_default)
    monkeypatch.setattr(sqlite3.dbapi2, "connect", normal_by_default)  # what SQLAlchemy calls

    led = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    led.upgrade()
    with led.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    led.close()


def test_split_says_when_tied_scores_void_its_upper_bound(ledger: Any, tmp_path: Any) -> None:
    """Split's upper bound 1−α+1/(n+1) needs scores without ties (on {0, 0.5, 1} at n = 20,
    α = 0.1 the coverage is 0.988 against a stated ≤ 0.948). It is not private and sees its
    scores: the release counts the ties at its threshold and ``calibrate`` and ``release
    show`` print that the bound is void."""
    import numpy as np

    ledger_url = _url(ledger)
    Accountant(ledger).create_dataset("t", epsilon=1, allow_nonprivate=True)
    tied = np.array([0.0, 0.5, 1.0, 0.5] * 5)
    free = np.random.default_rng(0).random(20)
    args = ["--db-url", ledger_url, "calibrate", "split", "--dataset", "t", "--alpha", "0.1"]
    for scores, want in ((tied, 4), (free, 0)):  # five 1.0s, the threshold one of them
        path = tmp_path / f"s{want}.npy"
        np.save(path, scores)
        res = CliRunner().invoke(main, [*args, "--scores", str(path)])
        assert res.exit_code == 0, res.output
        assert ("4 other calibration scores equal the threshold: the upper bound 0.947619 "
                "(no ties) does not apply" in res.stdout) == (want > 0)
        doc = CliRunner().invoke(main, [*args, "--scores", str(path), "--json"])
        rel = json.loads(doc.stdout)["release"]
        assert rel["diagnostics"]["tied_at_threshold"] == want
        show = CliRunner().invoke(main, ["--db-url", ledger_url, "release", "show",
                                         str(rel["id"])])
        assert show.exit_code == 0, show.output
        assert ("does not apply to these scores" in show.stdout) == (want > 0)


GENERIC = "-local DP for each participating subject"


def _local_releases(acct: Accountant) -> dict[str, Any]:
    """An LDP-CP-L release, a FedCP²-QQ release (a session of 10 agents) and an LDP-CP-S
    release, each on dataset z."""
    import random

    import numpy as np

    from privcal.calibrators.fedplan import Fed2Plan
    from privcal.client import fedcp2_qq_message

    acct.create_dataset("z", rho=10, subject_epsilon=100)
    r = Seeded(0)
    probs = np.random.default_rng(3).dirichlet(np.ones(4), 3000)
    labels = np.random.default_rng(4).integers(0, 4, 3000)
    out = {"ldp-label": acct.calibrate("ldp-label", dataset="z", probs=probs, labels=labels,
                                       alpha=0.1, epsilon=2, rng=r,
                                       subjects=[f"v{i}" for i in range(3000)]),
           "ldp-score": acct.calibrate("ldp-score", dataset="z", alpha=0.1, epsilon=2, rng=r,
                                       scores=np.random.default_rng(2).beta(2, 5, 3000),
                                       subjects=[f"u{i}" for i in range(3000)])}
    info = S.open_session(acct, "fedcp2-qq", dataset="z", alpha=0.1, agents=10, local_n=100,
                          epsilon=5.0, bins=50)
    plan = Fed2Plan.model_validate(info.plan)
    g = np.random.default_rng(0)
    vals = [fedcp2_qq_message(g.uniform(size=100), plan, random.Random(j)) for j in range(10)]
    S.submit_reports(acct, info.id, [f"agent{j}" for j in range(10)], vals)
    out["fedcp2-qq"] = S.release_of(acct, info.id)
    return out


def test_a_local_release_states_what_its_epsilon_protects(accountant: Any) -> None:
    """Every local-DP release said "ε-local DP for each participating subject": false for
    LDP-CP-L (its features are sent in the clear) and for FedCP²-QQ (an agent's message is
    ε-DP per record of its data, not a local randomizer of its whole input)."""
    acct: Accountant = accountant
    rels = _local_releases(acct)
    label = rels["ldp-label"].privacy["statement"]
    assert label == ("2-local DP of each participating subject's label (label-only: its "
                     "features are sent in the clear)")
    fed = rels["fedcp2-qq"]
    assert fed.calibrator_version == "1.6.0"
    assert fed.privacy["statement"] == (
        "each agent's message is 5-DP with respect to any one of its own scores "
        "(record-level DP at each agent; not local DP of the agent's whole data)")
    details = fed.coverage.details
    assert "local DP at agent level" not in details["privacy"]
    assert "record-level" in details["privacy"] and "record-level" in fed.coverage.statement
    # LDP-CP-S: each subject's whole input is randomized (one RR bit): the generic sentence
    assert rels["ldp-score"].privacy["statement"] == "2" + GENERIC
    rep = acct.verify()
    assert (rep.guarantees_recomputed, rep.statements_not_compared) == (3, 0)


def test_old_local_wording_verifies_but_is_never_written_anew(accountant: Any) -> None:
    """A release recorded before its calibrator said what its ε protects (rule "ε0-local DP
    for each participating subject", the generic sentence) still verifies — its numbers and
    rule compared, its sentence counted as older wording, not reported as matching; a
    release written now in that form is refused; an old one whose numbers differ fails."""
    from privcal.accountant.release_privacy import LEGACY_LOCAL_RULE, LOCAL_RULE
    from privcal.accountant.releases import record_release
    from privcal.costs import LocalDP
    from privcal.errors import AuditFailed

    acct: Accountant = accountant
    rels = _local_releases(acct)
    rel = rels["ldp-label"]
    assert rel.privacy["rule"] == LOCAL_RULE
    old_privacy = {**rel.privacy, "rule": LEGACY_LOCAL_RULE, "statement": "2" + GENERIC}

    def paid(tag: str) -> list[int]:  # a release's own charge: one per release
        return [acct.charge_subjects("z", LocalDP(eps0=2),
                                     [f"{tag}{i}" for i in range(3000)]).charge_id]

    args = dict(method=rel.method, calibrator_version=rel.calibrator_version,
                threshold=rel.threshold, params=rel.params, shape=rel.shape,
                coverage=rel.coverage, privacy=old_privacy, diagnostics=rel.diagnostics)
    head = acct.ledger.head()
    with pytest.raises(InvalidInput, match=r"privacy\.rule"):
        acct.record_release("z", **args)  # type: ignore[arg-type]
    assert acct.ledger.head() == head
    before = acct.verify()
    assert before.statements_not_compared == 0
    record_release(acct.ledger, "z", _as_computed=True, charge_ids=paid("a"),
                   **args)  # as written then
    rep = acct.verify()
    assert rep.guarantees_recomputed == before.guarantees_recomputed + 1
    assert rep.statements_not_compared == 1  # the old sentence: older wording, not "match"
    assert "1 guarantee sentence not reproduced by the installed code" in rep.summary
    # an LDP-CP-S release of then: its sentence is the current one, nothing uncompared
    ldps = rels["ldp-score"]
    record_release(acct.ledger, "z", _as_computed=True, charge_ids=paid("c"),
                   **{**args, "method": ldps.method, "params": ldps.params,
                      "calibrator_version": ldps.calibrator_version, "shape": ldps.shape,
                      "threshold": ldps.threshold, "coverage": ldps.coverage,
                      "diagnostics": ldps.diagnostics,
                      "privacy": {**ldps.privacy, "rule": LEGACY_LOCAL_RULE}})
    assert acct.verify().statements_not_compared == 1
    worse = record_release(acct.ledger, "z", _as_computed=True, charge_ids=paid("b"),
                           **{**args, "privacy": {**old_privacy, "epsilon": "3"}}).id
    with pytest.raises(AuditFailed, match=f"release {worse} .*privacy.epsilon"):
        acct.verify()


def test_wrappers_pass_an_inner_method_s_input_rules_on() -> None:
    """A plugin's own ``check_inputs`` runs before the charge through the levels and
    Mondrian wrappers too (they fell back to its ``min_scores`` only)."""
    import numpy as np

    from privcal.calibrators.base import CalibrationInput, check_inputs
    from privcal.calibrators.levels import Levels
    from privcal.calibrators.mondrian import Mondrian
    from privcal.calibrators.split import SplitConformal

    class Picky(SplitConformal):  # a plugin refusing negative scores
        name = "picky"

        def check_inputs(self, params: Any, data: CalibrationInput) -> None:
            if (np.asarray(data.scores) < 0).any():
                raise InvalidInput("picky: negative scores")

    data = CalibrationInput(scores=np.array([0.1, -0.2, 0.3, 0.4]),
                            groups=np.array([0, 1, 0, 1]), group_count=2)
    lv = Levels(Picky())
    with pytest.raises(InvalidInput, match="picky: negative scores"):
        check_inputs(lv, lv.Params.model_validate({"alpha": [0.1, 0.2]}), data)
    mo = Mondrian(Picky())
    MP = {"alpha": 0.1, "groups": ["a", "b"], "group_by": "column", "public_groups": True}
    with pytest.raises(InvalidInput, match="picky: negative scores"):
        check_inputs(mo, mo.Params.model_validate(MP), data)
    ok = CalibrationInput(scores=np.abs(data.scores), groups=data.groups, group_count=2)
    check_inputs(mo, mo.Params.model_validate(MP), ok)


@pytest.mark.parametrize("grid", [dict(lower=-1.7e308, upper=1.7e308),  # a step overflows
                                  dict(lower=1.0, upper=1 + 1e-13, bins=1000)])  # below ulp
def test_a_federated_session_with_a_grid_agents_cannot_use_does_not_open(
        accountant: Any, grid: dict[str, Any]) -> None:
    """open_session planned FedCP²-QQ without building the agents' grid: such a session
    opened (row and audit entry) and then refused every message as off the grid."""
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    before = _state(acct)
    with pytest.raises(InvalidInput, match=r"grid|float"):
        S.open_session(acct, "fedcp2-qq", dataset="d", **{**FED2, **grid})
    assert _state(acct) == before


def test_numpy_amounts_are_the_floats_they_hold() -> None:
    """NumPy 2 spells ``repr(np.float64(0.1))`` "np.float64(0.1)": a budget or a charge of
    one was refused as not a number; a float32's ``str`` (0.1) is less than the value it
    holds (0.10000000149…), so it is charged as that value, never less."""
    from decimal import Decimal

    import numpy as np

    from privcal.costs import ZCDP, LocalDP

    acct = Accountant("sqlite://")
    acct.create_dataset("x", rho=np.float64(0.1))
    assert acct.budget("x").cap == {"rho": Decimal("0.1")}
    assert ZCDP(np.float64(0.1)).rho == Decimal("0.1")
    assert ZCDP(np.float32(0.1)).rho == Decimal("0.10000000149011612")
    acct.create_dataset("y", epsilon=1, subject_epsilon=2)
    acct.charge_subjects("y", np.float64(0.5), ["u1"])
    assert acct.subject_spend("y", "u1") == Decimal("0.5")
    assert LocalDP(eps0=np.float64(0.5)).eps0 == Decimal("0.5")


BIG = 10**400  # an int no float holds


@pytest.mark.parametrize("call", [
    lambda a: S.open_session(a, "ldp-score", dataset="d", alpha=BIG, epsilon=1, rounds=2,
                             group_size=2),
    lambda a: S.open_session(a, "ldp-score", dataset="d", alpha=0.1, epsilon=BIG, rounds=2,
                             group_size=2),
    lambda a: S.open_session(a, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=2,
                             group_size=2**62),  # reached the audit entry's JSON
    lambda a: a.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.1, scores=[0.5] * 300,
                          score_range=(0, BIG)),
    lambda a: __import__("privcal.client", fromlist=["x"]).binary_rr(True, BIG),
    lambda a: __import__("privcal.client", fromlist=["x"]).krr(1, BIG, 1.0),
    lambda a: __import__("privcal.calibrators.advisor", fromlist=["x"]).advise(
        2**63, 5, 1.0, 0.1),  # hung in scipy's binom.isf
    lambda a: __import__("privcal.calibrators.advisor_central", fromlist=["x"]).advise_central(
        "exponq", 0.1, n=1000, epsilon=1e308),  # scanned to 10⁹ for minutes, then was wrong
    lambda a: __import__("privcal", fromlist=["x"]).Release.load("a\x00"),
])
def test_edge_numbers_and_paths_are_one_line_errors(call: Any) -> None:
    """Found by fuzzing the public API (red team 7, G): each raised OverflowError,
    TypeError, ValueError or an RFC 8785 error, or ran for minutes; each is a one-line
    InvalidInput now, and nothing is written."""
    acct = Accountant("sqlite://")
    acct.create_dataset("d", rho=1, subject_epsilon=5)
    before = _state(acct)
    with pytest.raises(InvalidInput) as exc:
        call(acct)
    assert "\n" not in str(exc.value)
    assert _state(acct) == before
