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
