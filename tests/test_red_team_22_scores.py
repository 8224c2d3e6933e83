"""Red team 22, coverage F1: precomputed float32 scores recorded as a named score. The
threshold was the float32 score, while predict, evaluate and ``Release.predict_set`` compute
the named score in float64, which exceeds the float32 value by up to half a float32 ulp: with
the true class at probability 0.1 or 0.9 (float32), every test point tied with the threshold
fell outside its set — coverage 0.50 under a recorded ≥ 0.9. Such scores are now refused
before anything is charged; float32 *probabilities* (privcal computes the score in float64 at
both ends) and float32 scores with no score named (the same function at both ends) run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from privcal.accountant import Accountant
from privcal.cli import main
from privcal.errors import InvalidInput

N = 1000


def _tied(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two-class float32 probabilities whose true class (0) gets 0.1 or 0.9, half each."""
    g = np.random.default_rng(seed)
    p0 = np.where(g.random(N) < 0.5, np.float32(0.1), np.float32(0.9)).astype(np.float32)
    return np.stack([p0, np.float32(1) - p0], axis=1), np.zeros(N, dtype=int)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("score", ["lac", "absolute"])
def test_narrow_scores_with_a_named_score_are_refused_before_the_charge(
        accountant: Any, dtype: Any, score: str) -> None:
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, _ = _tied(0)
    scores = (np.float32(1) - probs[:, 0]).astype(dtype)
    head = accountant.ledger.head()
    for method, extra in (("split", {}), ("pcoqs", {"rho": 0.1})):
        for given in (scores, list(scores)):  # an array, or a list of numpy scalars
            with pytest.raises(InvalidInput, match=rf"^scores are {np.dtype(dtype).name} but "
                               rf"the score '{score}' is named: predict computes it in float64"):
                accountant.calibrate(method, dataset="d", scores=given, alpha=0.1,
                                     score=score, **extra)
    assert accountant.ledger.head() == head and accountant.budget("d").charges == 0


@pytest.mark.parametrize("widen", [lambda s: s.astype(np.float64), lambda s: s.tolist(),
                                   lambda s: [float(x) for x in s]])
def test_float32_values_widened_to_float64_are_refused_too(accountant: Any, widen: Any) -> None:
    """The review of the fix (R2): the dtype alone missed float32 values given as float64 —
    an upcast array, a list of Python floats, and every JSON body of the service."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, _ = _tied(0)
    head = accountant.ledger.head()
    with pytest.raises(InvalidInput, match=r"^scores are float32 values \(widened to float64\) "
                       r"but the score 'lac' is named"):
        accountant.calibrate("split", dataset="d", scores=widen(np.float32(1) - probs[:, 0]),
                             alpha=0.1, score="lac")
    assert accountant.ledger.head() == head
    g = np.random.default_rng(3)  # float64 scores, and short dyadic ones alike in both: run
    for s in (g.random(N), 1 - probs[:, 0].astype(np.float64), g.integers(0, 8, N) / 8):
        accountant.calibrate("split", dataset="d", scores=s, alpha=0.1, score="lac")


def test_float32_probabilities_cover_the_ties_the_float32_scores_left_out(
        accountant: Any) -> None:
    """The advice of the refusal: the same float32 model output given as probabilities. Over
    20 seeded calibrations the test coverage on fresh draws (20 000 points each) is ≥ 0.9 every
    time — the refused form gave 0.50. With ties at two values the set of a test point is
    {0} or {0, 1} as a whole: a shortfall would be ~0.4, far outside any sampling error."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    for seed in range(20):
        probs, labels = _tied(seed)
        rel = accountant.calibrate("split", dataset="d", probs=probs, labels=labels, alpha=0.1,
                                   score="lac")
        tp, tl = (np.concatenate(a) for a in zip(*(_tied(1000 + seed * 20 + i)
                                                   for i in range(20)), strict=True))
        sets = rel.predict_set(tp)
        assert sets[np.arange(tl.size), tl].mean() >= 0.9


def test_float32_scores_with_no_score_named_run(accountant: Any) -> None:
    """No score named: predict takes precomputed test scores (the caller's function at both
    ends); nothing is recorded that predict would recompute."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, _ = _tied(0)
    rel = accountant.calibrate("split", dataset="d", scores=np.float32(1) - probs[:, 0],
                               alpha=0.1)
    assert rel.threshold == float(np.float32(0.9)) and "score" not in rel.diagnostics


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_cli_refuses_a_float32_npy_with_a_named_score(
        ledger: Any, tmp_path: Path, dry_run: bool) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    Accountant(ledger).create_dataset("d", rho=1, allow_nonprivate=True)
    probs, _ = _tied(0)
    np.save(tmp_path / "s.npy", np.float32(1) - probs[:, 0])
    head = ledger.head()
    res = CliRunner().invoke(main, [
        "--db-url", url, "calibrate", "split", "--dataset", "d", "--alpha", "0.1",
        "--scores", str(tmp_path / "s.npy"), "--score", "lac",
        *(["--dry-run"] if dry_run else [])])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "scores are float32 but the score 'lac' is named" in res.output
    assert ledger.head() == head and Accountant(ledger).budget("d").charges == 0


class _Tensorish:
    """A container whose ``dtype`` is not a NumPy dtype (as polars' and torch's are)."""

    def __init__(self, a: np.ndarray, dtype: str) -> None:
        self._a, self.dtype = a, dtype

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._a if dtype is None else self._a.astype(dtype)

    def __len__(self) -> int:
        return len(self._a)


def test_scores_whose_dtype_is_not_numpys_are_read_through_numpy(accountant: Any) -> None:
    """The review of the fix, R5: ``.dtype.kind`` of a polars or torch dtype was an
    AttributeError (a traceback) for any such scores with a named score, float64 included."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    s = np.random.default_rng(0).random(200)
    rel = accountant.calibrate("split", dataset="d", scores=_Tensorish(s, "Float64"),
                               alpha=0.1, score="lac")
    assert rel.threshold == accountant.calibrate("split", dataset="d", scores=s, alpha=0.1,
                                                 score="lac").threshold
    with pytest.raises(InvalidInput, match=r"^scores are float32 but the score 'lac'"):
        accountant.calibrate("split", dataset="d", alpha=0.1, score="lac",
                             scores=_Tensorish(s.astype(np.float32), "torch.float32"))
