"""Red team 25 (second wave), coverage2 findings: half-precision scores privcal did not
compute, calibrated without naming the score and named only at predict: float16 (F1)
and bfloat16 (F2)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tests.test_red_team_25_coverage import M, N, T, _tolerance  # same trials, same bound


def _model(seed: int, n: int, first: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """A discrete two-class model (P(y=1) = ``first`` or 0.99, weights 0.7 / 0.3; red team
    24's) with float64 probabilities, and labels drawn from them."""
    g = np.random.default_rng(seed)
    p1 = np.where(g.random(n) < 0.7, first, 0.99)
    y = (g.random(n) < p1).astype(np.int64)
    return np.stack([1 - p1, p1], axis=1), y


def test_f1_half_precision_scores_calibrated_unnamed_then_named_at_predict_cover(
        accountant: Any) -> None:
    """F1: lac scores rounded to float16 (then widened), calibrated without naming the
    score, predicted with ``score_name="lac"``: the float64 1 − p of a label whose float16
    score is the threshold lies up to half a float16 spacing above it (2⁻¹² relative), far
    beyond the float32 slack (2⁻²¹), and every test point tied with it fell out — 0.857
    under a recorded ≥ 0.9. Every label whose float16 score is ≤ t must be in its set."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    covs, lower = [], math.nan
    for seed in range(T):
        probs, y = _model(seed, N)
        s = (1 - probs[np.arange(N), y]).astype(np.float16).astype(np.float64)
        rel = accountant.calibrate("split", dataset="d", scores=s, alpha=0.1)
        pt, yt = _model(10_000 + seed, M)
        sets = rel.predict_set(pt, score_name="lac")
        half = (1 - pt).astype(np.float16).astype(np.float64)
        assert sets[half <= rel.threshold].all()
        covs.append(float(sets[np.arange(M), yt].mean()))
        lower = rel.coverage.lower
    assert lower == 0.9
    assert float(np.mean(covs)) >= lower - _tolerance(0.1)


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest (ties to even) to bfloat16, through float32's bits, then widen."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def test_f2_bfloat16_scores_calibrated_unnamed_then_named_at_predict_cover(
        accountant: Any) -> None:
    """F2: the same for bfloat16 (8 significant bits: 0.65 rounds down to 0.6484375, 2⁻⁹
    relative), P(y=1) = 0.65 or 0.99: 0.752 under a recorded ≥ 0.9 before."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    covs, lower = [], math.nan
    for seed in range(T):
        probs, y = _model(seed, N, 0.65)
        s = _bf16(1 - probs[np.arange(N), y])
        rel = accountant.calibrate("split", dataset="d", scores=s, alpha=0.1)
        pt, yt = _model(10_000 + seed, M, 0.65)
        sets = rel.predict_set(pt, score_name="lac")
        assert sets[_bf16(1 - pt) <= rel.threshold].all()
        covs.append(float(sets[np.arange(M), yt].mean()))
        lower = rel.coverage.lower
    assert lower == 0.9
    assert float(np.mean(covs)) >= lower - _tolerance(0.1)


def _next_up(t: float, brain: bool) -> float:
    """The next value above t in float16 (``brain`` False) or bfloat16 (inf past the last)."""
    if not brain:
        return float(np.nextafter(np.float16(t), np.float16(np.inf)))
    bits = int(np.float32(t).view(np.uint32)) + (-0x10000 if t < 0 else 0x10000)
    return float(np.uint32(bits & 0xFFFFFFFF).view(np.float32))


def test_f1_the_half_precision_slack_never_reaches_the_next_half_value() -> None:
    """F1/F2's slack from a threshold t that is a half-precision value is at least half the
    spacing above t and stays below the next value above t in the coarsest format t is a value
    of, so a short dyadic grid (k/8 and q/2⁸ in [0, 1)) keeps its sets exactly."""
    from privcal.calibrators.prediction_sets import outside_threshold

    halves = np.arange(0, 0x7C00, 7, dtype=np.uint16).view(np.float16).astype(np.float64)
    for t in np.concatenate([halves, -halves[1:]]).tolist():
        brain = _bf16(np.array([t]))[0] == t
        up = max(_next_up(t, False), _next_up(t, True)) if brain else _next_up(t, False)
        got = outside_threshold(t)
        if math.isfinite(up):
            assert t + (up - t) / 2 <= got < up
        else:
            assert got >= t + 16
    grid = np.arange(257) / 256
    for t in np.arange(0, 256).tolist():
        assert (grid <= outside_threshold(t / 256)).sum() == t + 1
    for t in np.arange(0, 9).tolist():
        assert (np.arange(9) / 8 <= outside_threshold(t / 8)).sum() == t + 1


def _run(url: str, *args: str) -> str:
    from click.testing import CliRunner

    from privcal.cli import main

    res = CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return " ".join(res.stdout.split())


def test_f3_release_show_says_the_upper_bound_does_not_count_predicts_band(
        tmp_path: Any) -> None:
    """F3: for scores privcal did not compute, predict's sets are a superset of {S ≤ t}
    (F1/F2 and wave 1's float32 slack), so the recorded "≤ 1−α+1/(n+1)" is not of them:
    ``calibrate`` and ``release show`` say what it is of; a run on probabilities (whose sets
    are exactly {S ≤ t}) says nothing of the kind."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _run(url, "db", "upgrade")
    _run(url, "dataset", "create", "d", "--epsilon", "5", "--allow-nonprivate")
    g = np.random.default_rng(3)
    np.save(tmp_path / "s.npy", g.random(200))
    probs = g.dirichlet(np.ones(3), 200)
    np.save(tmp_path / "p.npy", probs)
    np.save(tmp_path / "y.npy", g.integers(0, 3, 200))
    note = "is of {y : S ≤ t}; predict's sets also hold the labels whose score is within"
    for args in (["--scores", str(tmp_path / "s.npy")],
                 ["--scores", str(tmp_path / "s.npy"), "--score", "lac"]):
        out = _run(url, "calibrate", "split", "--dataset", "d", "--alpha", "0.1", *args)
        assert note in out
    assert note in _run(url, "release", "show", "1")
    assert note in _run(url, "release", "show", "2")
    out = _run(url, "calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--probs",
               str(tmp_path / "p.npy"), "--labels", str(tmp_path / "y.npy"), "--score", "lac")
    assert note not in out
    assert note not in _run(url, "release", "show", "3")


def test_f4_aps_summed_in_float32_over_many_classes_keeps_its_label(accountant: Any) -> None:
    """F4: a non-randomized aps score summed in float32 over 1000 classes (a cumulative sum
    of the sorted probabilities, as torch computes it) falls up to 2⁻¹⁹ below the float64
    score predict computes — four times wave 1's 2⁻²¹ slack —, so a label whose float32
    score is the threshold fell out of its set. A named precomputed aps release (one float32
    value among float64 ones: accepted) must keep it."""
    from privcal.calibrators.scores import all_class_scores

    g = np.random.default_rng(7)
    k = 1000
    p32 = g.dirichlet(np.full(k, 0.1)).astype(np.float32)
    p = p32.astype(np.float64)[None, :]
    order = np.argsort(-p32, kind="stable")
    c32 = np.empty(k)
    c32[order] = np.cumsum(p32[order], dtype=np.float32)  # inclusive: mass above + p_y
    s64 = all_class_scores("aps", p, randomized=False)[0]
    j = int(np.argmax((s64 - c32) / s64))
    assert (s64[j] - c32[j]) / s64[j] > 2.0 ** -21  # the premise: beyond wave 1's slack
    t = float(c32[j])
    below, above = np.linspace(t / 4, t / 2, 9) + 1e-9 / 3, np.linspace(t + 0.01, t + 0.1, 9)
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    rel = accountant.calibrate("split", dataset="d", scores=np.concatenate([below, [t], above]),
                               alpha=0.5, score="aps", score_options={"randomized": False})
    assert rel.threshold == t
    sets = rel.predict_set(p)
    assert sets[0][c32 <= t].all()
