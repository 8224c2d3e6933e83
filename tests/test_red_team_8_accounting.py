"""Red team 8 (mutation audit m2): accountant code that no test pinned down.

Each test kills a mutant of the accountant that the suite let through, most of them an
overspend or a false guarantee. Reference numbers are derived here, at high precision with
:mod:`decimal` (the CKS20 infimum over a continuous order, the Rényi filter's f_a), never by
calling the function under test:

- A01: the optimistic charge (PostgreSQL) checks the cost against its snapshot in Python —
  under an (ε, δ) cap its SQL statement is only a compare-and-set, so that check is the cap;
- A03: a shuffled session's central charge (``charge_in_session``) is checked against the cap;
- V07 / V08: ``audit verify`` compares every spent-total column and ``charge_count``;
- V01 / V03 / V06 / V13: an edited ``prev_hash``, a payload whose seq is not its row's, an
  edited head hash, an entry logged twice (each with the chain rehashed) fail ``verify``;
- K03: basic composition of (ε, δ) costs sums δ;
- G05: the realized-spend candidates are the exact CKS20 figures, rounded up;
- C06 / C07: CKS20 at a subnormal decimal δ is never below the exact figure; CKS20 to 6 digits;
- F11: the Rényi filter's g(R) is never below its exact value;
- F19: an (ε, δ) guarantee is not established once Σδ is past the cap's δ.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import ROUND_CEILING, Context, Decimal, localcontext
from typing import Any

import pytest
from sqlalchemy import text

from privcal.accountant import privacy as acc
from privcal.costs import ZCDP, ApproxDP, PureDP
from privcal.errors import AuditFailed, BudgetRefused
from privcal.storage import audit

_HI = Context(prec=60)


# ------------------------------------------------------------------ exact references
def _ceil6(x: Decimal) -> Decimal:
    """``x`` rounded up to 6 significant digits (what a reported ε must be)."""
    return x.quantize(Decimal(1).scaleb(x.adjusted() - 5), rounding=ROUND_CEILING)


def _cks20_objective(a: Decimal, rho: Decimal, lid: Decimal) -> Decimal:
    """CKS20 Prop. 12 at order a: aρ + (ln(1/δ) + (a−1)·ln(1−1/a) − ln a)/(a−1), exactly-ish."""
    am1 = a - 1
    return a * rho + (lid + am1 * (1 - 1 / a).ln() - a.ln()) / am1


def _minimise(f: Callable[[Decimal], Decimal], lo: Decimal, hi: Decimal) -> Decimal:
    """min of ``f`` on [lo, hi]: a grid of 400 points, then golden sections around the best."""
    step = (hi - lo) / 400
    best = min((lo + step * i for i in range(401)), key=f)
    lo, hi = best - step, best + step
    inv_phi = (Decimal(5).sqrt() - 1) / 2
    for _ in range(160):  # width 2·step·0.618^160 < 1e-33
        c, d = hi - inv_phi * (hi - lo), lo + inv_phi * (hi - lo)
        if f(c) <= f(d):
            hi = d
        else:
            lo = c
    return f((lo + hi) / 2)


def _cks20_exact(rho: str, delta: str) -> Decimal:
    """inf_{a>1} of the CKS20 objective at the *decimal* ρ and δ (60 digits; over x = ln(a−1),
    the minimiser's error only raises the figure, by < 1e-30 here)."""
    with localcontext(_HI):
        r, lid = Decimal(rho), -Decimal(delta).ln()
        return _minimise(lambda x: _cks20_objective(1 + x.exp(), r, lid),
                         Decimal(-30), Decimal(30))


def _assert_not_near_a_boundary(x: Decimal) -> None:
    """The float slack of the code (≈1e-12 relative) cannot legitimately move ``x`` past a
    6-digit boundary: only then is ``_ceil6(x)`` the one right answer."""
    assert _ceil6(x * (1 + Decimal("1e-9"))) == _ceil6(x) > x


# ------------------------------------------------------------------ ledger helpers
def _state(ledger: Any) -> tuple[Any, ...]:
    """Every row count a charge or a session writes, the totals and the audit head."""
    with ledger.engine.connect() as conn:
        counts = tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                       for t in ("charges", "audit_log", "audit_queue", "collection_sessions"))
        totals = [tuple(r) for r in conn.execute(text(
            "SELECT name, spent_pure_eps, spent_pure_rho, spent_zcdp_rho, spent_approx_eps, "
            "spent_approx_delta, charge_count FROM datasets ORDER BY id"))]
    return counts, totals, str(ledger.head())


def _sql(ledger: Any, stmt: str, **params: Any) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(text(stmt), params)


