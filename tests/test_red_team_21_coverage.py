"""Red team 21, coverage findings."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from privcal import Accountant, Ledger
from privcal.cli import main


def test_release_list_never_prints_more_than_the_recorded_lower(tmp_path: Path) -> None:
    """F2: ``release list``'s "coverage ≥" column rounded the recorded lower bound to the
    nearest 10 significant digits — a nominal P-COQS release recording 0.8870043318893702 was
    listed "≥ 0.8870043319". Every printed bound rounds down (``at_least``, red team 19)."""
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    acct = Accountant(Ledger(url))
    acct.create_dataset("d", rho=1)
    rel = acct.calibrate("pcoqs", dataset="d", scores=np.random.default_rng(0).random(3000),
                         alpha=0.1, rho=0.1, nominal=True)
    acct.ledger.close()
    lower = rel.coverage.lower
    assert repr(lower) == "0.8870043318893702"  # a value whose nearest 10 digits round up
    res = CliRunner().invoke(main, ["--db-url", url, "release", "list"])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "pcoqs" in line)
    printed = next(tok for tok in row.replace("│", " ").split() if tok.startswith("0.887"))
    assert Fraction(printed) <= Fraction(repr(lower)), printed
    assert printed == "0.8870043318"


def _ldp_label_data(g: np.random.Generator, n: int, k: int, eps: float) -> tuple[Any, Any]:
    from privcal.calibrators.mechanisms.randomized_response import krr_many

    p = g.dirichlet(np.ones(k), n)
    y = (p.cumsum(axis=1) < g.random((n, 1))).sum(axis=1)
    return p, krr_many(y, k, eps, g)


def test_a_run_made_trivial_by_subjects_at_their_cap_charges_no_one(tmp_path: Path) -> None:
    """F1: 3 800 of 4 000 listed subjects already at their per-subject cap. The dry run (it
    sees no one's spend) previews a finite release for 4 000 rows; the run kept the other
    200, charged each ε0 = 3 and released +∞. Now the run refuses — BudgetRefused, no
    charge, no row, no audit entry — and a run the cap leaves finite still runs."""
    from privcal.accountant.calibration import dry_run
    from privcal.errors import BudgetRefused

    acct = Accountant(Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}"))
    acct.create_dataset("d", rho=1, subject_epsilon=3)
    g, k, eps = np.random.default_rng(0), 4, 3.0
    ids = [f"u{i}" for i in range(4000)]
    p, y = _ldp_label_data(g, 3800, k, eps)
    acct.calibrate("ldp-label", dataset="d", probs=p, labels=y, epsilon=eps, alpha=0.2,
                   subjects=ids[:3800], classes=list("abcd"))  # spends u0 … u3799's cap
    p, y = _ldp_label_data(g, 4000, k, eps)
    kw: dict[str, Any] = dict(dataset="d", probs=p, labels=y, subjects=ids,
                              classes=list("abcd"))
    dr = dry_run(acct, "ldp-label", {"epsilon": eps, "alpha": 0.2}, **kw)
    assert dr.allowed and not dr.trivial and "refuses if the rest" in dr.reason
    head, charges = acct.ledger.head(), acct.budget("d").charges
    with pytest.raises(BudgetRefused, match=r"200 of the 4000 subjects .* could only release"):
        acct.calibrate("ldp-label", epsilon=eps, alpha=0.2, **kw)
    assert acct.ledger.head() == head and acct.budget("d").charges == charges
    assert acct.subject_spend("d", "u3999") == 0  # the 200 were not charged
    assert len(acct.releases("d")) == 1
    # half the listed subjects at their cap: the rest still give a finite release, which runs
    p, y = _ldp_label_data(g, 3000, k, eps)
    rel = acct.calibrate("ldp-label", epsilon=eps, alpha=0.2, dataset="d", probs=p, labels=y,
                         subjects=ids[2300:3800] + [f"v{i}" for i in range(1500)],
                         classes=list("abcd"))
    assert rel.shape["n"] == 1500 and rel.threshold < float("inf")
    acct.ledger.close()


@pytest.mark.parametrize("method, cost", [("pcoqs", {"rho": 1}), ("exponq", {"epsilon": 1})])
@pytest.mark.parametrize("score_range", [(1e308, 1.7e308), (-1e308, 1e308), (0, 1.348e308),
                                         (-1.348e308, 0)])
def test_a_range_whose_midpoint_or_width_overflows_is_refused(
        method: str, cost: dict[str, float], score_range: tuple[float, float]) -> None:
    """The service's F1, in the central searches: P-COQS bisects at (lo + hi)/2, which on
    [1e308, 1.7e308] is +∞ — it released threshold +∞ under the statement "0.9 ≤ P(Y ∈ C(X) |
    E) ≤ 0.909" (every set holds every label: coverage 1). Such a range is refused before any
    charge, as the federated methods refuse one whose width overflows."""
    from privcal.errors import InvalidInput

    acct = Accountant(Ledger("sqlite://"))
    acct.create_dataset("d", rho=10)  # a pure ε cost is charged as ε²/2 against ρ
    s = 1e308 + np.random.default_rng(0).random(20_000) * 6e307
    with pytest.raises(InvalidInput, match="overflows a float"):
        acct.calibrate(method, dataset="d", scores=s, alpha=0.1, score_range=score_range,
                       **cost)
    assert acct.budget("d").charges == 0


def test_the_widest_accepted_range_calibrates_without_overflow() -> None:
    """The review of the fixes: at ±8.99e307, the widest range now accepted, ExponQ's grid
    computed its last point as (m−1)·step past the largest float (four RuntimeWarnings,
    a FloatingPointError under np.seterr(all="raise")), though the point is then set to the
    upper end. The grid is the same, computed without it."""
    import warnings

    from privcal.calibrators.mechanisms.exponential import grid

    h = 1.7976931348623157e308 / 2
    acct = Accountant(Ledger("sqlite://"))
    acct.create_dataset("d", rho=100)
    s = np.random.default_rng(0).uniform(-1, 1, 2000) * h * 0.5
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        e = grid(-h, h, 1000)
        rel = acct.calibrate("exponq", dataset="d", scores=s, alpha=0.1, lower=-h, upper=h,
                             epsilon=2.0, bins=1000)
    assert e[0] == -h and e[-1] == h and bool(np.all(np.diff(e) > 0))
    assert -h < rel.threshold < h
    assert list(grid(0.0, 1.0, 11)) == [0.0, 0.1, 0.2, 0.30000000000000004, 0.4, 0.5,
                                        0.6000000000000001, 0.7000000000000001, 0.8, 0.9, 1.0]
