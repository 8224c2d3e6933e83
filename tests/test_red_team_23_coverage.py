"""Red team 23, coverage findings (F1–F8): what a release is used with, and named scores."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from privcal import PrivateConformalClassifier, PrivateConformalRegressor
from privcal.accountant import Accountant
from privcal.cli import main
from privcal.errors import InvalidInput


def _float32_model(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A float32 model's two-class output whose true class (0) gets 0.7 (95 %) or 0.05."""
    g = np.random.default_rng(seed)
    p0 = np.where(g.random(n) < 0.95, np.float32(0.7), np.float32(0.05)).astype(np.float32)
    return np.stack([p0, np.float32(1) - p0], axis=1), np.zeros(n, dtype=int)


def _as_text(values: np.ndarray) -> np.ndarray:
    """``values`` written as pandas writes a float32 column (its shortest float32 decimal)
    and read back as float64, as every CSV reader does."""
    text = "\n".join(str(v) for v in values.astype(np.float32))
    return np.loadtxt(io.StringIO(text), dtype=np.float64)


def test_f4_float32_scores_written_as_text_are_refused(accountant: Any) -> None:
    """F4: float32 LAC scores written as text (pandas' to_csv writes 1 − 0.7f as 0.3) read
    back as the double 0.3, below the float64 score predict computes (0.3000000119…): every
    test point tied with the threshold fell out — coverage 0.00 under a recorded ≥ 0.9.
    Refused before anything is charged, as the float32 values themselves are (red team 22)."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, _ = _float32_model(0, 1000)
    scores = _as_text(np.float32(1) - probs[:, 0])
    assert scores[0] in (0.3, 0.95) and not np.array_equal(
        scores.astype(np.float32).astype(np.float64), scores)  # not float32 values
    head = accountant.ledger.head()
    for method, extra in (("split", {}), ("pcoqs", {"rho": 0.1})):
        with pytest.raises(InvalidInput, match=r"^scores are float32 values written as text"):
            accountant.calibrate(method, dataset="d", scores=scores, alpha=0.1, score="lac",
                                 **extra)
    assert accountant.ledger.head() == head and accountant.budget("d").charges == 0
    # the same as regression residuals; and with no score named (the caller's scores at
    # both ends) they run, as float64 scores and short dyadic ones do
    with pytest.raises(InvalidInput, match=r"^scores are float32 values written as text"):
        accountant.calibrate("split", dataset="d", scores=scores, alpha=0.1, score="absolute")
    accountant.calibrate("split", dataset="d", scores=scores, alpha=0.1)
    g = np.random.default_rng(1)
    for ok, score in ((g.random(1000), "lac"), (g.integers(0, 8, 1000) / 8, "lac"),
                      (np.float32(1) - probs[:, 0].astype(np.float64), "lac"),
                      (g.normal(size=1000) ** 2, "absolute")):
        accountant.calibrate("split", dataset="d", scores=ok, alpha=0.1, score=score)


def test_f4_the_refused_text_would_have_covered_nothing(accountant: Any) -> None:
    """Why: the text's threshold on the float32 model's test probabilities (exact counts)."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, _ = _float32_model(0, 1000)
    t = float(np.quantile(_as_text(np.float32(1) - probs[:, 0]), 0.9, method="higher"))
    test, _ = _float32_model(1, 5000)
    assert t == 0.3 and (1.0 - test[:, 0].astype(np.float64) <= t).mean() == 0.0
    rel = accountant.calibrate("split", dataset="d", probs=probs, labels=np.zeros(1000, int),
                               alpha=0.1, score="lac")  # the advice: the probabilities
    assert rel.predict_set(test)[:, 0].mean() >= 0.9


def test_f4_the_cli_refuses_a_pandas_float32_csv(ledger: Any, tmp_path: Path) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    Accountant(ledger).create_dataset("d", rho=1, allow_nonprivate=True)
    probs, _ = _float32_model(0, 1000)
    (tmp_path / "s.csv").write_text(
        "score\n" + "\n".join(str(v) for v in np.float32(1) - probs[:, 0]) + "\n")
    head = ledger.head()
    res = CliRunner().invoke(main, [
        "--db-url", url, "calibrate", "split", "--dataset", "d", "--alpha", "0.1",
        "--scores", f"{tmp_path / 's.csv'}:score", "--score", "lac"])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "float32 values written as text" in res.output and ledger.head() == head