# ------------------------------------------------------------------ A01 (PostgreSQL)
def test_optimistic_charge_checks_an_approx_cap(accountant: Any) -> None:
    """A01: (0.5, 0) twice fill a (1, 1e-6) cap; (0.9, 0) — and a zCDP cost whose g(R) is past
    the cap on another dataset — are refused, writing nothing. On PostgreSQL the later
    charges take the optimistic path, whose SQL only compares-and-sets (ε, δ) totals; on
    SQLite (no optimistic path) the same refusals by the locked charge."""
    accountant.create_dataset("ad", approx_epsilon=1, approx_delta="1e-6")
    accountant.create_dataset("az", approx_epsilon=1, approx_delta="1e-6")
    for _ in range(2):
        accountant.charge("ad", ApproxDP("0.5", 0))
    accountant.charge("az", ZCDP("0.001"))
    if accountant.ledger.backend == "postgresql":  # the optimistic path runs
        assert accountant.ledger.charge_snapshot("ad") is not None
        assert accountant.ledger.charge_snapshot("az") is not None
    before = _state(accountant.ledger)
    with pytest.raises(BudgetRefused, match="exceed the cap"):
        accountant.charge("ad", ApproxDP("0.9", 0))
    with pytest.raises(BudgetRefused, match="exceed the cap"):
        accountant.charge("az", ZCDP("0.5"))  # g(0.5) > 6 at δ' = 1e-6/26
    assert _state(accountant.ledger) == before
    assert accountant.budget("ad").spent == {"epsilon": Decimal(1), "delta": Decimal(0)}
    accountant.ledger.verify()


# ------------------------------------------------------------------ A03
def test_a_shuffled_session_s_charge_is_checked_against_the_cap(accountant: Any) -> None:
    """A03, through ``open_session``: the amplified cost of this shuffled ldp-score session
    (ε ≈ 0.18, δ = 1e-5) does not fit an (ε, δ) cap of (0.1, 1e-5): refused, no session, no
    charge, no audit entry."""
    from privcal.accountant.sessions import open_session

    accountant.create_dataset("a", approx_epsilon="0.1", approx_delta="1e-5",
                              subject_epsilon=10)
    before = _state(accountant.ledger)
    with pytest.raises(BudgetRefused, match="exceed the cap"):
        open_session(accountant, "ldp-score", dataset="a", alpha=0.2, epsilon=1.0, rounds=2,
                     group_size=500, shuffled=True)
    assert _state(accountant.ledger) == before
    accountant.ledger.verify()


def test_charge_in_session_refuses_past_the_cap(accountant: Any) -> None:
    """A03, called directly: (0.9, 5e-7) twice on a (1, 1e-6) cap — Σε = 1.8 — the second is
    refused and its transaction writes nothing."""
    from privcal.accountant.charges import charge_in_session

    led = accountant.ledger
    accountant.create_dataset("ad", approx_epsilon=1, approx_delta="1e-6")

    def open_charge(s: Any) -> Any:
        return charge_in_session(led, s, led.lock_dataset(s, "ad"), ApproxDP("0.9", "5e-7"),
                                 "open", None, None)

    led.write(open_charge)
    before = _state(led)
    with pytest.raises(BudgetRefused, match="exceed the cap"):
        led.write(open_charge)
    assert _state(led) == before
    led.verify()


# ------------------------------------------------------------------ V07 / V08
_EDITS = {  # column → (dataset, SQL expression of an edited value)
    "spent_pure_eps": ("z", "'0.05'"),
    "spent_pure_rho": ("z", "'0.001'"),
    "spent_zcdp_rho": ("z", "'0.05'"),
    "spent_approx_eps": ("a", "'0.05'"),
    "spent_approx_delta": ("a", "'0'"),  # re-opens 1e-7 of δ
    "charge_count": ("a", "charge_count - 1"),
}


@pytest.mark.parametrize("column", sorted(_EDITS))
def test_an_edited_spent_total_fails_verify(accountant: Any, column: str) -> None:
    """V07 / V08: each stored total (and the charge count) must equal its logged charges."""
    accountant.create_dataset("z", rho=1)
    accountant.create_dataset("a", approx_epsilon=1, approx_delta="1e-6")
    accountant.charge("z", PureDP("0.1"))
    accountant.charge("z", ZCDP("0.1"))
    accountant.charge("a", ApproxDP("0.1", "1e-7"))
    led = accountant.ledger
    assert led.verify().charges == 3
    name, value = _EDITS[column]
    _sql(led, f"UPDATE datasets SET {column} = {value} WHERE name = :n", n=name)
    ds_id = 1 if name == "z" else 2
    with pytest.raises(AuditFailed, match=rf"dataset {ds_id} \('{name}'\): spent totals do not "
                                          "equal the sum of its logged charges"):
        led.verify()


