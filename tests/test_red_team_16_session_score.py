"""Red team 16, F9: a collection session's release records the score its devices compute.

A session's devices or agents compute their own scores; its release recorded no score, so
``predict --score X`` (``Release.predict_set(score_name=X)``) read the threshold on whatever
score the user named, with that score's default options: agents sending ``aps`` order
statistics, read with ``lac``, covered 0.80 for a recorded 0.9, with no error. A session is
now opened with its score (``score=``, ``--score``, ``"score"``), which its status publishes
and its release records; predict uses it and refuses another. Sessions opened without one
(all those opened before) keep today's behaviour: predict needs ``--score``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from privcal import Release
from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.calibrators.fedplan import FedPlan
from privcal.calibrators.prediction_sets import prediction_sets
from privcal.calibrators.scores import label_scores
from privcal.cli import main
from privcal.client import fedcp_qq_message
from privcal.errors import InvalidInput
from privcal.storage.sessions import CollectionSession
from tests.seeded import Seeded

K, M, N, ALPHA = 10, 20, 50, 0.1
APS = {"name": "aps", "options": {"randomized": True}}


def _data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    probs = rng.dirichlet(np.ones(K) * 0.5, n)
    return probs, np.array([rng.choice(K, p=p) for p in probs])


def _fed_session(acct: Accountant, agents: int = M, **kw: Any) -> tuple[S.SessionInfo, list[float]]:
    """A fedcp-qq session on ``np`` whose agents send the order statistic of their aps
    scores (``agents`` of the M planned answer); the session and the messages."""
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    info = S.open_session(acct, "fedcp-qq", dataset="np", alpha=ALPHA, agents=M, local_n=N,
                          **kw)
    plan = FedPlan.model_validate(info.plan)
    rng = np.random.default_rng(7)
    msgs = []
    for j in range(agents):
        probs, y = _data(rng, N)
        msgs.append(fedcp_qq_message(label_scores("aps", probs, y, rng=Seeded(j)), plan))
    return info, msgs


def _rows(acct: Accountant) -> tuple[Any, int]:
    with acct.ledger.read() as s:
        return acct.ledger.head(), s.scalar(select(func.count()).select_from(CollectionSession))


def test_a_session_release_is_read_with_its_devices_score(accountant: Any, ledger_url: str,
                                                          tmp_path: Path) -> None:
    acct: Accountant = accountant
    info, msgs = _fed_session(acct, score="aps")
    # the agents read the score they must compute with the session's public state
    assert info.score == APS and info.params["score"] == APS
    assert S.session_status(acct, info.id).score == APS
    r = S.submit_reports(acct, info.id, [f"a{j}" for j in range(M)], msgs)
    rel = acct.release(r.session.release_id)
    assert rel.diagnostics["score"] == APS and "score" not in rel.params
    probs, y = _data(np.random.default_rng(11), 4000)
    # the harm: the threshold read on lac scores covers far less than the recorded 0.9
    wrong = prediction_sets("lac", probs, rel.threshold)
    assert wrong[np.arange(len(y)), y].mean() < 0.85 <= rel.coverage.lower
    with pytest.raises(InvalidInput, match="calibrated on score 'aps', not 'lac'"):
        rel.predict_set(probs, score_name="lac")
    with pytest.raises(InvalidInput, match="calibrated on score 'aps', not 'lac'"):
        rel.evaluate(probs, y, score_name="lac")
    sets = rel.predict_set(probs, rng=Seeded(3))  # no name needed: the recorded one
    assert sets[np.arange(len(y)), y].mean() >= 0.87
    assert np.array_equal(sets, prediction_sets("aps", probs, rel.threshold,
                                                rng=Seeded(3), randomized=True))
    assert Release.load(rel.model_dump_json()).diagnostics["score"] == APS
    # the CLI: the contradicting --score is one line, exit 1 (an input error); none works
    np.savetxt(tmp_path / "probs.csv", probs[:5], delimiter=",")
    cli = ["--db-url", ledger_url, "predict", "--release", str(rel.id), "--probs",
           str(tmp_path / "probs.csv")]
    res = CliRunner().invoke(main, [*cli, "--score", "lac"])
    assert res.exit_code == 1, res.output
    assert "calibrated on score 'aps', not 'lac'" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(main, cli)
    assert res.exit_code == 0, res.output
    acct.verify()


def test_an_ldp_score_release_records_the_score_with_every_option(accountant: Any) -> None:
    """The options the devices use are recorded in full (the defaults filled in), and the
    release's sets are computed with them, never with the score's defaults."""
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    info = S.open_session(acct, "ldp-score", dataset="d", alpha=ALPHA, epsilon=2, rounds=1,
                          group_size=4, score="raps", score_options={"lam": 0.0})
    raps = {"name": "raps", "options": {"randomized": True, "lam": 0.0, "k_reg": 5}}
    assert info.score == raps and info.params["score"] == raps
    r = S.submit_reports(acct, info.id, ["a", "b", "c", "d"], [1, 1, 0, 1], [0] * 4)
    rel = acct.release(r.session.release_id)
    assert rel.diagnostics["score"] == raps and "score" not in rel.params
    probs, _ = _data(np.random.default_rng(2), 50)
    thr = 0.5  # (four reports release a trivial +inf: the sets at a finite threshold)
    assert np.array_equal(
        rel.model_copy(update={"threshold": thr}).predict_set(probs, rng=Seeded(1)),
        prediction_sets("raps", probs, thr, rng=Seeded(1), randomized=True, lam=0.0,
                        k_reg=5))
    with pytest.raises(InvalidInput, match="not 'aps'"):
        rel.predict_set(probs, score_name="aps")
    acct.verify()


@pytest.mark.parametrize(("score", "options", "match"), [
    ("lacc", None, "unknown score 'lacc'"),
    (3, None, "unknown score 3"),
    ("aps", {"lam": 0.1}, "lam"),
    ("raps", {"lam": "much"}, "lam"),
    ("raps", {"lam": float("inf")}, "lam"),
    (None, {"randomized": False}, "score options need the score"),
    ("aps", [("randomized", False)], "score options must be a dict"),
])
def test_a_bad_score_at_open_is_one_line_and_opens_nothing(accountant: Any, score: Any,
                                                           options: Any, match: str) -> None:
    acct: Accountant = accountant
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    before = _rows(acct)
    with pytest.raises(InvalidInput, match=match) as exc:
        S.open_session(acct, "fedcp-qq", dataset="np", alpha=ALPHA, agents=M, local_n=N,
                       score=score, score_options=options)
    assert "\n" not in str(exc.value)
    assert _rows(acct) == before


def test_cli_open_records_the_score_and_refuses_a_bad_one(accountant: Any,
                                                          ledger_url: str) -> None:
    acct: Accountant = accountant
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    base = ["--db-url", ledger_url, "session", "open", "fedcp-qq", "--dataset", "np",
            "--alpha", "0.1", "--agents", "20", "--local-n", "50"]
    before = _rows(acct)
    res = CliRunner().invoke(main, [*base, "--score", "nope"])
    assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1, res.output
    assert "unknown score 'nope'" in res.output
    res = CliRunner().invoke(main, [*base, "--score-option", "randomized=false"])
    assert res.exit_code == 1 and "score options need the score" in res.output, res.output
    assert _rows(acct) == before
    res = CliRunner().invoke(main, [*base, "--score", "aps", "--score-option",
                                    "randomized=false", "--json"])
    assert res.exit_code == 0, res.output
    sid = int(__import__("json").loads(res.output)["id"])
    assert S.session_status(acct, sid).score == {"name": "aps",
                                                 "options": {"randomized": False}}
    res = CliRunner().invoke(main, ["--db-url", ledger_url, "session", "status", str(sid)])
    assert res.exit_code == 0 and "aps (randomized=False)" in res.output, res.output


def test_a_session_without_a_score_keeps_todays_behaviour(accountant: Any) -> None:
    """Sessions opened before F9 (and new ones opened without a score) record none: the
    release needs the score named at predict, as a release on precomputed scores does, and
    the ledger verifies as before."""
    acct: Accountant = accountant
    info, msgs = _fed_session(acct)
    assert info.score is None and "score" not in info.params
    r = S.submit_reports(acct, info.id, [f"a{j}" for j in range(M)], msgs)
    rel = acct.release(r.session.release_id)
    assert "score" not in rel.diagnostics
    probs, _ = _data(np.random.default_rng(1), 20)
    with pytest.raises(InvalidInput, match="precomputed scores"):
        rel.predict_set(probs)
    assert rel.predict_set(probs, score_name="lac").shape == (20, K)
    acct.verify()


@pytest.mark.parametrize("missing", ["infinite", "replan"])
def test_a_release_with_agents_missing_records_the_score(accountant: Any, missing: str) -> None:
    """A close that releases for the agents that answered pins its plan in the release's
    params: the calibrator's parameters, the score in the diagnostics (not in the params,
    which the calibrator validates)."""
    acct: Accountant = accountant
    info, msgs = _fed_session(acct, agents=M - 2, score="aps")
    S.submit_reports(acct, info.id, [f"a{j}" for j in range(M - 2)], msgs)
    closed = S.close_session(acct, info.id, allow_missing=True, missing=missing)
    assert closed.release_id is not None
    rel = acct.release(closed.release_id)
    assert rel.diagnostics["score"] == APS and "score" not in rel.params
    with pytest.raises(InvalidInput, match="not 'lac'"):
        rel.predict_set(_data(np.random.default_rng(1), 5)[0], score_name="lac")
    acct.verify()


def test_an_idempotent_open_binds_the_score(accountant: Any) -> None:
    """The score is part of the open request: a retry with the same key and score returns
    the session, another score under the key is refused."""
    acct: Accountant = accountant
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    kw: dict[str, Any] = dict(dataset="np", alpha=ALPHA, agents=M, local_n=N,
                              idempotency_key="open-1")
    a = S.open_session(acct, "fedcp-qq", score="aps", **kw)
    assert S.open_session(acct, "fedcp-qq", score="aps", **kw).id == a.id
    with pytest.raises(InvalidInput, match="already used"):
        S.open_session(acct, "fedcp-qq", score="lac", **kw)


def test_the_log_records_the_score_and_an_edited_one_is_refused(accountant: Any) -> None:
    """The ``session_open`` entry records the session's params with its score, the
    ``release`` entry the release's diagnostics with it; a release row whose score was
    edited in the database afterwards is not served, and ``audit verify`` fails."""
    import json

    from sqlalchemy import text

    from privcal.errors import AuditFailed
    from privcal.storage.service_reads import audit_entries

    acct: Accountant = accountant
    info, msgs = _fed_session(acct, score="aps")
    rid = S.submit_reports(acct, info.id, [f"a{j}" for j in range(M)], msgs).session.release_id
    docs = [json.loads(e.payload) for e in audit_entries(acct.ledger, limit=1000)]
    opened = [d["data"] for d in docs if d["kind"] == "session_open"]
    released = [d["data"] for d in docs if d["kind"] == "release"]
    assert opened[0]["params"]["score"] == APS and released[0]["diagnostics"]["score"] == APS
    with acct.ledger.engine.begin() as conn:
        row = conn.execute(text("SELECT diagnostics FROM releases WHERE id = :i"),
                           {"i": rid}).scalar_one()
        diag = json.loads(row) if isinstance(row, str) else dict(row)
        diag["score"] = {"name": "lac", "options": {}}
        conn.execute(text("UPDATE releases SET diagnostics = :d WHERE id = :i"),
                     {"d": json.dumps(diag), "i": rid})
    with pytest.raises(AuditFailed, match=f"release {rid} refused"):
        acct.release(rid)
    with pytest.raises(AuditFailed):
        acct.verify()
