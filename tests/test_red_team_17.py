"""Red team 17 (a newcomer reading the documentation against what privcal does).

- ``evaluate`` weighed a P-COQS release's shortfall by Markov's inequality alone: 0 % coverage
  on 2 000 held-out points against a recorded 0.9 was "probability at most 0.15 under it …:
  weak evidence". On the event E of its noise (P(E) ≥ 1−β) a P-COQS threshold has at least
  r' − τ calibration scores at or below it (seed 003, Thm 2's lower bound; SPEC §4), so one
  release that low has probability at most β + Beta-cdf(u; r'−τ, n+1−r'+τ), and a test
  result that low β + the beta-binomial tail (red team 19) — here ≈ β.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from scipy.stats import beta, betabinom

from tests.cli_env import CliEnv


def _ev(m: int, covered: int, lower: float) -> Any:
    """An evaluation of ``covered`` of ``m`` test points against a marginal ``lower``."""
    from privcal.calibrators.evaluation import coverage_check

    return SimpleNamespace(n=m, **coverage_check(covered, m, lower, True))


def _pcoqs(rank: int, tau: int, n: int, failure: float = 0.05) -> Any:
    return SimpleNamespace(method="pcoqs", shape={"n": n}, coverage=SimpleNamespace(
        rank=rank, failure_probability=failure, details={"tau": tau}))


def test_a_pcoqs_shortfall_is_weighed_by_its_order_statistic() -> None:
    from privcal.cli.output import at_most
    from privcal.cli.render import guarantee_verdict

    # far below: β + a beta-binomial tail of ~0, not Markov's (1 − 0.855)/(1 − 0.0015) ≈ 0.145
    text = guarantee_verdict(_ev(2000, 3, 0.9), 0.05, _pcoqs(1818, 17, 2000))
    assert "probability at most 0.05 " in text and "Beta(1801, 200)" in text
    assert "weak evidence against it" in text  # β = 0.05 > 0.01: E may have failed
    # with a small β the same shortfall is strong evidence
    text = guarantee_verdict(_ev(2000, 3, 0.9), 0.001, _pcoqs(1818, 17, 2000, 0.001))
    assert text.endswith("strong evidence against it: check the inputs (column order, "
                         "score, the data's distribution)")
    # a mild shortfall: the tail is used only where it is smaller than Markov's bound (at
    # least (1 − (1−β)·L)/(1 − k/m), whatever v it is taken at)
    mild = _ev(2000, 1740, 0.9)
    assert not mild.consistent_with_guarantee
    want = 0.05 + betabinom.cdf(1740, 2000, 1801, 200)
    markov = (1 - 0.95 * 0.9) / (1 - 1740 / 2000)
    assert want < markov
    assert f"probability at most {at_most(want, '.2g')} " in guarantee_verdict(
        mild, 0.05, _pcoqs(1818, 17, 2000))  # rounded up: an upper bound (red team 19)
    # a rank the noise may push below 1 (r' ≤ τ): no order statistic, Markov's inequality
    assert "Markov's inequality" in guarantee_verdict(_ev(1000, 500, 0.9), 0.05,
                                                      _pcoqs(10, 17, 30))


def test_evaluate_of_a_broken_pipeline_on_a_pcoqs_release(tmp_path: Path) -> None:
    """End to end: labels that are every row's least likely class (a broken pipeline)."""
    env = CliEnv(f"sqlite:///{tmp_path}/l.sqlite", tmp_path)
    rng = np.random.default_rng(17)
    n, k = 2000, 4
    probs = rng.dirichlet(np.ones(k) * 0.5, size=2 * n)
    labels = np.array([rng.choice(k, p=p) for p in probs])
    np.save(tmp_path / "p.npy", probs[:n])
    np.save(tmp_path / "y.npy", labels[:n])
    np.save(tmp_path / "tp.npy", probs[n:])
    np.save(tmp_path / "bad.npy", probs[n:].argmin(axis=1))
    np.save(tmp_path / "ty.npy", labels[n:])
    assert env.run("dataset", "create", "--dataset", "d", "--rho", "1").exit_code == 0
    rel = env.json("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.5",
                   "--failure-probability", "0.001", "--probs", env.f("p.npy"),
                   "--labels", env.f("y.npy"), "--score", "lac")["release"]
    res = env.run("evaluate", "--release", str(rel["id"]), "--probs", env.f("tp.npy"),
                  "--labels", env.f("bad.npy"))
    assert res.exit_code == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.strip().startswith("guarantee"))
    assert "P-COQS: outside an event of probability ≤ 0.001" in line, line
    assert line.endswith("strong evidence against it: check the inputs (column order, score, "
                         "the data's distribution)"), line
    odds = float(re.search(r"probability at most (\S+) under it", line).group(1))
    assert odds == pytest.approx(0.001, rel=1e-6)
    # the same figure in the evaluation's JSON (and Release.evaluate), not only in the text
    doc = env.json("evaluate", "--release", str(rel["id"]), "--probs", env.f("tp.npy"),
                   "--labels", env.f("bad.npy"))
    assert doc["shortfall_probability"] == pytest.approx(0.001, rel=1e-6)
    assert doc["shortfall_bound"].startswith("P-COQS: outside an event of probability")
    good = env.json("evaluate", "--release", str(rel["id"]), "--probs", env.f("tp.npy"),
                    "--labels", env.f("ty.npy"))  # the true labels: no shortfall to weigh
    assert good["consistent_with_guarantee"] is True
    assert good["shortfall_probability"] is None and good["shortfall_bound"] is None


def test_the_pcoqs_shortfall_bound_holds_over_many_seeded_releases() -> None:
    """The bound `evaluate` prints for a P-COQS release, on many seeded releases of known
    coverage (uniform scores: a threshold t covers exactly min(t, 1)): the share of releases
    with coverage ≤ u stays below β + Beta-cdf(u; r'−τ, n+1−r'+τ), within sampling error —
    for both variants. And it is not loose by construction: the same bound without the
    noise's −τ (the rank-r' order statistic) is exceeded, so a derivation that forgot τ
    would fail here."""
    import random

    from privcal.calibrators.base import CalibrationInput
    from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
    from privcal.calibrators.shortfall import rank_tail

    cal, n, trials, fp = PCOQS(), 200, 6000, 0.001
    for nominal in (False, True):
        p = PCOQSParams(alpha=0.1, rho=2.0, failure_probability=fp, nominal=nominal, tol=1e-6)
        rng = np.random.default_rng(17 + nominal)
        cov = np.empty(trials)
        for t in range(trials):
            res = cal.calibrate(CalibrationInput(scores=rng.random(n)), p, random.Random(t))
            cov[t] = min(1.0, res.threshold)
        d = res.diagnostics
        rel = SimpleNamespace(method="pcoqs", shape={"n": n}, coverage=SimpleNamespace(
            rank=d["target_rank"], failure_probability=fp, details={"tau": d["tau"]}))
        for q in (0.01, 0.05, 0.2, 0.5):
            u = float(np.quantile(cov, q))
            share = float((cov <= u).mean())
            bound = rank_tail(rel, u)[0]
            assert share <= bound + 4 * np.sqrt(bound * (1 - bound) / trials) + 1 / trials, \
                (nominal, q, u, share, bound)
        if not nominal:  # power: the bound without −τ is too small
            u = float(np.quantile(cov, 0.05))
            share = float((cov <= u).mean())
            naive = float(beta.cdf(u, d["target_rank"], n + 1 - d["target_rank"]))
            assert share > naive + 4 * np.sqrt(share * (1 - share) / trials), (share, naive)
