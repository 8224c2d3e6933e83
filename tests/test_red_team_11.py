"""Red team 11 (and the item red team 9 left): what a recorded guarantee says must hold for
the threshold that was released; the HTTP clients' options checked when they are made.

A several-level release raises a level's threshold to the largest of its own and every larger
α's (nested sets). Its coverage is then the largest of theirs, so its upper bound is the
largest of their upper bounds and holds only under all of their conditions — for P-COQS each
run's own noise event E₋. Levels 1.1.0 recorded each run's own upper bound and conditions.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from privcal.calibrators.base import CoverageGuarantee, DataShape
from privcal.calibrators.levels import LEVELS_VERSION, NESTED_UPPER, _nested_uppers
from privcal.calibrators.registry import get
from privcal.errors import InvalidInput
from tests.seeded import Seeded


def _g(upper: float | None, requires: str | None = "no ties") -> CoverageGuarantee:
    details: dict[str, Any] = {} if requires is None else {"upper_requires": requires}
    return CoverageGuarantee(target=0.9, lower=0.9, upper=upper, failure_probability=0.0,
                             over="calibration data and the test point", rank=None,
                             statement="s", details=details)


def test_a_nested_levels_upper_bound_is_the_largest_of_the_larger_alphas() -> None:
    """An upper bound that does not fall with α (a plugin's): the smaller α's threshold may
    be raised to the larger α's, whose upper bound is then the one that holds."""
    out = _nested_uppers([(0.1, _g(0.92)), (0.2, _g(0.95)), (0.3, _g(0.8))])
    assert [g.upper for _, g in out] == [0.95, 0.95, 0.8]
    assert [g.details["upper_requires"] for _, g in out] == [
        f"no ties; {NESTED_UPPER}", f"no ties; {NESTED_UPPER}", "no ties"]
    # a larger level without an upper bound: none for the smaller ones either
    out = _nested_uppers([(0.1, _g(0.92)), (0.2, _g(None, None)), (0.3, _g(0.8))])
    assert [g.upper for _, g in out] == [None, None, 0.8]
    assert out[0][1].details["upper_requires"] == "no ties"  # its own run's, not extended
    # a level without conditions of its own gets the larger levels'
    out = _nested_uppers([(0.1, _g(0.92, None)), (0.2, _g(0.85))])
    assert out[0][1].details["upper_requires"] == NESTED_UPPER


def test_levels_pcoqs_states_that_an_upper_bound_needs_every_larger_levels_event() -> None:
    pc = get("levels:pcoqs").calibrator
    assert pc.version == f"{LEVELS_VERSION}/{get('pcoqs').calibrator.version}"
    params = pc.Params.model_validate({"alpha": [0.05, 0.1, 0.2], "rho": 1.0})
    g = pc.guarantee(params, DataShape(n=3000))
    req = {a: g.details[f"alpha={a}: upper_requires"] for a in ("0.05", "0.1", "0.2")}
    assert req["0.05"].endswith(NESTED_UPPER) and req["0.1"].endswith(NESTED_UPPER)
    assert NESTED_UPPER not in req["0.2"] and "E₋" in req["0.2"]
    assert "holds only under all of their conditions" in g.statement
    # the numbers: each level's bound at least every larger α's (P-COQS's fall with α)
    ups = [float(g.details[f"alpha={a}: upper"]) for a in ("0.05", "0.1", "0.2")]
    singles = [get("pcoqs").calibrator.guarantee(p, DataShape(n=3000)).upper
               for _, p in params.per_level()]
    assert ups == [max(singles[i:]) for i in range(3)]
    assert g.upper == ups[0]


def test_a_one_level_release_is_stated_as_before() -> None:
    pc = get("levels:pcoqs").calibrator
    g = pc.guarantee(pc.Params.model_validate({"alpha": [0.1], "rho": 1.0}), DataShape(n=500))
    assert "conditions" not in g.statement
    assert NESTED_UPPER not in str(g.details)


def test_levels_release_records_and_verifies(accountant: Any) -> None:
    """The new wording goes through record_release's recomputation and audit verify; a
    release whose noise crossed two levels (raised threshold) is among them."""
    acct = accountant
    acct.create_dataset("d", rho=100)
    s = np.random.default_rng(3).random(1000)
    crossed = 0
    for seed in range(12):
        rel = acct.calibrate("pcoqs", dataset="d", scores=s, alpha=[0.1, 0.102], rho=1,
                             rng=Seeded(seed))
        lv = rel.diagnostics["levels"]
        crossed += lv[0]["threshold"] > lv[0]["threshold_raw"]
        assert rel.calibrator_version.startswith(f"{LEVELS_VERSION}/")
    assert crossed > 0  # the case the wording is for happened
    rep = acct.verify()
    assert rep.guarantees_recomputed == 12  # verify raises on any entry that fails


# ------------------------------------------------------------ the HTTP clients' options
@pytest.mark.parametrize("kw", [
    {"retries": -1}, {"retries": 1.5}, {"retries": True}, {"retries": "3"},
    {"timeout": -1.0}, {"timeout": 0}, {"timeout": float("nan")}, {"timeout": float("inf")},
    {"timeout": "30"}, {"max_epsilon": "2"}, {"max_epsilon": float("nan")},
    {"max_epsilon": 0}, {"max_epsilon": True},
])
@pytest.mark.parametrize("cls", ["Reporter", "Agent"])
def test_client_options_are_checked_when_the_client_is_made(cls: str, kw: dict[str, Any]
                                                            ) -> None:
    """A bad ``retries``/``timeout``/``max_epsilon`` was an AssertionError, a TypeError or
    httpx's ValueError at the first call (red team 11): now one line, nothing sent."""
    import privcal.client as client

    with pytest.raises(InvalidInput) as err:
        getattr(client, cls)("http://127.0.0.1:9", "pc_x_y", **kw)
    assert "\n" not in str(err.value) and next(iter(kw)) in str(err.value)


def test_client_options_in_range_are_taken() -> None:
    from privcal.client import Reporter

    rep = Reporter("http://127.0.0.1:9", "pc_x_y", retries=0, timeout=1, max_epsilon=2)
    assert rep.retries == 0 and rep.max_epsilon == 2.0
    rep.close()


# ------------------------------------------------------ timestamps of the audit report
def test_audit_report_times_are_utc_on_both_backends_whatever_the_session_zone(
        ledger: Any, ledger_url: str) -> None:
    """``audit report --json``'s charge and release times (and ``spend-history``'s) were
    naive on SQLite and in the reading session's zone on PostgreSQL (red team 11): now UTC
    with its offset, the same instant whoever reads."""
    from datetime import UTC, datetime, timedelta
    from urllib.parse import quote

    from privcal.accountant import Accountant
    from privcal.accountant.report import audit_report
    from privcal.costs import ZCDP
    from privcal.storage import Ledger

    acct = Accountant(ledger)
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    acct.charge("d", ZCDP(rho=0.1), purpose="p")
    acct.calibrate("split", dataset="d", scores=np.arange(20) / 20, alpha=0.1)
    urls = [ledger_url]
    if ledger_url.startswith("postgresql"):  # a reader whose session zone is not UTC
        urls.append(ledger_url + quote(" -ctimezone=Asia/Kolkata"))
    seen = []
    for url in urls:
        rep = audit_report(Accountant(Ledger(url)), "d")[0]
        (t,) = rep.timeline
        (r,) = rep.releases
        for at in (t.at, r.at):
            assert at.utcoffset() == timedelta(0), at
            assert abs(datetime.now(UTC) - at) < timedelta(minutes=5)
        assert rep.model_dump(mode="json")["timeline"][0]["at"].endswith("Z")
        seen.append((t.at, r.at))
    assert len(set(seen)) == 1


# ------------------------------------------------------------ token lifetimes (library)
@pytest.mark.parametrize("life", [
    "huge", "max", 3600, "1h", 0, -1, "zero", "negative", "eleven years"])
def test_a_token_lifetime_the_library_refuses_in_one_line_writing_nothing(
        ledger: Any, life: Any) -> None:
    """``create_token``/``create_device_tokens`` took any timedelta > 0: ten to the eighth
    days overflowed (OverflowError), 3600 or "1h" was an AttributeError, and a token
    expiring in year 9999's last hours broke every read of the tokens on PostgreSQL east of
    UTC (red team 11). The CLI's and the service's 10 years is the library's rule now."""
    from datetime import timedelta

    from privcal.accountant import Accountant
    from privcal.accountant.sessions.opening import open_session
    from privcal.storage.token_bulk import create_device_tokens
    from privcal.storage.tokens import MAX_LIFETIME, create_token, list_tokens

    life = {"huge": timedelta(days=10**8), "max": timedelta.max, "zero": timedelta(0),
            "negative": timedelta(seconds=-1),
            "eleven years": MAX_LIFETIME + timedelta(seconds=1)}.get(life, life)
    acct = Accountant(ledger)
    acct.create_dataset("d", rho=1, subject_epsilon=10)
    sid = open_session(acct, "ldp-score", dataset="d", alpha=0.2, epsilon=1, rounds=1,
                       group_size=4).id
    before = len(list_tokens(ledger))
    with pytest.raises(InvalidInput, match="lifetime") as err:
        create_token(ledger, "analyst", datasets=["d"], expires_in=life)
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidInput, match="lifetime"):
        create_device_tokens(ledger, sid, ["a", "b"], expires_in=life)
    assert len(list_tokens(ledger)) == before
    # the longest is taken
    assert create_token(ledger, "analyst", datasets=["d"], expires_in=MAX_LIFETIME).info


