"""Collection sessions driven from the CLI by simulated users/agents, on SQLite and PostgreSQL.

Every CLI invocation opens a fresh Ledger (a new process, as far as the ledger can tell);
the LDP-CP-S test also drops and recreates its library objects mid-session (a restart).
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from privcal.accountant import Accountant
from privcal.calibrators.fedplan import plan_fedcp2_qq
from privcal.cli import main
from privcal.client import binary_rr, fedcp2_qq_message
from privcal.storage import Ledger
from privcal.storage.sessions import SessionReport


def _cli(url: str, *args: str) -> Any:
    res = CliRunner().invoke(main, ["--db-url", url, *args])
    return res


def _json(url: str, *args: str) -> dict[str, Any]:
    res = _cli(url, *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _write(path: Path, header: list[str], rows: list[list[Any]]) -> str:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def test_ldp_score_session_from_cli_with_restart(ledger: Any, tmp_path: Path) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    Accountant(ledger).create_dataset("users", epsilon=1, subject_epsilon=2)
    opened = _json(url, "session", "open", "ldp-score", "--dataset", "users", "--alpha", "0.1",
                   "--epsilon", "2", "--rounds", "6", "--group-size", "3000")
    sid = str(opened["id"])
    assert opened["query"] == 0.5 and opened["round"] == 0
    rng = random.Random(20261122)
    next_user, batch, restarted = 0, 0, False
    while True:
        st = _json(url, "session", "status", sid)
        if st["status"] != "open":
            break
        q = st["query"]
        users = [f"user-{next_user + i}" for i in range(1300)]
        next_user += len(users)
        # each simulated user has a U[0,1] score and answers RR(score <= q) once
        rows = [[u, int(binary_rr(rng.random() <= q, 2.0, rng)), st["round"]] for u in users]
        out = _json(url, "session", "submit", sid, "--reports",
                    _write(tmp_path / f"b{batch}.csv", ["subject", "bit", "round"], rows))
        batch += 1
        assert out["accepted"] + out["rejected"] == len(rows)
        assert set(out["reasons"]) <= {"round full"}
        if out["session"]["round"] == 2 and not restarted:
            # restart: drop every object, reopen the ledger from its URL, read the state back
            ledger.close()
            fresh = Ledger(url)
            with fresh.read() as s:
                assert s.scalar(select(func.count()).select_from(SessionReport)) == 2 * 3000 + (
                    out["session"]["received"])
            fresh.close()
            restarted = True
    assert restarted
    assert st["status"] == "released" and st["release_id"] is not None
    acct = Accountant(Ledger(url))
    rel = acct.release(st["release_id"])
    assert rel.method == "ldp-score" and rel.diagnostics["session_id"] == int(sid)
    report = acct.verify()
    assert report.guarantees_recomputed == 1
    assert _cli(url, "audit", "verify").exit_code == 0
    # the published history is exactly what the stored reports say, round by round
    with acct.ledger.read() as s:
        per_round = dict(s.execute(
            select(SessionReport.round, func.count()).group_by(SessionReport.round)).all())
        ones = {r: int(v) for r, v in s.execute(
            select(SessionReport.round, func.count()).where(SessionReport.value == "1")
            .group_by(SessionReport.round)).all()}
    hist = rel.diagnostics["history"]
    assert len(hist) == rel.diagnostics["rounds_used"] == len(per_round)
    for h in hist:
        assert per_round[h["round"]] == h["count"] == 3000
        assert ones.get(h["round"], 0) == h["ones"]
    # each participating subject was charged ε once; the others never
    summ = acct.subject_summary("users")
    assert summ.subjects == sum(per_round.values()) and summ.max == 2
    # coverage on fresh data from the same distribution meets the recorded guarantee
    thr = rel.threshold
    fresh_scores = np.random.default_rng(7).random(200_000)
    assert float(np.mean(fresh_scores <= thr)) >= rel.coverage.lower == pytest.approx(0.9)


def test_fedcp2_session_from_cli(ledger: Any, tmp_path: Path) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    acct = Accountant(ledger)
    acct.create_dataset("hospitals", epsilon=1, subject_epsilon=10)
    opened = _json(url, "session", "open", "fedcp2-qq", "--dataset", "hospitals", "--agents", "5",
                   "--local-n", "200", "--alpha", "0.1", "--epsilon", "10", "--bins", "100",
                   "--range", "0", "1")
    sid = str(opened["id"])
    plan = plan_fedcp2_qq(5, 200, 0.1, 10, bins=100, smax=1.0)
    assert opened["plan"]["k_gamma"] == plan.k_gamma == 4 and opened["plan"]["l_cor"] == 3
    assert opened["grid"]["points"] == 100
    rng = random.Random(5)
    msgs = {f"h{j}": fedcp2_qq_message(np.array([rng.random() for _ in range(200)]), plan, rng)
            for j in range(6)}
    head = ledger.head()
    b0 = _write(tmp_path / "b0.csv", ["agent", "value"],
                [["h0", msgs["h0"]], ["h1", 0.123456789], ["h2", msgs["h2"]], ["h0", msgs["h0"]]])
    bad = _cli(url, "session", "submit", sid, "--reports", b0)  # a file with an off-grid row
    assert bad.exit_code == 1 and "report 2 of the batch" in bad.output  # refused whole
    assert "value off the published grid" in bad.output and ledger.head() == head
    b1 = _write(tmp_path / "b1.csv", ["agent", "value"],
                [["h0", msgs["h0"]], ["h2", msgs["h2"]], ["h0", msgs["h0"]]])
    out = _json(url, "session", "submit", sid, "--reports", b1)
    assert out["accepted"] == 2
    assert out["reasons"] == {"duplicate subject in batch": 1}
    # closing with agents missing is refused without the flag, and changes nothing
    head = ledger.head()
    res = _cli(url, "session", "close", sid)
    assert res.exit_code == 1 and "--allow-missing" in res.output
    assert ledger.head() == head
    b2 = _write(tmp_path / "b2.csv", ["agent", "value"],
                [["h2", msgs["h2"]], ["h1", msgs["h1"]], ["h3", msgs["h3"]], ["h4", msgs["h4"]],
                 ["h5", msgs["h5"]]])
    out = _json(url, "session", "submit", sid, "--reports", b2)
    assert out["accepted"] == 3
    assert out["reasons"] == {"all agents have answered (extra agent beyond m)": 1,
                              "subject already reported in this session": 1}
    st = out["session"]
    assert st["status"] == "released"
    rel = acct.release(st["release_id"])
    # the agent left out is a uniformly random one of the four usable rows, never the last
    # in file order (red team 6: a batch's order may depend on its values)
    left = [a for a in ("h1", "h3", "h4", "h5") if acct.subject_spend("hospitals", a) == 0]
    assert len(left) == 1
    five = sorted(msgs[a] for a in ("h0", "h1", "h2", "h3", "h4", "h5") if a not in left)
    assert rel.threshold == (five[plan.k_gamma - 1] if five[plan.k_gamma - 1] < 1 else np.inf)
    assert acct.verify().guarantees_recomputed == 1
    # a late message changes nothing
    head = ledger.head()
    late = _cli(url, "session", "submit", sid, "--reports", _write(
        tmp_path / "late.csv", ["agent", "value"], [["h9", msgs["h5"]]]), "--json")
    # issue 15: a batch of which nothing is accepted exits 1, with the counts
    assert late.exit_code == 1
    err = json.loads(late.stdout)["error"]
    assert err["accepted"] == 0 and err["reasons"] == {"late: session is released": 1}
    assert ledger.head() == head
    assert acct.subject_spend("hospitals", "h9") == 0
    assert [acct.subject_spend("hospitals", a) for a in ("h0", "h2")] == [10, 10]


def test_fedcp2_close_allow_missing(ledger: Any, tmp_path: Path) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    acct = Accountant(ledger)
    acct.create_dataset("h", epsilon=1, subject_epsilon=10)
    sid = str(_json(url, "session", "open", "fedcp2-qq", "--dataset", "h", "--agents", "5",
                    "--local-n", "200", "--alpha", "0.1", "--epsilon", "10")["id"])
    plan = plan_fedcp2_qq(5, 200, 0.1, 10)
    rng = random.Random(9)
    rows = [[f"a{j}", fedcp2_qq_message(np.array([rng.random() for _ in range(200)]), plan, rng)]
            for j in range(4)]
    assert _json(url, "session", "submit", sid, "--reports",
                 _write(tmp_path / "b.csv", ["agent", "value"], rows))["accepted"] == 4
    st = _json(url, "session", "close", sid, "--allow-missing", "--missing", "replan")
    assert st["status"] == "released"
    rel = acct.release(st["release_id"])
    # 4 answering agents at q=0.91: replanned k = 4, the level pinned in the release's params
    assert rel.shape["group_sizes"] == [200] * 4 and rel.coverage.rank == 4
    assert rel.params["level"] == plan.q and rel.coverage.details["q"] == plan.q
    assert rel.diagnostics["q"] == plan.q and rel.diagnostics["replanned"]["m_answered"] == 4
    assert rel.threshold == sorted(r[1] for r in rows)[3]
    assert acct.verify().guarantees_recomputed == 1
    res = _cli(url, "session", "close", sid)
    assert res.exit_code == 1 and "already released" in res.output


def test_cli_bad_batch_file_is_one_line_error(ledger: Any, tmp_path: Path) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    Accountant(ledger).create_dataset("d", epsilon=1, subject_epsilon=2)
    sid = str(_json(url, "session", "open", "ldp-score", "--dataset", "d", "--alpha", "0.1",
                    "--epsilon", "1", "--rounds", "2", "--group-size", "5")["id"])
    head = ledger.head()
    res = _cli(url, "session", "submit", sid, "--reports",
               _write(tmp_path / "x.csv", ["who", "bit"], [["a", 1]]))
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "'subject'" in res.output
    res = _cli(url, "session", "status", "999")
    assert res.exit_code == 1 and "unknown session 999" in res.output
    res = _cli(url, "session", "open", "ldp-score", "--dataset", "nope", "--alpha", "0.1",
               "--epsilon", "1", "--rounds", "2", "--group-size", "5")
    assert res.exit_code == 1 and "unknown dataset" in res.output
    assert ledger.head() == head


@pytest.mark.parametrize(("rows", "reason"), [
    ([["u0", 1, 0], ["u1", 2, 0], ["u2", 0, 0], ["u3", "x", 0]],
     "malformed bit, and 1 more row too"),
    ([["u0", 1, 0], ["u1", 0, "r"], ["u2", 0, 0]],
     "malformed round (the session's rounds are 0 to 1; round 0 is open)"),
    # the first bad row, whether its value or its round is (red team 14: a later bad bit
    # was named before an earlier bad round)
    ([["u0", 1, 0], ["u1", 0, "r"], ["u2", 0, 0], ["u3", 2, 0]],
     "malformed round (the session's rounds are 0 to 1; round 0 is open), and 1 more row"),
    # text float() reads but no file means as a round (red team 22, flows F1: stored, charged)
    *(([["u0", 1, 0], ["u1", 0, r], ["u2", 0, 0]], "malformed round (the session's rounds")
      for r in ("0_0", "\uff10", "\u0660")),
])
def test_cli_batch_with_a_malformed_row_is_refused_whole(ledger: Any, tmp_path: Path,
                                                         rows: list[list[Any]],
                                                         reason: str) -> None:
    """Red team 14: one malformed bit in a file charged the other rows and exited 0. The
    CLI's file is refused whole (exit 1, one line naming the first bad report, nothing
    written or charged); the library's default still counts a device's bad report per row."""
    from privcal.accountant import sessions as S

    url = ledger.engine.url.render_as_string(hide_password=False)
    acct = Accountant(ledger)
    acct.create_dataset("d", epsilon=1, subject_epsilon=2)
    sid = str(_json(url, "session", "open", "ldp-score", "--dataset", "d", "--alpha", "0.1",
                    "--epsilon", "1", "--rounds", "2", "--group-size", "50")["id"])
    head = ledger.head()
    res = _cli(url, "session", "submit", sid, "--reports",
               _write(tmp_path / "b.csv", ["subject", "bit", "round"], rows))
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert res.output.startswith("error: report 2 of the batch (in file order) has a ")
    assert reason in res.output and "nothing was written" in res.output
    assert ledger.head() == head and acct.subject_spend("d", "u0") == 0
    assert _json(url, "session", "status", sid)["received"] == 0
    ok = S.submit_reports(acct, int(sid), [r[0] for r in rows], [r[1] for r in rows],
                          [r[2] for r in rows])
    assert ok.accepted == 2 and ok.rejected == len(rows) - 2  # per row, as a device's
