"""The scikit-learn-style wrappers (issue 12): duck-typed models (no scikit-learn needed),
string and non-contiguous class labels, several levels, CQR with a pair of quantile
models, and a saved release serving identical sets and intervals in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import privcal
from privcal import Accountant, InvalidInput, Release
from privcal.calibrators.scores import score_interval
from privcal.estimators import PrivateConformalClassifier, PrivateConformalRegressor
from tests.seeded import Seeded


class SoftmaxModel:
    """A fitted 3-class model: logits (x, −x, 0); ``classes_`` as given."""

    def __init__(self, classes: list[object] | None) -> None:
        if classes is not None:
            self.classes_ = np.array(classes)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=float)
        z = np.column_stack([X, -X, 0 * X])
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


class Linear:
    def __init__(self, shift: float = 0.0, slope: float = 0.0) -> None:
        self.shift, self.slope = shift, slope

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=float)
        return X + self.shift + self.slope * X


def _class_data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=n)
    y = np.where(X + rng.normal(size=n) > 0, 0, np.where(rng.random(n) < 0.5, 1, 2))
    return X, y


def _reg_data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, n)
    return X, X + rng.normal(0, 0.1 + X, n)


@pytest.mark.parametrize("classes", [["cat", "dog", "eel"], [3, 5, 7], None])
def test_classifier_sets_match_the_release_and_speak_the_models_labels(
    accountant: Accountant, classes: list[object] | None
) -> None:
    accountant.create_dataset("d", rho=10)
    X, y_idx = _class_data(0, 2000)
    y = np.array(classes, dtype=object)[y_idx] if classes is not None else y_idx
    model = SoftmaxModel(classes)
    clf = PrivateConformalClassifier(model, method="pcoqs", confidence_level=0.9,
                                     accountant=accountant, dataset="d", rho=0.5,
                                     rng=Seeded(0))  # fmt: skip
    assert clf.conformalize(X[:1500], y[:1500]) is clf
    rel = clf.release_
    assert rel.params["alpha"] == 0.1 and rel.method == "pcoqs"
    assert rel.classes == [str(c) for c in (classes or [0, 1, 2])]
    y_pred, sets = clf.predict_set(X[1500:])
    assert sets.shape == (500, 3, 1) and sets.dtype == bool
    np.testing.assert_array_equal(sets[:, :, 0], rel.predict_set(model.predict_proba(X[1500:])))
    expected = np.array(classes or [0, 1, 2], dtype=object)
    np.testing.assert_array_equal(y_pred, expected[model.predict_proba(X[1500:]).argmax(1)])
    labels = clf.predict_labels(X[1500:1510])
    assert labels == [list(expected[r]) for r in sets[:10, :, 0]]
    assert all(type(v) is type((classes or [0])[0]) for row in labels for v in row)


def test_classifier_refuses_unknown_labels_and_charges_nothing(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=10)
    X, y = _class_data(1, 100)
    clf = PrivateConformalClassifier(SoftmaxModel(["a", "b", "c"]), accountant=accountant,
                                     dataset="d", rho=0.5)
    with pytest.raises(InvalidInput, match="row 0 is 'x', not one of the estimator's classes"):
        clf.conformalize(X, np.array(["x"] + ["a"] * 99))
    with pytest.raises(InvalidInput, match="not conformalized"):
        clf.predict_set(X)
    with pytest.raises(InvalidInput, match="needs accountant= and dataset="):
        PrivateConformalClassifier(SoftmaxModel(None)).conformalize(X, y)
    with pytest.raises(InvalidInput, match="has no predict_proba"):
        PrivateConformalClassifier(Linear(), accountant=accountant, dataset="d",
                                   rho=0.5).conformalize(X, y)
    with pytest.raises(InvalidInput, match="confidence_level must be in"):
        PrivateConformalClassifier(SoftmaxModel(None), confidence_level=90,
                                   accountant=accountant, dataset="d", rho=0.5
                                   ).conformalize(X, y)  # fmt: skip
    assert accountant.releases() == []


def test_classifier_with_several_levels(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=10)
    X, y = _class_data(2, 2000)
    clf = PrivateConformalClassifier(SoftmaxModel(None), confidence_level=[0.8, 0.95],
                                     accountant=accountant, dataset="d", rho=0.5,
                                     rng=Seeded(1)).conformalize(X[:1500], y[:1500])
    _, sets = clf.predict_set(X[1500:])
    assert sets.shape == (500, 3, 2)
    assert (sets[:, :, 0] <= sets[:, :, 1]).all()  # the 95% sets contain the 80% sets
    _, one = clf.predict_set(X[1500:], confidence_level=0.95)
    np.testing.assert_array_equal(one[:, :, 0], sets[:, :, 1])


@pytest.mark.parametrize("score", ["absolute", "cqr"])
def test_regressor_intervals_match_the_release(accountant: Accountant, score: str) -> None:
    accountant.create_dataset("d", rho=10)
    X, y = _reg_data(3, 3000)
    est = Linear() if score == "absolute" else (Linear(-0.3, -0.5), Linear(0.3, 0.5))
    reg = PrivateConformalRegressor(est, method="pcoqs", confidence_level=0.9, score=score,
                                    accountant=accountant, dataset="d", rho=0.5,
                                    score_range=(-2, 6), rng=Seeded(0))  # fmt: skip
    reg.conformalize(X[:2000], y[:2000])
    rel = reg.release_
    assert rel.diagnostics["score"]["name"] == score
    assert rel.diagnostics["score_range"]["source"] == "score_range"
    y_pred, iv = reg.predict_interval(X[2000:])
    assert iv.shape == (1000, 2, 1)
    t = rel.threshold
    if score == "absolute":
        np.testing.assert_array_equal(y_pred, X[2000:])
        np.testing.assert_array_equal(iv[:, :, 0],
                                      np.column_stack(score_interval(X[2000:], X[2000:], t)))
    else:
        lo, hi = est[0].predict(X[2000:]), est[1].predict(X[2000:])
        np.testing.assert_array_equal(y_pred, (lo + hi) / 2)
        np.testing.assert_array_equal(iv[:, :, 0], np.column_stack(score_interval(lo, hi, t)))


def test_regressor_refuses_a_classification_score() -> None:
    with pytest.raises(InvalidInput, match="'absolute' or 'cqr'"):
        PrivateConformalRegressor(Linear(), score="lac")


def test_wrappers_are_exported_lazily_and_need_no_scikit_learn() -> None:
    assert privcal.PrivateConformalClassifier is PrivateConformalClassifier
    code = ("import sys, privcal.estimators; "
            "assert 'sklearn' not in sys.modules, 'sklearn imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_saved_release_serves_identical_sets_and_intervals_in_a_fresh_process(
    accountant: Accountant, tmp_path: Path
) -> None:
    accountant.create_dataset("d", rho=10)
    X, y = _class_data(4, 2000)
    clf = PrivateConformalClassifier(SoftmaxModel(["a", "b", "c"]), accountant=accountant,
                                     dataset="d", rho=0.5, rng=Seeded(2))
    clf.conformalize(X[:1500], np.array(["a", "b", "c"])[y[:1500]])
    Xr, yr = _reg_data(5, 1500)
    reg = PrivateConformalRegressor(Linear(), accountant=accountant, dataset="d", rho=0.5,
                                    score_range=(0, 6), rng=Seeded(3))
    reg.conformalize(Xr[:1000], yr[:1000])
    (tmp_path / "clf.json").write_text(clf.release_.model_dump_json())
    (tmp_path / "reg.json").write_text(reg.release_.model_dump_json())
    np.save(tmp_path / "X.npy", X[1500:])
    np.save(tmp_path / "Xr.npy", Xr[1000:])
    code = (
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {str(Path(__file__).parent.parent)!r})\n"
        "from tests.test_estimators import Linear, SoftmaxModel\n"
        "from privcal import Release\n"
        "from privcal.estimators import PrivateConformalClassifier as C, "
        "PrivateConformalRegressor as R\n"
        "d = sys.argv[1]\n"
        "c = C.from_release(SoftmaxModel(['a', 'b', 'c']), d + '/clf.json')\n"
        "np.save(d + '/sets.npy', c.predict_set(np.load(d + '/X.npy'))[1])\n"
        "r = R.from_release(Linear(), Release.load(d + '/reg.json'))\n"
        "np.save(d + '/iv.npy', r.predict_interval(np.load(d + '/Xr.npy'))[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    np.testing.assert_array_equal(np.load(tmp_path / "sets.npy"), clf.predict_set(X[1500:])[1])
    np.testing.assert_array_equal(np.load(tmp_path / "iv.npy"),
                                  reg.predict_interval(Xr[1000:])[1])
    assert Release.load(tmp_path / "clf.json") == clf.release_


def test_local_dp_methods_take_the_subjects_of_the_rows(accountant: Accountant) -> None:
    """A local-DP method charges each subject by its id: conformalize takes them, and refuses
    to run without (a row number is not a person), charging nothing."""
    accountant.create_dataset("l", epsilon=1, subject_epsilon=4)
    X, y = _class_data(5, 3000)
    clf = PrivateConformalClassifier(SoftmaxModel(["a", "b", "c"]), method="ldp-label",
                                     confidence_level=0.9, accountant=accountant,
                                     dataset="l", epsilon=2, rng=Seeded(0))
    with pytest.raises(InvalidInput, match="give the subject id of every row"):
        clf.conformalize(X, np.array(["a", "b", "c"])[y])
    assert accountant.budget("l").releases == 0
    users = [f"patient-{i}" for i in range(3000)]
    clf.conformalize(X, np.array(["a", "b", "c"])[y], subjects=users)
    assert clf.release_.method == "ldp-label"
    assert accountant.subject_spend("l", "patient-7") == 2
    Xr, yr = _reg_data(6, 3000)
    reg = PrivateConformalRegressor(Linear(), method="ldp-score", score="absolute",
                                    confidence_level=0.9, accountant=accountant, dataset="l",
                                    epsilon=2, score_range=(0, 4), rng=Seeded(1))
    reg.conformalize(Xr, yr, subjects=users)
    assert accountant.subject_spend("l", "patient-7") == 4
