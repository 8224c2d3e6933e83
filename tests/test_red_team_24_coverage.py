"""Red team 24, coverage findings: half-precision scores named as a score (F1), and the
per-level / per-group rows of a release (F2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privcal.errors import InvalidInput

N = 2000


def _tree_model(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A discrete two-class model (two leaves: P(y=1) = 0.8 or 0.99, weights 0.7 / 0.3),
    float64 probabilities whose rows sum to 1 exactly, and labels drawn from them."""
    g = np.random.default_rng(seed)
    p1 = np.where(g.random(n) < 0.7, 0.8, 0.99)
    y = (g.random(n) < p1).astype(np.int64)
    return np.stack([1 - p1, p1], axis=1), y


def _bfloat16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (8 significant bits, round to nearest even), widened back."""
    b = x.astype(np.float32).view(np.uint32)
    b = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))
         & np.uint32(0xFFFF0000)).astype(np.uint32)
    return b.view(np.float32).astype(np.float64)


@pytest.mark.parametrize("narrow", [
    lambda s: s.astype(np.float16).astype(np.float64),   # a float16 column, upcast
    lambda s: s.astype(np.float16).tolist(),             # a list of Python floats (a JSON body)
    _bfloat16,                                           # bfloat16 arithmetic, widened
])
def test_f1_half_precision_scores_named_lac_are_refused(accountant: Any, narrow: Any) -> None:
    """F1: lac scores rounded to half precision (float16: 11 significant bits, bfloat16: 8)
    and widened to float64 passed the narrow-float check, which asked for one value past 16
    significant bits. fl16(1 − 0.8) = 0.7998046875 < 0.8, the float64 score predict computes:
    every test point tied with the threshold fell out of its set — over 200 seeded releases
    of this model, mean coverage 0.857 under a recorded ≥ 0.9. Refused before the charge."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, labels = _tree_model(0, N)
    scores = 1 - probs[np.arange(N), labels]
    head = accountant.ledger.head()
    with pytest.raises(InvalidInput, match=r"^scores are values of a format narrower than "
                       r"float32, widened to float64 .* but the score 'lac' is named"):
        accountant.calibrate("split", dataset="d", scores=narrow(scores), alpha=0.1,
                             score="lac")
    assert accountant.ledger.head() == head and accountant.budget("d").charges == 0
    # without a named score nothing is recomputed at predict: it runs
    accountant.calibrate("split", dataset="d", scores=narrow(scores), alpha=0.1)


