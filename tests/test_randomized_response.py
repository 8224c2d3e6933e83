"""Client randomizers: exact keep/flip probabilities and uniform "other" labels.

Distribution tests use a fixed seed and a two-sided binomial acceptance region at test
level ALPHA_TEST = 1e-6 (scipy.stats.binom quantiles), so a correct implementation fails
with probability ≤ 1e-6 per check, while a 1% error in a probability is detected (the
region's half-width at N = 400 000 is ~0.4% of p).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats

from privcal.calibrators.mechanisms.randomized_response import (
    binary_rr,
    binary_rr_flip_probability,
    binary_rr_many,
    krr,
    krr_beta,
    krr_flip_probability,
    krr_keep_probability,
    krr_many,
)
from privcal.errors import InvalidInput

ALPHA_TEST = 1e-6


def assert_binomial(successes: int, trials: int, p: float) -> None:
    lo = stats.binom.ppf(ALPHA_TEST / 2, trials, p)
    hi = stats.binom.isf(ALPHA_TEST / 2, trials, p)
    assert lo <= successes <= hi, f"{successes}/{trials} outside [{lo}, {hi}] for p={p}"


def test_probabilities_match_closed_forms() -> None:
    for k in (2, 3, 10, 100):
        for eps in (0.1, 1.0, 4.0, 12.0):
            e = math.exp(eps)
            assert krr_keep_probability(k, eps) == pytest.approx(e / (e + k - 1), rel=1e-14)
            assert krr_flip_probability(k, eps) == pytest.approx((k - 1) / (e + k - 1), rel=1e-14)
            beta = krr_beta(k, eps)
            assert beta == pytest.approx(k / (k - 1 + e), rel=1e-14)
            # the uniform-noise form of seed 004, Eq. (1): P(keep) = 1 − β + β/k
            assert 1 - beta + beta / k == pytest.approx(krr_keep_probability(k, eps), rel=1e-12)
    assert binary_rr_flip_probability(1.0) == pytest.approx(1 / (math.e + 1), rel=1e-14)


def test_huge_epsilon_does_not_overflow() -> None:
    assert krr_flip_probability(10, 1000.0) == 0.0
    assert krr_beta(10, 1000.0) == 0.0
    assert binary_rr_flip_probability(1000.0) == 0.0
    gen = np.random.default_rng(0)
    y = gen.integers(0, 10, 1000)
    assert np.array_equal(krr_many(y, 10, 1000.0, gen), y)


@pytest.mark.parametrize(("k", "eps"), [(2, 0.5), (5, 1.0), (10, 2.0), (100, 4.0)])
def test_krr_many_keep_rate_and_uniform_other(k: int, eps: float) -> None:
    gen = np.random.default_rng(1000 + k)
    n = 400_000
    y = gen.integers(0, k, n)
    out = krr_many(y, k, eps, gen)
    assert out.dtype == np.int64 and out.min() >= 0 and out.max() < k
    kept = out == y
    assert_binomial(int(kept.sum()), n, krr_keep_probability(k, eps))
    if k > 2:
        # among flipped reports of true label 0, the k−1 others are uniform: chi-square at 1e-6
        flipped = out[(y == 0) & ~kept]
        assert flipped.min() >= 1
        counts = np.bincount(flipped, minlength=k)[1:]
        assert stats.chisquare(counts).pvalue > ALPHA_TEST


def test_krr_many_other_label_never_equals_true_label_when_flipped() -> None:
    gen = np.random.default_rng(5)
    y = gen.integers(0, 3, 100_000)
    # ε tiny: flips at rate (k−1)/(e^ε+k−1) ≈ 2/3; the report given a flip is never y itself,
    # so P(report == y) must be the keep probability and not keep + flip/k
    out = krr_many(y, 3, 1e-9, gen)
    assert_binomial(int((out == y).sum()), y.size, krr_keep_probability(3, 1e-9))


def test_scalar_krr_with_seeded_rng() -> None:
    r = random.Random(7)
    k, eps, n = 6, 1.5, 60_000
    labels = [i % k for i in range(n)]
    out = [krr(lab, k, eps, r) for lab in labels]
    assert all(0 <= o < k for o in out)
    kept = sum(o == lab for o, lab in zip(out, labels, strict=True))
    assert_binomial(kept, n, krr_keep_probability(k, eps))
    others = np.bincount(
        [o for o, lab in zip(out, labels, strict=True) if lab == 2 and o != 2], minlength=k
    )
    assert others[2] == 0
    assert stats.chisquare(np.delete(others, 2)).pvalue > ALPHA_TEST
    # reproducible with the same seed
    assert [krr(1, k, eps, random.Random(3)) for _ in range(5)] == [
        krr(1, k, eps, random.Random(3)) for _ in range(5)
    ]


def test_default_rng_is_the_csprng() -> None:
    # no generator given: draws from secrets.SystemRandom; only the range can be asserted
    assert 0 <= krr(2, 5, 1.0) < 5
    assert binary_rr(True, 1.0) in (True, False)


def test_many_forms_default_to_a_generator_seeded_from_the_os(monkeypatch) -> None:
    # red team 17: krr_many(labels, k, eps) with no generator raised AttributeError; now a
    # fresh Generator seeded with 128 bits of the OS CSPRNG (base.numpy_rng(default_rng()))
    import privcal.calibrators.mechanisms.randomized_response as rr

    seeds: list[int] = []

    class Recording(random.Random):
        def getrandbits(self, k: int) -> int:
            seeds.append(k)
            return super().getrandbits(k)

    monkeypatch.setattr(rr, "default_rng", lambda: Recording(5))
    labels = np.arange(4000) % 3
    out = krr_many(labels, 3, 50.0)  # ε = 50: every label kept
    assert out.tolist() == labels.tolist()
    assert binary_rr_many(np.array([True, False]), 50.0).tolist() == [True, False]
    assert seeds == [128, 128]  # one fresh 128-bit seed per call
    # a legacy RandomState is still taken (binary_rr_many duck-typed it before)
    legacy = np.random.RandomState(0)
    assert binary_rr_many(np.array([True, False]), 50.0, legacy).tolist() == [True, False]
    flipped = krr_many(np.zeros(30_000, dtype=np.int64), 3, 0.5, legacy)
    assert set(np.unique(flipped)) == {0, 1, 2}
    assert_binomial(int((flipped == 1).sum()), int((flipped != 0).sum()), 0.5)
    # and the draws do follow the mechanism (ε = 1, k = 3: keep e/(e+2))
    monkeypatch.undo()
    y = np.zeros(200_000, dtype=np.int64)
    assert_binomial(int((krr_many(y, 3, 1.0) == 0).sum()), y.size,
                    math.exp(1) / (math.exp(1) + 2))


@pytest.mark.parametrize("eps", [0.25, 1.0, 3.0])
def test_binary_rr_flip_rates(eps: float) -> None:
    gen = np.random.default_rng(int(eps * 100))
    n = 400_000
    bits = gen.random(n) < 0.3
    out = binary_rr_many(bits, eps, gen)
    assert out.dtype == np.bool_
    keep = math.exp(eps) / (math.exp(eps) + 1)
    assert_binomial(int((out[bits]).sum()), int(bits.sum()), keep)
    assert_binomial(int((~out[~bits]).sum()), int((~bits).sum()), keep)
    r = random.Random(11)
    m = 40_000
    kept = sum(binary_rr(True, eps, r) for _ in range(m))
    assert_binomial(kept, m, keep)


def test_binary_rr_many_accepts_0_1_integers() -> None:
    gen = np.random.default_rng(0)
    out = binary_rr_many(np.array([0, 1, 1, 0]), 50.0, gen)
    assert out.tolist() == [False, True, True, False]


@pytest.mark.parametrize(
    "call",
    [
        lambda: krr(0, 3, 0.0),
        lambda: krr(0, 3, -1.0),
        lambda: krr(0, 3, float("nan")),
        lambda: krr(0, 3, float("inf")),
        lambda: krr(3, 3, 1.0),
        lambda: krr(-1, 3, 1.0),
        lambda: krr(0, 1, 1.0),
        lambda: krr(0, True, 1.0),
        lambda: krr_many(np.array([0, 4]), 4, 1.0, np.random.default_rng(0)),
        lambda: krr_many(np.array([0.5]), 4, 1.0, np.random.default_rng(0)),
        lambda: binary_rr(2, 1.0),
        lambda: binary_rr_many(np.array([0, 2]), 1.0, np.random.default_rng(0)),
        lambda: binary_rr_many(np.array([0.5]), 1.0, np.random.default_rng(0)),
        # a seed or a random.Random is not a numpy Generator: one line, not a traceback
        lambda: krr_many(np.array([0]), 4, 1.0, 42),
        lambda: binary_rr_many(np.array([True]), 1.0, random.Random(0)),
    ],
)
def test_bad_input_is_invalid_input(call) -> None:
    with pytest.raises(InvalidInput):
        call()