@pytest.mark.parametrize(("score", "bad"), [
    ("absolute", lambda y, f, p: y - f),          # signed residuals
    ("absolute", lambda y, f, p: f - y),
    ("lac", lambda y, f, p: 1 + p),               # not 1 − p: above 1
    ("lac", lambda y, f, p: -p),                  # below 0
    ("aps", lambda y, f, p: -p),
    ("raps", lambda y, f, p: -p),
])
def test_f3_named_scores_that_cannot_be_that_score_are_refused(
        accountant: Any, score: str, bad: Any) -> None:
    """F3: signed residuals y − f named ``absolute`` were recorded as |y − f|: the
    intervals [f − t, f + t] covered 0.83 under a recorded ≥ 0.9. A value the named score
    cannot take (|·| < 0, 1 − p outside [0, 1], aps or raps < 0) is refused before the charge."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(3)
    f = g.normal(size=500)
    y, p = f + g.normal(size=500), g.random(500)
    head = accountant.ledger.head()
    for method, extra in (("split", {}), ("pcoqs", {"rho": 0.1, "score_range": (-5, 5)})):
        with pytest.raises(InvalidInput, match=rf"^scores named {score!r} "):
            accountant.calibrate(method, dataset="d", scores=bad(y, f, p), alpha=0.1,
                                 score=score, **extra)
    assert accountant.ledger.head() == head and accountant.budget("d").charges == 0


def test_f3_the_scores_a_named_score_takes_still_run(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(4)
    f = g.normal(size=500)
    y, p = f + g.normal(size=500), g.random(500)
    for score, s in (("absolute", np.abs(y - f)), ("absolute", np.zeros(500) * -1.0),
                     ("cqr", y - f), ("lac", 1 - p), ("lac", -1e-7 * p),
                     ("aps", p), ("raps", 3 + p)):
        accountant.calibrate("split", dataset="d", scores=s, alpha=0.1, score=score)


class _Model:
    """A fitted classifier whose classes are not 0 … k−1 (scikit-learn's ``classes_``)."""

    classes_ = np.array([0, 2, 5])

    def predict_proba(self, X: Any) -> np.ndarray:
        e = np.exp(np.asarray(X, dtype=float))
        return e / e.sum(axis=1, keepdims=True)


class _Served:
    """The same model served without ``classes_`` (an ONNX or torch wrapper)."""

    def predict_proba(self, X: Any) -> np.ndarray:
        return _Model().predict_proba(X)


def _draw(g: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    X = g.normal(size=(n, 3)) * 2
    probs = _Model().predict_proba(X)
    return X, np.array([g.choice([0, 2, 5], p=q) for q in probs])


@pytest.mark.parametrize("mondrian", [None, "label"])
def test_f2_a_wrapped_release_evaluates_the_models_own_labels(
        accountant: Any, mondrian: str | None) -> None:
    """F2: the wrapper passed index labels with the model's classes_ as names, so
    ``release_.evaluate(probs, y)`` read the model's label 2 as column 2 (class 5): 0.59
    reported for a release covering 0.91 on the same rows, a label 5 refused. Counted
    exactly: evaluate's coverage is the wrapper's own sets' coverage of the true labels."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(5)
    X, y = _draw(g, 600)
    Xt, yt = _draw(g, 900)
    extra = {"mondrian": mondrian, "public_groups": True} if mondrian else {}
    clf = PrivateConformalClassifier(_Model(), method="split", confidence_level=0.9,
                                     accountant=accountant, dataset="d", **extra)
    clf.conformalize(X, y)
    _, sets = clf.predict_set(Xt)
    col = np.searchsorted(_Model.classes_, yt)
    covered = sets[np.arange(yt.size), col, 0]
    for rows in (np.ones(yt.size, bool), yt != 5):
        ev = clf.release_.evaluate(_Model().predict_proba(Xt[rows]), yt[rows])
        assert ev.coverage == covered[rows].mean()
        if mondrian:
            assert [(b.group, b.n) for b in ev.by_group] == [
                (str(c), int((yt[rows] == c).sum())) for c in _Model.classes_]


def test_f6_a_wrapper_rebuilt_for_a_model_without_classes_names_the_release_classes(
        accountant: Any) -> None:
    """F6: ``from_release`` with a model that has no ``classes_`` answered in column
    indices (class 5 as 2) though the release records its classes: the label sets held the
    true label for 38 % of rows instead of 91 %."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(6)
    X, y = _draw(g, 600)
    Xt, _ = _draw(g, 300)
    clf = PrivateConformalClassifier(_Model(), method="split", confidence_level=0.9,
                                     accountant=accountant, dataset="d").conformalize(X, y)
    served = PrivateConformalClassifier.from_release(_Served(), clf.release_.model_dump_json())
    assert [str(c) for c in served.classes_] == ["0", "2", "5"]
    want = [[str(c) for c in row] for row in clf.predict_labels(Xt)]
    assert [[str(c) for c in row] for row in served.predict_labels(Xt)] == want
    assert [str(c) for c in served.predict(Xt)] == [str(c) for c in clf.predict(Xt)]


@pytest.mark.parametrize("key", ["alpha", "classes", "labels", "probs"])
def test_f7_a_parameter_the_classifier_sets_itself_is_one_line(accountant: Any,
                                                               key: str) -> None:
    """F7: ``alpha=`` (or a data keyword) beside the wrapper's own was a TypeError traceback
    at conformalize; refused in one line when the wrapper is made, nothing charged."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    with pytest.raises(InvalidInput, match=rf"^{key}: "):
        PrivateConformalClassifier(_Model(), method="split", accountant=accountant,
                                   dataset="d", **{key: 0.2})


@pytest.mark.parametrize("key", ["alpha", "targets", "preds"])
def test_f7_a_parameter_the_regressor_sets_itself_is_one_line(accountant: Any,
                                                              key: str) -> None:
    with pytest.raises(InvalidInput, match=rf"^{key}: "):
        PrivateConformalRegressor(object(), method="split", accountant=accountant,
                                  dataset="d", **{key: 0.2})


def test_f8_mondrian_column_groups_are_refused_by_the_wrappers(accountant: Any) -> None:
    """F8: ``groups=`` passed through to a Mondrian release whose ``predict_interval`` /
    ``predict_set`` could never be given the test rows' groups (one line, then a TypeError
    for ``groups=``); refused when the wrapper is made. Label groups still work."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    site = np.array(["n", "s"] * 100)
    for cls in (PrivateConformalClassifier, PrivateConformalRegressor):
        with pytest.raises(InvalidInput, match=r"^groups: .*mondrian='label' works"):
            cls(_Model(), method="split", accountant=accountant, dataset="d", groups=site,
                public_groups=True)
    g = np.random.default_rng(9)
    X, y = _draw(g, 300)
    clf = PrivateConformalClassifier(_Model(), method="split", accountant=accountant,
                                     dataset="d", mondrian="label", public_groups=True)
    assert clf.conformalize(X, y).predict_set(X)[1].shape == (300, 3, 1)


def test_f1_ragged_probabilities_are_one_line(accountant: Any) -> None:
    """F1: rows of unequal length were numpy's ValueError (a traceback) in calibrate and
    predict_set; ragged scores were already one line."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(7)
    probs = g.dirichlet(np.ones(3), size=50)
    labels = g.integers(0, 3, 50)
    rel = accountant.calibrate("split", dataset="d", probs=probs, labels=labels, alpha=0.1,
                               score="lac")
    ragged = [list(r) for r in probs]
    ragged[1] = ragged[1][:2]
    head = accountant.ledger.head()
    with pytest.raises(InvalidInput, match=r"^probabilities are not an n×k array"):
        accountant.calibrate("split", dataset="d", probs=ragged, labels=labels, alpha=0.1,
                             score="lac")
    with pytest.raises(InvalidInput, match=r"^probabilities are not an n×k array"):
        rel.predict_set(ragged)
    assert accountant.ledger.head() == head


@pytest.mark.parametrize("dtype", ["Float64", "Float32", "float64[pyarrow]"])
def test_f5_a_frame_of_nullable_or_pyarrow_dtypes_is_read_as_numbers(
        accountant: Any, dtype: str) -> None:
    """F5: such a frame (``convert_dtypes()``, ``dtype_backend="pyarrow"``) was refused as
    "must be numeric, got dtype object"; it is the same probabilities as the array."""
    pd = pytest.importorskip("pandas")
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(8)
    probs = g.dirichlet(np.ones(3), size=200)
    labels = np.array(list("abc"))[g.integers(0, 3, 200)]
    frame = pd.DataFrame(probs, columns=list("abc"))
    want = accountant.calibrate("split", dataset="d", probs=frame, labels=labels, alpha=0.1,
                                score="lac")
    rel = accountant.calibrate("split", dataset="d", probs=frame.astype(dtype),
                               labels=labels, alpha=0.1, score="lac")
    if dtype != "Float32":
        assert rel.threshold == want.threshold
    assert np.array_equal(rel.predict_set(frame.astype(dtype)), rel.predict_set(frame))
    with pytest.raises(InvalidInput, match="must be numeric"):
        rel.predict_set((frame > 0.3).astype("boolean"))