# ------------------------------------------------------------------ V01 / V03 / V06 / V13
def _rechain(led: Any, payloads: dict[int, str], append: tuple[str, str] | None = None) -> None:
    """Rewrite the log as a careful attacker would: the given payloads (by seq), an appended
    (kind, payload) entry, every hash after them recomputed and the head row moved along."""
    with led.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(text(
            "SELECT seq, kind, payload FROM audit_log ORDER BY seq"))]
    prev = "0" * 64
    with led.engine.begin() as conn:
        for seq, _kind, payload in rows:
            payload = payloads.get(seq, payload)
            h = audit.chain_hash(prev, payload)
            conn.execute(text("UPDATE audit_log SET payload = :p, prev_hash = :v, "
                              "entry_hash = :h WHERE seq = :s"),
                         {"p": payload, "v": prev, "h": h, "s": seq})
            prev = h
        last = rows[-1][0]
        if append is not None:
            last += 1
            h = audit.chain_hash(prev, append[1])
            conn.execute(text("INSERT INTO audit_log (seq, kind, payload, prev_hash, entry_hash)"
                              " VALUES (:s, :k, :p, :v, :h)"),
                         {"s": last, "k": append[0], "p": append[1], "v": prev, "h": h})
            prev = h
        conn.execute(text("UPDATE audit_head SET seq = :s, entry_hash = :h"),
                     {"s": last, "h": prev})


def _charge_payload(led: Any) -> tuple[int, str]:
    with led.engine.connect() as conn:
        seq, payload = conn.execute(text("SELECT seq, payload FROM audit_log "
                                         "WHERE kind = 'charge' ORDER BY seq")).first()
    return int(seq), payload


def _two_charges(accountant: Any) -> Any:
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP("0.1"))
    accountant.charge("d", ZCDP("0.2"))
    assert accountant.ledger.verify().entries == 3
    return accountant.ledger


def test_an_edited_prev_hash_fails_verify(accountant: Any) -> None:
    """V01: the stored prev_hash of entry 2 is not entry 1's hash."""
    led = _two_charges(accountant)
    _sql(led, "UPDATE audit_log SET prev_hash = :h WHERE seq = 2", h="f" * 64)
    with pytest.raises(AuditFailed, match=r"audit entry 2: prev_hash does not link to entry 1"):
        led.verify()


def test_a_payload_seq_other_than_its_row_s_fails_verify(accountant: Any) -> None:
    """V03: entry 2's payload says seq 9, every hash recomputed (no hash check can see it)."""
    led = _two_charges(accountant)
    seq, payload = _charge_payload(led)
    doc = json.loads(payload)
    _rechain(led, {seq: audit.canonical({**doc, "seq": 9})})
    with pytest.raises(AuditFailed, match=rf"audit entry {seq}: payload records seq 9"):
        led.verify()


def test_an_edited_head_hash_fails_verify(accountant: Any) -> None:
    """V06: the head row's hash is not the last entry's."""
    led = _two_charges(accountant)
    _sql(led, "UPDATE audit_head SET entry_hash = :h", h="f" * 64)
    with pytest.raises(AuditFailed, match=r"audit_head row's hash differs from entry 3's"):
        led.verify()


def test_a_charge_logged_twice_fails_verify(accountant: Any) -> None:
    """V13: charge 1's entry appended again as entry 4 (chain and head rehashed)."""
    led = _two_charges(accountant)
    _, payload = _charge_payload(led)
    doc = json.loads(payload)
    _rechain(led, {}, append=("charge", audit.canonical({**doc, "seq": 4})))
    with pytest.raises(AuditFailed, match=r"audit entry 4: charge \d+ is logged twice"):
        led.verify()


# ------------------------------------------------------------------ K03
def test_approx_costs_add_their_deltas() -> None:
    """K03: basic composition of (ε_i, δ_i) steps is (Σε_i, Σδ_i), never δ = max δ_i."""
    two = ApproxDP(1, 1e-6) + ApproxDP(1, 1e-6)
    assert (two.eps, two.delta) == (Decimal(2), Decimal("2e-6"))
    three = sum([ApproxDP("0.5", "1e-6")] * 3)
    assert isinstance(three, ApproxDP)
    assert (three.eps, three.delta) == (Decimal("1.5"), Decimal("3e-6"))