def test_f1_short_dyadic_and_quantised_scores_still_run(accountant: Any) -> None:
    """What the rule lets through, as before: float64 scores, short dyadic ones (k/8), and an
    8- or 16-bit quantised model's q/2⁸, q/2¹⁶ (exact in any format, on one fixed-point
    grid of at most 16 bits)."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(1)
    for s in (g.random(N), g.integers(0, 8, N) / 8, g.integers(0, 256, N) / 256,
              g.integers(0, 65536, N) / 65536, 1 - _tree_model(0, N)[0][:, 1]):
        rel = accountant.calibrate("split", dataset="d", scores=s, alpha=0.1, score="lac")
        assert rel.diagnostics["score"]["name"] == "lac"


def test_f1_review_integer_residuals_named_absolute_run(accountant: Any) -> None:
    """The review of F1: |y − f| of integer targets and predictions (counts, prices in cents)
    is exact in float64, as predict computes it, and every such value below 2²³ is also a
    float32 — so residuals past 65 536 were refused as "float32 values (widened to
    float64)", and a spread of smaller ones as half precision. They run, and cover; a
    float16 column of residuals (integers above 1024, at most 11 significant bits) is still
    refused."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(4)

    def residuals(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        f = g.integers(0, 10**6, n)
        y = f + g.integers(-150_000, 150_001, n)
        return y.astype(np.float64), f.astype(np.float64), np.abs(y - f).astype(np.float64)

    _, _, scores = residuals(N)
    rel = accountant.calibrate("split", dataset="d", scores=scores, alpha=0.1,
                               score="absolute")
    assert rel.diagnostics["score"]["name"] == "absolute"
    ty, tf, _ = residuals(40_000)
    iv = rel.predict_interval(tf)
    # the coverage given the calibration set is Beta(1801, 200): sd √(0.9·0.1/N); the test
    # sample's own sd √(0.9·0.1/40 000): 4 of each below 0.9
    tol = 4 * (0.09 / N) ** 0.5 + 4 * (0.09 / 40_000) ** 0.5
    assert ((iv[:, 0] <= ty) & (ty <= iv[:, 1])).mean() >= 0.9 - tol
    head = accountant.ledger.head()
    wide = g.uniform(1000, 60_000, N).astype(np.float16).astype(np.float64)
    with pytest.raises(InvalidInput, match=r"^scores are values of a format narrower"):
        accountant.calibrate("split", dataset="d", scores=wide, alpha=0.1, score="absolute")
    assert accountant.ledger.head() == head


def test_f1_the_refused_form_given_as_probabilities_covers(accountant: Any) -> None:
    """The advice of the refusal: the same model given as probabilities and labels covers at
    least 1 − α on fresh draws (the half-precision scores covered 0.857)."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, labels = _tree_model(2, N)
    rel = accountant.calibrate("split", dataset="d", probs=probs, labels=labels, alpha=0.1,
                               score="lac")
    tp, tl = _tree_model(3, 40_000)
    assert rel.predict_set(tp)[np.arange(tl.size), tl].mean() >= 0.9


def test_f2_level_and_group_rows_say_with_what_probability_their_bound_holds(
        tmp_path: Any) -> None:
    """F2: the per-level and per-group rows of ``calibrate`` / ``release show`` and
    ``Release.thresholds()`` stated a P-COQS level's bound as "coverage ≥ 0.9", which holds
    only on an event of probability ≥ 1 − β (red team 23 fixed the same in ``release list``).
    Each row now carries its failure probability and the printed row says "w.p. ≥ 0.95"; a
    bound that always holds (ExponQ) says nothing more."""
    from click.testing import CliRunner

    from privcal import Accountant
    from privcal.cli import main

    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = Accountant(url)
    acct.create_dataset("c", epsilon=100)
    acct.create_dataset("z", rho=5)
    g = np.random.default_rng(0)
    probs = g.dirichlet(np.ones(3), size=3000)
    labels = np.array([g.choice(3, p=p) for p in probs])
    pc = acct.calibrate("pcoqs", dataset="z", probs=probs, labels=labels, score="lac",
                        alpha=[0.1, 0.2], rho=0.25, mondrian="label", public_groups=True)
    ex = acct.calibrate("exponq", dataset="c", probs=probs, labels=labels, score="lac",
                        alpha=[0.1, 0.2], epsilon=1)
    rows = pc.thresholds()
    assert len(rows) == 6 and all(r["failure_probability"] == 0.05 for r in rows)
    assert all(r["failure_probability"] == 0.0 for r in ex.thresholds())
    for rel, said in ((pc, " w.p. ≥ 0.95"), (ex, "")):
        res = CliRunner().invoke(main, ["--db-url", url, "release", "show", str(rel.id)])
        assert res.exit_code == 0, res.output
        lines = [ln for ln in res.output.splitlines() if "α=0.1: threshold" in ln]
        assert lines and all(ln.rstrip().endswith(f"coverage ≥ 0.9{said}") for ln in lines), \
            res.output


def test_f3_an_agent_of_a_named_score_session_refuses_float32_scores() -> None:
    """F3: an agent of a FedCP-QQ session opened with score='lac' sent its ℓ-th smallest
    float32 score (a torch model's 1 − p: red team 22's tied model, the true class at 0.1f or
    0.9f); the release's threshold was that float32, 0.8999999761581421, below the
    0.9000000059604645 predict computes in float64 for p = 0.1f, and every tied test point
    fell out — 0.50 coverage over 30 sessions under a recorded ≥ 0.9. ``Agent.send`` refuses
    a float32 or float16 score array, and values the score never takes, before anything is
    sent; float64 scores — of float32 probabilities too, float32-exact where 1 − p is exact —
    are sent, and a session that names no score takes any (nothing is recomputed)."""
    from privcal.client import Agent
    from tests.service.test_client_memo import _Fake

    g = np.random.default_rng(0)
    p0 = np.where(g.random(50) < 0.5, np.float32(0.1), np.float32(0.9)).astype(np.float32)
    lac = {"name": "lac", "options": {}}

    def fake(score: dict[str, Any] | None) -> Any:
        return _Fake(whoami=lambda n: {"role": "agent", "session": 1, "agent": "h1",
                                       "sent": False},
                     state=lambda n: {"id": 1, "method": "fedcp-qq", "status": "open",
                                      "plan": {"method": "fedcp-qq", "m": 3, "n": 50, "l": 46,
                                               "k": 3, "M": 0.95, "alpha": 0.1},
                                      "params": {"alpha": 0.1, **({"score": score} if score
                                                                  else {})}})

    for bad, words in ((np.float32(1) - p0, "scores are float32 but"),
                       ((1 - p0.astype(np.float64)).astype(np.float16), "scores are float16 but"),
                       (p0.astype(np.float64) - 1, "scores named 'lac' cannot be that score")):
        server = fake(lac)
        with pytest.raises(InvalidInput, match=f"^{words}"):
            Agent("https://calib.example", "tok", client=server.client()).send(bad)
        assert server.puts == []
    for good in (1 - p0.astype(np.float64), np.float64(1) - np.full(50, np.float32(0.9))):
        server = fake(lac)  # the second: every value float32-exact (1 − 0.9f is exact)
        out = Agent("https://calib.example", "tok", client=server.client()).send(good)
        assert out["status"] == "accepted" and server.puts[0]["value"] == float(
            np.sort(good)[45])
    server = fake(None)
    assert Agent("https://calib.example", "tok", client=server.client()).send(
        np.float32(1) - p0)["status"] == "accepted"