def test_sqlite_stores_a_reports_arrival_time_in_the_columns_own_format(tmp_path: Any
                                                                         ) -> None:
    """``session_reports.received_at`` was bound as ``isoformat`` text ("…+00:00") on
    SQLite, a second format beside SQLAlchemy's naive one in the same ledger (red team 11)."""
    import re

    from sqlalchemy import text

    from privcal.accountant import Accountant
    from privcal.accountant import sessions as S
    from privcal.storage import Ledger

    acct = Accountant(Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}"))
    acct.create_dataset("d", epsilon=10, subject_epsilon=10)
    sid = S.open_session(acct, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=2,
                         group_size=3).id
    S.submit_reports(acct, sid, ["a", "b"], [1, 0], [0, 0])  # the text path
    S.submit_reports(acct, sid, np.array(["c"]), np.array([1]), [0])
    with acct.ledger.read() as s:
        got = s.execute(text("SELECT received_at FROM session_reports")).scalars().all()
        made = s.execute(text("SELECT created_at FROM collection_sessions")).scalar_one()
    naive = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}$")
    assert naive.match(made) and len(got) == 3
    assert all(naive.match(t) for t in got), got


# --------------------------------------------------------------- advise near the crossover
def test_advise_says_when_ldp_label_may_still_give_smaller_sets() -> None:
    """Penso et al.'s Table 1 size (n = 10 832, ε = 4): advise recommended ldp-score from
    k = 17 on by the proven slacks, while ldp-label gave 6–7 % smaller sets up to k ≈ 30 —
    ldp-score's release stops anywhere in a band of width Δ_S above its target (red team 11).
    The recommendation is the slacks' (as the paper's guideline); a note says so near it."""
    from privcal.calibrators.advisor import advise

    def near(k: int) -> bool:
        return any(n.startswith("near the crossover") for n in
                   advise(10832, k, 4.0, 0.1).notes)

    a = advise(10832, 24, 4.0, 0.1)
    assert a.recommended == "ldp-score" and a.score.slack < a.label.slack <= 1.5 * a.score.slack
    assert near(18) and near(24) and near(32)
    assert not near(10) and not near(48)  # ldp-label's slack smaller; ldp-score's clearly


