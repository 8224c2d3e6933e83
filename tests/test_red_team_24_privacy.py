"""Red team 24, privacy: the accountant's printed figures."""

from __future__ import annotations

from privcal.costs import ApproxDP


def test_budget_summary_spells_amounts_without_exponents(accountant) -> None:
    """F2: the one-line budget summary (``privcal calibrate``'s "budget left", quickstart)
    printed a δ of 1e-7 as ``1E-7`` (str of a Decimal) where every other output says
    0.0000001."""
    accountant.create_dataset("d", approx_epsilon=5, approx_delta="0.00001",
                              delta="0.0000001")
    accountant.charge("d", ApproxDP("0.25", "0.0000001"))
    s = accountant.budget("d").summary
    assert "E-" not in s and "E+" not in s, s
    assert "spent epsilon=0.25, delta=0.0000001" in s
    assert "remaining epsilon=4.75, delta=0.0000099" in s
    assert "ε=0.25, δ=0.0000001 [" in s


# ---- independent checks of the privacy arithmetic (red team 24): the truth computed here in
# 60-digit decimals from the definitions, never with privcal's helpers

def _exact_shuffled_rr_delta(eps0: str, n: int, eps: float):
    """The exact worst-case hockey-stick divergence D_{e^ε} of the count of 1-reports of n
    shuffled binary-RR(ε0) reports, victim bit 0 vs 1, over every bit vector of the others
    (the count is sufficient: a shuffled multiset of bits is its count)."""
    from decimal import Decimal, localcontext
    from math import comb

    with localcontext() as ctx:
        ctx.prec = 60
        e = Decimal(eps0).exp()
        p, q = e / (1 + e), 1 / (1 + e)
        big = Decimal(repr(eps)).exp()
        worst = Decimal(0)
        for j in range(n):  # j of the others hold bit 1
            a = [comb(j, i) * p**i * q ** (j - i) for i in range(j + 1)]
            b = [comb(n - 1 - j, i) * q**i * p ** (n - 1 - j - i) for i in range(n - j)]
            y = [Decimal(0)] * n
            for i, ai in enumerate(a):
                for m, bm in enumerate(b):
                    y[i + m] += ai * bm
            y0, y1 = [*y, Decimal(0)], [Decimal(0), *y]
            P = [q * u + p * v for u, v in zip(y0, y1, strict=True)]  # victim's bit 0
            Q = [p * u + q * v for u, v in zip(y0, y1, strict=True)]  # victim's bit 1
            for x, z in ((P, Q), (Q, P)):
                worst = max(worst, sum((max(Decimal(0), u - big * v) for u, v in
                                        zip(x, z, strict=True)), Decimal(0)))
        return worst


def test_amplified_eps_holds_against_exact_worst_case_small_n() -> None:
    """The certified (ε, δ) of n shuffled binary-RR reports is never beaten by the exact
    worst-case dataset (the stronger-clone bound is within ~1 % of it here, so a sloppier
    certificate would show)."""
    from decimal import Decimal

    from privcal.accountant.privacy.shuffle import amplify

    checked = 0
    for n in (2, 5, 12):
        for eps0 in ("0.5", "2", "8"):
            for delta in (0.3, 1e-2, 1e-6):
                r = amplify(float(eps0), n, delta, "binary-rr")
                if not r.amplified:
                    continue
                checked += 1
                assert _exact_shuffled_rr_delta(eps0, n, r.eps) <= Decimal(repr(delta)), (
                    n, eps0, delta, r.eps, r.bound)
    assert checked >= 15


def test_cks20_and_renyi_filter_are_upper_bounds_in_exact_arithmetic() -> None:
    """CKS20 as reported, and the (ε, δ) filter's g(R), are at least the exact objective
    (60 digits, at the decimal ρ and δ) at the order privcal used / over its float grid."""
    import random
    from decimal import Decimal, localcontext

    from privcal.accountant.privacy.conversions import cks20_epsilon, cks20_order, round_up
    from privcal.accountant.privacy.filters import (
        DEFAULT_RENYI_ORDERS,
        renyi_filter_epsilon,
        renyi_orders,
    )

    def objective(a: Decimal, rho: Decimal, delta: Decimal) -> Decimal:
        return a * rho + ((1 / delta).ln() + (a - 1) * (1 - 1 / a).ln() - a.ln()) / (a - 1)

    gen = random.Random(24)
    grids = [DEFAULT_RENYI_ORDERS, renyi_orders("1.000000000001"), renyi_orders("1000000"),
             renyi_orders("1.5,2,1000000,1.000001")]
    with localcontext() as ctx:
        ctx.prec = 60
        for _ in range(400):
            rho = Decimal(repr(10 ** gen.uniform(-12, 14))).quantize(Decimal("1e-12"))
            delta = Decimal(repr(10 ** gen.uniform(-12, -1e-9))).quantize(Decimal("1e-12"))
            rho, delta = rho or Decimal("1e-12"), delta or Decimal("1e-12")
            a = Decimal(cks20_order(float(rho), float(delta)))
            reported = round_up(cks20_epsilon(float(rho), float(delta)))
            assert reported >= objective(a, rho, delta), (rho, delta)
            grid = gen.choice(grids)
            each = delta / 2 / len(grid)
            exact = min(objective(Decimal(float(o)), rho, each) for o in grid)
            assert renyi_filter_epsilon(rho, delta, grid) >= max(exact, Decimal(0)), (rho, delta)


def test_amplify_at_a_subnormal_delta_answers_eps0() -> None:
    """F3: δ = 5e-324 (or any δ whose τ = 1e-4·δ underflows to 0) was a one-line error
    naming ZeroDivisionError, while δ = 1e-300 answered "no amplification: ε = ε0" — the
    true answer for both (no bound can be certified below ~4e-13)."""
    from privcal.accountant.privacy.shuffle import BOUND_NONE, amplify

    for delta in (5e-324, 1e-321, 1e-300, 1e-14):
        r = amplify(1.0, 1000, delta, "krr", 3)
        assert (r.eps, r.amplified, r.bound, r.delta_at_eps) == (1.0, False, BOUND_NONE, 0.0)
        assert all(row.eps is None for row in r.bounds)


def test_amplify_at_an_eps0_below_float_resolution_answers_eps0() -> None:
    """F4: ε0 = 1e-17 (e^ε0 == 1.0 in floats) was a one-line error naming "ValueError: Pair
    needs pa > qa" — a shuffled ldp-score at that ε0 was refused for it — while ε0 itself,
    ε0-LDP reports being ε0-DP whatever the shuffler does, is a valid answer."""
    from privcal.accountant.privacy.shuffle import BOUND_NONE, amplify

    for randomizer, k in (("generic", None), ("binary-rr", None), ("krr", 3)):
        r = amplify(1e-17, 10_000, 1e-6, randomizer, k)
        assert (r.eps, r.amplified, r.bound, r.delta_at_eps) == (1e-17, False, BOUND_NONE, 0.0)
