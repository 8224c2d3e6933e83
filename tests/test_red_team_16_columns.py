"""Red team 16 (predict): prediction inputs whose columns were read by position when privcal
had the names to match them — sets far below the recorded coverage, with no error.

- F1: named columns (a DataFrame's, a CSV header's) with integer labels recorded no names,
  so a later table with the same names in another order was read by position (0.28
  coverage in Python, 0.31 on the CLI, against a recorded 0.9). The names are now recorded
  as the release's ``columns`` (not its classes: the sets stay column indices, and a model
  whose ``classes_`` are 0 … k-1 still matches it — review R3).
- F2: a frame numbered 2,0,1 — refused at calibration — was read by position at predict
  (0.30); so was a CSV header ``,2,0,1`` on the CLI. Both are refused now.
- F3: a CSV header of column numbers other than 0,1,…,k-1 in order was read as a data row:
  ``1,0`` (a binary model's reordered frame) sums to 1 and became a probability row (six
  sets for five rows): refused as a header now. A one-column header ``1`` over floats (a
  phantom prediction of 1.0) cannot be told from data (``12`` then ``13.5`` is R's): it is
  still read as a row, and the README says to name such columns.
- F4: a pyarrow Table's names were ignored (0.29 at predict; at calibration the sorted text
  labels became the classes).
- F7: integer labels for number-named classes (``1,2,3``) were read by ``evaluate`` as column
  indices (0.295 reported for a true 0.905); they are names when the calibration read them
  as names (``diagnostics.label_names``), indices when it did not (``--classes 1,2,3`` with
  index labels: review R2).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from privcal import Accountant, Ledger
from privcal.errors import InvalidInput
from tests.cli_env import CliEnv


def _data(seed: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    p = gen.dirichlet(np.ones(k) * 0.5, size=n)
    u = gen.random(n)[:, None]
    y = (u > np.cumsum(p, axis=1)).sum(axis=1)  # y ~ p: the model is calibrated
    return p, np.minimum(y, k - 1)


@pytest.fixture
def acct() -> Any:
    a = Accountant(Ledger("sqlite://"))
    a.create_dataset("d", rho=10, allow_nonprivate=True)
    yield a
    a.ledger.close()


COLS = ["cat", "dog", "bird", "fish"]


def test_named_columns_with_integer_labels_are_matched_by_name_later(acct: Any) -> None:
    p, y = _data(0, 2000, 4)
    rel = acct.calibrate("split", dataset="d", probs=pd.DataFrame(p, columns=COLS), labels=y,
                         score="lac", alpha=0.1)
    assert rel.classes is None and rel.diagnostics["columns"] == COLS  # before: dropped
    pt, yt = _data(1, 20000, 4)
    good = rel.evaluate(pd.DataFrame(pt, columns=COLS), yt).coverage
    perm = ["dog", "cat", "fish", "bird"]
    moved = rel.evaluate(pd.DataFrame(pt, columns=COLS)[perm], yt).coverage
    assert moved == good and good >= 0.88  # before: 0.28 for the reordered frame
    np.testing.assert_array_equal(rel.predict_set(pd.DataFrame(pt, columns=COLS)[perm]),
                                  rel.predict_set(pt))
    # an array, or a frame with pandas' default columns, is taken by position as before
    assert rel.evaluate(pt, yt).coverage == good


def test_a_frame_numbered_out_of_order_is_refused_at_predict_too(acct: Any) -> None:
    p, y = _data(2, 1000, 3)
    rel = acct.calibrate("split", dataset="d", probs=p, labels=y, score="lac", alpha=0.1)
    assert rel.classes is None
    pt, yt = _data(3, 500, 3)
    frame = pd.DataFrame(pt)[[2, 0, 1]]
    with pytest.raises(InvalidInput, match="neither all class names nor pandas' default"):
        rel.evaluate(frame, yt)  # before: 0.30, read by position
    with pytest.raises(InvalidInput, match="neither all class names nor pandas' default"):
        rel.predict_set(frame)
    assert rel.evaluate(pd.DataFrame(pt), yt).coverage == rel.evaluate(pt, yt).coverage


def test_a_pyarrow_tables_names_are_read(acct: Any) -> None:
    p, y = _data(4, 2000, 3)
    names = COLS[:3]
    table = pa.table({c: p[:, j] for j, c in enumerate(names)})
    rel = acct.calibrate("split", dataset="d", probs=table,
                         labels=np.array(names, dtype=object)[y], score="lac", alpha=0.1)
    assert rel.classes == names  # before: the sorted labels bird, cat, dog
    pt, yt = _data(5, 20000, 3)
    moved = pa.table({c: pt[:, names.index(c)] for c in ["bird", "cat", "dog"]})
    cov = rel.evaluate(moved, yt).coverage
    assert cov == rel.evaluate(pt, yt).coverage and cov >= 0.88  # before: 0.29
    with pytest.raises(InvalidInput, match="has no column for the class 'dog'"):
        rel.predict_set(pa.table({"cat": pt[:, 0], "bird": pt[:, 2], "cow": pt[:, 1]}))


def test_integer_labels_of_number_named_classes_are_names_at_evaluate(acct: Any) -> None:
    p, y = _data(6, 2000, 3)
    cols = ["1", "2", "3"]
    rel = acct.calibrate("split", dataset="d", probs=pd.DataFrame(p, columns=cols),
                         labels=y + 1, score="lac", alpha=0.1)
    assert rel.classes == cols and rel.diagnostics["label_names"] is True
    pt, yt = _data(7, 20000, 3)
    as_text = rel.evaluate(pt, (yt + 1).astype(str)).coverage
    assert rel.evaluate(pt, yt + 1).coverage == as_text >= 0.88
    m = yt < 2  # only the classes named 1 and 2: before, read as columns 1 and 2 (0.295)
    assert rel.evaluate(pt[m], yt[m] + 1).coverage == rel.evaluate(
        pt[m], (yt[m] + 1).astype(str)).coverage
    with pytest.raises(InvalidInput, match="row 0 is '0', not one of the classes"):
        rel.evaluate(pt, np.where(np.arange(yt.size) == 0, 0, yt + 1))


def test_cli_header_names_recorded_and_headers_of_numbers_refused(tmp_path: Path) -> None:
    env = CliEnv(f"sqlite:///{tmp_path}/l.sqlite", tmp_path)
    env.json("dataset", "create", "d", "--rho", "5", "--allow-nonprivate")
    names = ["p0", "p1", "p2", "p3"]
    p, y = _data(8, 3000, 4)
    cal = pd.DataFrame(p, columns=names).assign(label=y)
    cal.to_csv(tmp_path / "cal.csv", index=False)
    pt, yt = _data(9, 20000, 4)
    test = pd.DataFrame(pt, columns=names).assign(label=yt)
    test.to_csv(tmp_path / "test.csv", index=False)
    test[["p1", "p0", "p3", "p2", "label"]].to_csv(tmp_path / "moved.csv", index=False)
    out = env.json("calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--score", "lac",
                   "--probs", env.f("cal.csv"), "--columns", "p0:p3", "--label-column", "label")
    rid = str(out["release"]["id"])
    assert out["release"]["diagnostics"]["columns"] == names  # before: none recorded
    assert "classes" not in out["release"]["diagnostics"]
    a = env.json("evaluate", "--release", rid, "--probs", env.f("test.csv"),
                 "--label-column", "label")["coverage"]
    b = env.json("evaluate", "--release", rid, "--probs", env.f("moved.csv"),
                 "--label-column", "label")["coverage"]
    assert a == b >= 0.88  # before: 0.31 for the reordered file

    # a release without names: a header 2,0,1 (behind pandas' index column) is refused
    np.save(tmp_path / "p.npy", p[:, :3] / p[:, :3].sum(axis=1, keepdims=True))
    np.save(tmp_path / "y.npy", np.minimum(y, 2))
    rid = str(env.json("calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--score",
                       "lac", "--probs", env.f("p.npy"), "--labels",
                       env.f("y.npy"))["release"]["id"])
    pd.DataFrame(pt[:5, :3])[[2, 0, 1]].to_csv(tmp_path / "idx.csv")  # header ",2,0,1"
    res = env.run("predict", "--release", rid, "--probs", env.f("idx.csv"))
    assert res.exit_code == 1 and res.stdout == ""
    assert "its columns are numbered 2, 0, 1, not 0 … k-1 in order" in res.stderr


@pytest.mark.parametrize(("content", "shown"), [
    ("1,0\n0.3,0.7\n0.6,0.4\n", "1,0"),  # to_csv of a binary frame's columns [1, 0]
    ("2,0,1\n0.2,0.3,0.5\n", "2,0,1"),
])
def test_a_header_of_column_numbers_is_not_read_as_data(tmp_path: Path, content: str,
                                                        shown: str) -> None:
    from privcal.data.files import load_array

    f = tmp_path / "x.csv"
    f.write_text(content)
    with pytest.raises(InvalidInput, match=f"its first row '{shown}' is what pandas writes"):
        load_array(str(f), "probs", matrix=content.count(",") > 0)


@pytest.mark.parametrize(("content", "want"), [
    ("1\n2\n3\n", [1, 2, 3]),  # integers: any may come first
    ("12\n13.5\n", [12, 13.5]),  # R's or %g's predictions (review R5: refused for a while)
    ("1\n0.53\n", [1, 0.53]),  # a header "1" is data too: it cannot be told (README)
    ("12\nA17\n", None),  # ids, read as text
    ("0.9,0.1\n0.5,0.5\n", [[0.9, 0.1], [0.5, 0.5]]),
    ("1,1\n0.5,0.5\n", [[1, 1], [0.5, 0.5]]),  # not each column number once
])
def test_other_number_first_rows_stay_data(tmp_path: Path, content: str, want: Any) -> None:
    from privcal.data.files import load_array

    f = tmp_path / "x.csv"
    f.write_text(content)
    if want is None:
        assert load_array(str(f), "ids", text=True).tolist() == ["12", "A17"]
    else:
        got = load_array(str(f), "x", matrix=isinstance(want[0], list))
        assert np.asarray(got).tolist() == want


def test_swapped_quantile_predictions_are_warned_about(acct: Any) -> None:
    """F8: lower and upper predictions swapped at predict gave 0.026 coverage (91 % empty
    intervals) without a word; a few crossed quantiles are normal and stay quiet."""
    gen = np.random.default_rng(11)
    x = gen.uniform(0, 1, 3000)
    y = x + gen.normal(0, 0.2, 3000)
    rel = acct.calibrate("split", dataset="d", alpha=0.1, score="cqr", lower_preds=x - 0.3,
                         upper_preds=x + 0.3, targets=y)
    with pytest.warns(UserWarning, match=r"100% of the rows have a lower prediction above "
                                         r"the upper one: are the lower and upper"):
        rel.predict_interval(lower_preds=x + 0.3, upper_preds=x - 0.3)
    crossed = np.where(np.arange(x.size) < 100, x - 0.4, x + 0.3)  # 100 of 3000 crossed
    assert int((x - 0.3 > crossed).sum()) == 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rel.predict_interval(lower_preds=x - 0.3, upper_preds=crossed)


def test_evaluate_tells_a_split_releases_catastrophic_shortfall_from_chance() -> None:
    """F10: 0.31 coverage against a split release's 0.9 at n = 3000 was "probability at most
    0.21 under it (Markov's inequality): weak evidence"; a split release's coverage is
    Beta(r, n+1−r), under which such a test result is ~0 — strong evidence (check the
    inputs). The figure is of the test result (red team 19, F5): the beta-binomial tail of
    the points covered."""
    from types import SimpleNamespace

    from scipy.stats import betabinom

    from privcal.calibrators.evaluation import coverage_check
    from privcal.cli.output import at_most
    from privcal.cli.render import guarantee_verdict

    def ev(m: int, covered: int, lower: float) -> Any:
        return SimpleNamespace(n=m, **coverage_check(covered, m, lower, True))

    split = SimpleNamespace(method="split", coverage=SimpleNamespace(rank=2701),
                            shape={"n": 3000})
    text = guarantee_verdict(ev(3000, 900, 2701 / 3001), 0.0, split)
    assert "Beta(2701, 300)" in text and "probability at most 0 " in text
    assert text.endswith("strong evidence against it: check the inputs (column order, "
                         "score, the data's distribution)")
    # a mild shortfall at a small n: the beta-binomial tail, smaller than Markov's, and weak
    small = SimpleNamespace(method="split", coverage=SimpleNamespace(rank=91),
                            shape={"n": 100})
    mild = ev(500, 430, 91 / 101)
    assert not mild.consistent_with_guarantee
    text = guarantee_verdict(mild, 0.0, small)
    want = betabinom.cdf(430, 500, 91, 10)
    assert 0.01 < want < (1 - 91 / 101) / (1 - mild.coverage_upper_95)
    # printed rounded up, as an upper bound (red team 19): 0.1147… is "at most 0.12"
    assert f"probability at most {at_most(want, '.2g')} " in text
    assert text.endswith("weak evidence against it")
    # another method keeps Markov's inequality
    other = SimpleNamespace(method="exponq", coverage=SimpleNamespace(rank=None),
                            shape={"n": 3000})
    assert "Markov's inequality" in guarantee_verdict(ev(3000, 900, 0.9), 0.0, other)


def test_index_labels_of_classes_given_by_name_stay_indices_at_evaluate(acct: Any) -> None:
    """Review R2: with ``classes=["1","2","3"]`` given for an array and index labels 0..2
    (indices, as the README says), evaluate read integer labels as names: 0.30 reported on
    the rows labelled 1 and 2 for a true 0.90, all labels refused."""
    p, y = _data(12, 2000, 3)
    rel = acct.calibrate("split", dataset="d", probs=p, labels=y, classes=["1", "2", "3"],
                         score="lac", alpha=0.1)
    assert rel.classes == ["1", "2", "3"] and "label_names" not in rel.diagnostics
    pt, yt = _data(13, 20000, 3)
    truth = float(rel.predict_set(pt)[np.arange(yt.size), yt].mean())
    assert rel.evaluate(pt, yt).coverage == truth >= 0.88
    m = yt > 0
    assert rel.evaluate(pt[m], yt[m]).coverage == float(
        rel.predict_set(pt[m])[np.arange(int(m.sum())), yt[m]].mean())
    assert rel.evaluate(pt, np.array(["1", "2", "3"], dtype=object)[yt]).coverage == truth


def test_a_model_whose_classes_are_the_indices_matches_a_release_of_named_columns(
        acct: Any) -> None:
    """Review R3: a release calibrated on columns p0, p1, p2 with index labels recorded the
    names as its classes for a while, so ``from_release`` refused the very model (classes_
    0, 1, 2) that made the columns, and sets printed p1 instead of 1."""
    from privcal.estimators import PrivateConformalClassifier
    from tests.test_estimators import SoftmaxModel

    x = np.random.default_rng(14).normal(size=2000)
    model = SoftmaxModel([0, 1, 2])
    probs = model.predict_proba(x)
    y = (np.random.default_rng(15).random(2000)[:, None] > np.cumsum(probs, axis=1)).sum(1)
    rel = acct.calibrate("split", dataset="d", probs=pd.DataFrame(probs, columns=["p0", "p1",
                                                                                   "p2"]),
                         labels=np.minimum(y, 2), score="lac", alpha=0.1)
    clf = PrivateConformalClassifier.from_release(model, rel)
    np.testing.assert_array_equal(clf.predict_set(x[:50])[1][:, :, 0],  # MAPIE: n × k × levels
                                  rel.predict_set(probs[:50]))
    assert all(isinstance(c, int) for s in rel.predict_labels(probs[:50]) for c in s)


def test_a_saved_release_with_bad_column_names_is_refused(acct: Any) -> None:
    """The recorded column names decide how predict reads a table: a saved file whose names
    are not one per column, distinct text — or that names both columns and classes — is
    refused on load."""
    import json

    from privcal import Release

    p, y = _data(16, 500, 4)
    rel = acct.calibrate("split", dataset="d", probs=pd.DataFrame(p, columns=COLS), labels=y,
                         score="lac", alpha=0.1)
    assert Release.load(rel.model_dump_json()) == rel
    for names, match in ((COLS[:3], "diagnostics.columns names 3 columns, but the release "
                                    "was calibrated on k = 4"),
                         (["cat", "cat", "dog", "fish"], "diagnostics.columns names a column "
                                                         "twice"),
                         ([1, 2, 3, 4], "diagnostics.columns is not a list of column names")):
        doc = json.loads(rel.model_dump_json())
        doc["diagnostics"]["columns"] = names
        with pytest.raises(InvalidInput, match=match):
            Release.load(json.dumps(doc))
    doc = json.loads(rel.model_dump_json())
    doc["diagnostics"]["classes"] = COLS
    with pytest.raises(InvalidInput, match=r"diagnostics\.columns and diagnostics\.classes"):
        Release.load(json.dumps(doc))