def test_advise_pcoqs_takes_the_searchs_resolution() -> None:
    """P-COQS's τ grows with its N = ⌈log2(range/tol)⌉ steps; the default tol 1e-10 (the
    paper's) takes 34. advise had no tol: n_min 399 at ρ = 0.1, where 2^-12 needs 209."""
    from privcal.calibrators.advisor_central import advise_central

    fine = advise_central("pcoqs", 0.1, rho=0.1)
    coarse = advise_central("pcoqs", 0.1, rho=0.1, tol=2.0**-12)
    assert (fine.details["N"], fine.details["tau"], fine.min_n) == (34, 39, 399)
    assert coarse.details["N"] == 12 and coarse.details["tol"] == 2.0**-12
    assert coarse.details["tau"] < fine.details["tau"] and coarse.min_n == 209
    assert "coarser tol" in fine.notes[0]
    with pytest.raises(InvalidInput, match="tol applies to pcoqs"):
        advise_central("exponq", 0.1, epsilon=1.0, tol=0.01)
    with pytest.raises(InvalidInput, match="tol"):
        advise_central("pcoqs", 0.1, rho=0.1, tol=0.0)


# ------------------------------------------- a running request's key and two hosts' clocks
def _shift_clock(monkeypatch: pytest.MonkeyPatch, offset: Any) -> None:
    """privcal's wall clock (``privcal.storage.audit.now``) moved by ``offset``: a host
    whose clock is ahead, an NTP step."""
    import datetime as real

    import privcal.storage.audit as audit

    class Shifted(real.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return real.datetime.now(tz) + offset

    monkeypatch.setattr(audit, "datetime", Shifted)


def test_a_host_whose_clock_is_ahead_does_not_take_over_a_running_request(
        ledger: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pending Idempotency-Key record was taken over when the retrying process's wall
    clock, minus the ``created_at`` the running process's clock wrote, passed five minutes:
    a retry reaching a second host 6 min ahead ran a non-private calibration a second time
    (two releases for one key; red team 11). On PostgreSQL — the ledger several hosts share —
    the record's times are the database server's; SQLite has one host, one clock."""
    from datetime import timedelta

    from sqlalchemy import text

    from privcal.storage import tokens
    from privcal.storage.reservation_leases import touch_pending

    assert tokens.reserve_idempotent(ledger, "p", "k", "POST /x", "f").state == "new"
    _shift_clock(monkeypatch, timedelta(minutes=6))
    got = tokens.reserve_idempotent(ledger, "p", "k", "POST /x", "f").state
    touch_pending(ledger, [("p", "k")])  # the running request's lease, from the host ahead
    with ledger.read() as s:
        stamp = s.execute(text("SELECT created_at FROM idempotency_records")).scalar_one()
    if ledger.backend == "postgresql":
        assert got == "pending"
        from datetime import UTC, datetime
        assert abs(datetime.now(UTC) - stamp) < timedelta(minutes=1)  # the server's clock
    else:
        assert got == "new"  # one host: its clock stepped, the record looked stale
    # a request that did die is still taken over once its five minutes are up
    monkeypatch.setattr(tokens, "PENDING_TTL", timedelta(0))
    assert tokens.reserve_idempotent(ledger, "p", "k", "POST /x", "f").state == "new"


# ------------------------------------------------- review of the fixes (r11rev, helper 116)
def test_the_memo_shares_answers_between_tokens_of_one_server_only(tmp_path: Any) -> None:
    """A memo shared by two studies (two servers, each with a session 1 and a subject
    "alice"): a token of B was handed A's records — A's pending bit sent to B, or B told
    "accepted" without sending (r11rev). Records are shared only under the same server."""
    from privcal.client.memo import Memo, token_key

    path = tmp_path / "memo.json"
    bind = {"session": 1, "subject": "alice"}
    rec = {"report_id": "r1", "round": 0, "rounds": 1, "value": 1, "status": "pending",
           "reason": None}
    Memo(path, server="https://a.example").put(token_key("device", "tA"), bind, "r1", rec)
    assert Memo(path, server="https://b.example").reports(token_key("device", "tB"), bind) == {}
    same = Memo(path, server="https://a.example").reports(token_key("device", "tA2"), bind)
    assert same == {"r1": rec}
    # another role, another binding, or no server known: nothing shared
    assert Memo(path, server="https://a.example").reports(token_key("agent", "tA3"), bind) == {}
    assert Memo(path, server="https://a.example").reports(
        token_key("device", "tA4"), {"session": 1, "subject": "bob"}) == {}
    assert Memo(path).reports(token_key("device", "tA5"), bind) == {}
    # the token's own records still check the binding (the server's answer changed)
    from privcal.errors import PlanRejected

    with pytest.raises(PlanRejected, match="changed"):
        Memo(path, server="https://a.example").reports(
            token_key("device", "tA"), {"session": 2, "subject": "alice"})


@pytest.mark.parametrize("kw", [
    {"retries": np.int64(2)}, {"timeout": np.float32(5)}, {"timeout": Decimal("5")},
    {"max_epsilon": np.float64(2)}, {"max_epsilon": Decimal("2")},
])
def test_client_options_as_numpy_numbers_or_decimals_are_taken(kw: dict[str, Any]) -> None:
    from privcal.client import Reporter

    Reporter("http://127.0.0.1:9", "pc_x_y", **kw).close()


def test_client_options_refuse_a_numpy_bool_and_a_signalling_nan() -> None:
    from privcal.client import Reporter

    for kw in ({"max_epsilon": np.bool_(True)}, {"timeout": Decimal("sNaN")},
               {"max_epsilon": Decimal("NaN")}):
        with pytest.raises(InvalidInput):
            Reporter("http://127.0.0.1:9", "pc_x_y", **kw)


@pytest.mark.parametrize("name", ["binary_rr_many", "krr_many"])
def test_the_device_randomizers_refuse_masked_entries(name: str) -> None:
    import privcal.client as client

    data = np.ma.masked_array([0, 1, 1, 0], mask=[False, True, False, False])
    args = (data, 2.0) if name == "binary_rr_many" else (data, 3, 2.0)
    with pytest.raises(InvalidInput, match="1 of 4 entries are masked"):
        getattr(client, name)(*args, np.random.default_rng(0))


def test_levels_pcoqs_nested_coverage_stays_within_its_recorded_bounds_on_seeded_trials(
        ) -> None:
    """Statistical check of the levels 1.2.0 claim: U(0, 1) scores (a threshold t covers a
    fresh score with probability t, exactly), two close levels whose noisy thresholds cross in
    about a quarter of the runs (the level-0.1 threshold then raised to the 0.102 one's).
    Over 300 seeded calibrations the mean coverage of each level's released (nested)
    threshold lies within its recorded [lower, upper] up to 3 standard errors — the bounds
    are marginal over the data and the test point given the noise events, which hold with
    probability ≥ 1 − Σβ (β = 0.05 each here: far smaller than the margin tested)."""
    from privcal.calibrators.base import CalibrationInput

    cal = get("levels:pcoqs").calibrator
    params = cal.Params.model_validate({"alpha": [0.1, 0.102], "rho": 1.0})
    g = cal.guarantee(params, DataShape(n=1000))
    bounds = [(float(g.details[f"alpha={a}: lower"]), float(g.details[f"alpha={a}: upper"]))
              for a in ("0.1", "0.102")]
    cov = np.empty((300, 2))
    crossed = 0
    for seed in range(300):
        s = np.random.default_rng(seed).random(1000)
        lv = cal.calibrate(CalibrationInput(scores=s), params,
                           random.Random(seed)).diagnostics["levels"]
        cov[seed] = [min(1.0, lv[0]["threshold"]), min(1.0, lv[1]["threshold"])]
        crossed += lv[0]["threshold"] > lv[0]["threshold_raw"]
    assert crossed >= 30  # the raised thresholds are among the trials
    for i, (lo, up) in enumerate(bounds):
        mean, se = cov[:, i].mean(), cov[:, i].std(ddof=1) / np.sqrt(300)
        assert lo - 3 * se <= mean <= up + 3 * se, (i, lo, mean, up, se)
