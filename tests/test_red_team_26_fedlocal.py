"""Red team 26, fedlocal.

F1: a FedCP-QQ session took +∞ as an agent's message from the CLI's file and from the
library — ``1e400`` (a finite number past the float range, read as +∞) and ``inf`` — and
stored it, where the HTTP routes refuse both (422; red team 25, fedlocal F3). A session's
plan is an equal-size one, whose order ℓ ≤ n, so no agent following it sends +∞: the
message is malformed, refused per row (a device's batch) or with the whole file (the CLI),
nothing stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privcal.accountant.sessions import open_session, session_status, submit_reports
from privcal.accountant.sessions.records import MALFORMED_VALUE


def _fedcp(acct: Any) -> Any:
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    return open_session(acct, "fedcp-qq", dataset="h", alpha=0.2, agents=3, local_n=20)


@pytest.mark.parametrize("value", [float("inf"), np.float32("inf"), "inf", "1e400", "Infinity"])
def test_f1_a_fedcp_qq_session_refuses_an_infinite_message(accountant: Any, value: Any) -> None:
    s = _fedcp(accountant)
    res = submit_reports(accountant, s.id, ["a0", "a1"], np.array([value, "0.5"], dtype=object))
    assert res.accepted == 1 and res.reasons == {MALFORMED_VALUE: 1}, res.reasons
    assert session_status(accountant, s.id).total_reports == 1
    # the same from a float32 array (the library's numeric path)
    res = submit_reports(accountant, s.id, ["a2"], np.array([np.inf], dtype=np.float32))
    assert res.accepted == 0 and res.reasons == {MALFORMED_VALUE: 1}, res.reasons
    assert session_status(accountant, s.id).status == "open"


def test_f1_a_large_finite_message_is_still_taken(accountant: Any) -> None:
    s = _fedcp(accountant)
    res = submit_reports(accountant, s.id, ["a0", "a1", "a2"], [1e300, "1.7e308", 0.5])
    assert res.accepted == 3, res.reasons
    info = session_status(accountant, s.id)
    assert info.status == "released" and float(info.threshold) == 1e300  # k = 2 of 3


@pytest.mark.parametrize("text", ["1e400", "inf", "-1e400"])
def test_f1_the_cli_refuses_a_file_with_an_infinite_message(accountant: Any, ledger_url: str,
                                                           tmp_path: Path, text: str) -> None:
    from click.testing import CliRunner

    from privcal.cli import main

    s = _fedcp(accountant)
    f = tmp_path / "b.csv"
    f.write_text(f"agent,value\na0,{text}\na1,0.5\n")
    r = CliRunner().invoke(main, ["--db-url", ledger_url, "session", "submit", str(s.id),
                                  "--reports", str(f)])
    assert r.exit_code == 1, r.output
    assert "report 1 of the batch (in file order) has a malformed value" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert session_status(accountant, s.id).total_reports == 0


@pytest.mark.parametrize(("alpha", "need"), [(1e-300, "1.00e+300"), (1e-310, "1.00e+310"),
                                             (0.1, "9")])
def test_f4_an_infeasible_plan_states_a_huge_count_in_a_few_digits(alpha: float,
                                                                   need: str) -> None:
    """F4: α = 1e-300 put a 301-digit "need m·n ≥" on the one error line, and α = 1e-310
    overflowed a float while computing it (an OverflowError instead of the plan's refusal)."""
    from privcal.calibrators.fedplan import plan_fedcp_qq
    from privcal.errors import InfeasiblePlan

    with pytest.raises(InfeasiblePlan) as err:
        plan_fedcp_qq(3, 2, alpha)
    assert str(err.value).endswith(f"need m·n ≥ {need}") and len(str(err.value)) < 200


def test_f4_the_privacy_correction_is_stated_in_a_few_digits() -> None:
    from privcal.calibrators.fedplan import plan_fedcp2_qq
    from privcal.errors import InfeasiblePlan

    with pytest.raises(InfeasiblePlan) as err:
        plan_fedcp2_qq(2, 20, 0.2, 1e-300)
    assert "ℓ_cor ≥ 1.37e+301" in str(err.value) and len(str(err.value)) < 300


def test_l2_a_session_with_more_token_agents_than_m_uses_the_first_m_invited(
        accountant: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """L2: a session whose agent tokens were minted before red team 25's cap may hold more
    than m token agents; its m slots then went to whichever answered first — ten agents for
    m = 5 arriving in the order of their messages is red team 25 F4's attack (coverage 0.865
    against a recorded 0.9). Now the slots are the first m invited (mint order, fixed before
    any data): the later-invited ones are turned away whenever they arrive."""
    import privcal.storage.agent_slots as slots
    from privcal.accountant.sessions.records import RESERVED
    from privcal.service.bound_tokens import create_bound_token

    s = _fedcp(accountant)  # m = 3
    m = int(s.plan["m"])
    with monkeypatch.context() as mp:  # minted as before the cap
        mp.setattr(slots, "check_agent_slot", lambda *a: None)
        toks = [create_bound_token(accountant, "agent", name=None, datasets=[], session=s.id,
                                   subject=None, agent=f"a{j}", expires_in=None).id
                for j in range(2 * m)]
    for j in reversed(range(2 * m)):  # the last invited arrive first (smallest messages)
        res = submit_reports(accountant, s.id, [f"a{j}"], [0.01 * (j + 1)], tokens=[toks[j]])
        assert (res.accepted, res.reasons) == ((1, {}) if j < m else (0, {RESERVED: 1}))
    info = session_status(accountant, s.id)
    assert info.status == "released" and info.total_reports == m
    rel = accountant.release(info.release_id)
    assert float(rel.threshold) == 0.01 * 2  # the k = 2nd smallest of a0, a1, a2's messages


def test_f6_a_huge_raps_k_reg_is_a_one_line_refusal(accountant: Any, ledger_url: str) -> None:
    """F6: ``--score-option k_reg=1000…0`` (401 digits) on ``session open`` (and any run with
    raps) raised an OverflowError while formatting its own refusal — a traceback, not the
    one-line error; now InvalidInput naming the value, nothing opened."""
    from click.testing import CliRunner

    from privcal.cli import main
    from privcal.errors import InvalidInput

    accountant.create_dataset("e", epsilon=5, subject_epsilon=5)
    kw = {"alpha": 0.1, "epsilon": 1, "rounds": 2, "group_size": 1000, "score": "raps"}
    with pytest.raises(InvalidInput, match=r"k_reg must be at most 2\*\*53 − 1, got 1.00e\+400"):
        open_session(accountant, "ldp-score", dataset="e", score_options={"k_reg": 10**400},
                     **kw)
    r = CliRunner().invoke(main, ["--db-url", ledger_url, "session", "open", "ldp-score",
                                  "--dataset", "e", "--alpha", "0.1", "--epsilon", "1",
                                  "--rounds", "2", "--group-size", "1000", "--score", "raps",
                                  "--score-option", "k_reg=1" + "0" * 400])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "got 1.00e+400" in r.output
    with pytest.raises(Exception, match="unknown session"):
        session_status(accountant, 1)


def test_f7_a_whole_number_past_the_float_range_is_a_one_line_refusal(
        accountant: Any, ledger_url: str, tmp_path: Path) -> None:
    """F7: ``calibrate fedcp-qq --agent-order 1000…0`` (401 digits; any integer parameter
    without an upper bound) raised an OverflowError in ``json_safe`` while formatting its
    own refusal (``{obj:.6g}`` goes through a float): a traceback, not the one-line error.
    Nothing was written then and nothing is now."""
    from click.testing import CliRunner

    from privcal.cli import main

    accountant.create_dataset("h", epsilon=1, allow_nonprivate=True)
    f = tmp_path / "s.csv"
    g = np.random.default_rng(0)
    f.write_text("score,agent\n" + "".join(f"{g.random()},{j // 20}\n" for j in range(60)))
    r = CliRunner().invoke(main, ["--db-url", ledger_url, "calibrate", "fedcp-qq", "--dataset",
                                  "h", "--alpha", "0.2", "--scores", f"{f}:score", "--agent-of",
                                  f"{f}:agent", "--agent-order", "1" + "0" * 400])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert "the whole number 1.00e+400 is past ±(2**53 − 1)" in r.output
    assert accountant.releases("h") == []


@pytest.mark.parametrize(("kw", "said"), [
    ({"method": "fedcp-qq", "alpha": 0.2, "agents": 10**400, "local_n": 20},
     "number of agents must be in [1, 10000], got 1.00e+400"),
    ({"method": "ldp-score", "alpha": 0.1, "epsilon": 1, "rounds": 2, "group_size": 10**400},
     "(rounds × group size), got 2 × 1.00e+400"),
])
def test_f4_a_session_open_states_a_huge_size_in_a_few_digits(accountant: Any, kw: Any,
                                                              said: str) -> None:
    """F4, the same on a session's sizes: 401 digits on the one error line."""
    from privcal.errors import InvalidInput

    accountant.create_dataset("h", epsilon=1, subject_epsilon=1, allow_nonprivate=True)
    kw = dict(kw)  # the parameter is shared by the SQLite and PostgreSQL runs
    method = kw.pop("method")
    with pytest.raises(InvalidInput) as err:
        open_session(accountant, method, dataset="h", **kw)
    assert said in str(err.value) and len(str(err.value)) < 200