# ------------------------------------------------------------------ G05
def test_realized_spend_candidates_are_the_exact_figures() -> None:
    """G05: pure ε 0.01 + zCDP ρ 1 on a zCDP cap, reported at δ 1e-6: each candidate is its
    exact figure rounded up — 0.01 + CKS20(1) and CKS20(1 + 0.01²/2)."""
    pol = acc.Policy("zcdp", rho=Decimal(5))
    spent = acc.Spent().add(PureDP(eps="0.01")).add(ZCDP(rho=1))
    s = acc.spent_epsilon(pol, spent, Decimal("1e-6"))
    split = Decimal("0.01") + _cks20_exact("1", "1e-6")
    total = _cks20_exact("1.00005", "1e-6")
    for x in (split, total):
        _assert_not_near_a_boundary(x)
    assert {k: Decimal(v) for k, v in s.candidates.items()} == {
        "basic composition of pure ε + CKS20 of zCDP ρ": _ceil6(split),
        "CKS20 of total ρ (pure ε counted as ε²/2)": _ceil6(total),
    }
    assert (s.epsilon, s.delta) == (min(_ceil6(split), _ceil6(total)), Decimal("1e-6"))


# ------------------------------------------------------------------ C06 / C07
@pytest.mark.parametrize(("rho", "delta"), [("1", "8e-324"), ("10", "8e-324"),
                                            ("0.5", "1.3e-323"), ("1", "2.3e-322")])
def test_cks20_at_a_subnormal_delta_is_never_below_the_exact_figure(rho: str,
                                                                    delta: str) -> None:
    """C06: float(δ) of a subnormal decimal δ is rounded (8e-324 → 9.9e-324, up): the reported
    ε must still be ≥ the exact CKS20 ε at the decimal δ (55.39… for ρ = 1, δ = 8e-324)."""
    exact = _cks20_exact(rho, delta)
    assert ZCDP(rho).to_approx(delta).eps >= exact
    if (rho, delta) == ("1", "8e-324"):
        assert exact > Decimal("55.3925")


@pytest.mark.parametrize(("rho", "delta"), [("0.01", "1e-9"), ("0.1", "1e-5"), ("1", "1e-6")])
def test_cks20_to_six_digits(rho: str, delta: str) -> None:
    """C07: the order search finds the infimum well enough that 6 digits rounded up are the
    exact figure's (a search to 1e-2 in ln(a − 1) reports more)."""
    exact = _cks20_exact(rho, delta)
    _assert_not_near_a_boundary(exact)
    assert acc.round_up(acc.cks20_epsilon(float(rho), float(delta))) == _ceil6(exact)


# ------------------------------------------------------------------ F11
def _g_exact(rho: Decimal, cap_delta: Decimal, a: Decimal) -> Decimal:
    """f_a(R, D/2) of a one-order grid: aR + (ln(2/D) − ln a + (a−1)·ln(1 − 1/a))/(a − 1)."""
    with localcontext(_HI):
        return _cks20_objective(a, rho, (2 / cap_delta).ln())


def test_renyi_filter_epsilon_is_never_below_its_exact_value() -> None:
    """F11: g(R) is rounded up from a float with an allowance for its error. With R chosen so
    that the exact g(R) lies 1e-25 above a 6-digit boundary, a float computed on or just below
    that boundary must still be reported one unit above it (a few such R, since which side
    the float lands on is luck)."""
    a, cap = Decimal(2), Decimal("1e-6")
    below = 0
    for k in range(40):
        target = Decimal("13.5") + Decimal(k) / 10**6  # a 6-digit boundary
        with localcontext(_HI):
            rest = _g_exact(Decimal(0), cap, a)  # the part that does not scale with R
            rho = (target - rest + Decimal("1e-25")) / a
        exact = _g_exact(rho, cap, a)
        assert target < exact < target + Decimal("1e-20")
        got = acc.renyi_filter_epsilon(rho, cap, (a,))
        assert got >= exact, (rho, got, exact)
        below += Decimal(acc.renyi_filter_term(float(rho), float(cap / 2), (a,))) <= target
    assert below > 0  # the case that needs the allowance did occur


# ------------------------------------------------------------------ F19
def test_approx_guarantee_needs_delta_within_the_cap() -> None:
    """F19: Σδ = 2e-6 past a (1, 1e-6) cap (ε well within): the cap's guarantee does not hold."""
    pol = acc.Policy("approx", epsilon=Decimal(1), delta=Decimal("1e-6"))
    over = acc.Spent().add(ApproxDP("0.1", "0.000002"))
    assert not acc.within_cap(pol, over)
    assert not acc.filter_guarantee(pol, Decimal("1e-6"), spent=over).established
    fits = acc.Spent().add(ApproxDP("0.1", "0.000001"))
    assert acc.within_cap(pol, fits)
    assert acc.filter_guarantee(pol, Decimal("1e-6"), spent=fits).established
