"""Red team 25, newcomer: a hospital ML engineer following the README from a fresh clone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from click.testing import CliRunner

from privcal import Accountant, Ledger
from privcal.cli import main
from privcal.data.files import load_array
from privcal.errors import InvalidInput


def _run(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


def _charges(url: str, dataset: str) -> int:
    return int(json.loads(_run(url, "budget", "show", dataset, "--json").stdout)["charges"])


def _one_column(path: Path, name: str, values: list[Any]) -> str:
    """A one-column CSV as pyarrow (also polars, Excel) writes it: a missing value is an
    empty line."""
    pcsv.write_csv(pa.table({name: values}), path)
    return str(path)


# ------------------------------------------------------------------ F1
def test_f1_a_missing_value_in_a_one_column_csv_is_not_skipped(tmp_path: Path) -> None:
    """pyarrow's reader skipped every empty line, so the missing value vanished: a scores
    file lost a row, and two one-column files (predictions, targets) with a gap each were
    paired row i with row i+1 between the gaps — calibrated and recorded, silently."""
    f = _one_column(tmp_path / "s.csv", "score", [0.5, 0.25, None, 0.75])
    assert (tmp_path / "s.csv").read_text().splitlines()[3] == ""  # how it is written
    got = load_array(f, "scores")
    assert got.shape == (4,) and np.isnan(got[2]) and got[3] == 0.75
    ids = _one_column(tmp_path / "ids.csv", "subject", ["a", None, "c"])
    with pytest.raises(InvalidInput, match="row 1 is an empty id"):
        load_array(ids, "subjects", ids=True)
    # a headerless file too; blank lines before the first row are still skipped, and a
    # multi-column file's blank line is still no row
    (tmp_path / "n.csv").write_text("\n\n0.1\n0.2\n\n0.3\n")
    assert np.isnan(load_array(str(tmp_path / "n.csv"), "scores")).tolist() == [
        False, False, True, False]
    (tmp_path / "m.csv").write_text("a,b\n0.1,0.9\n\n0.7,0.3\n")
    assert load_array(str(tmp_path / "m.csv"), "probs", matrix=True).shape == (2, 2)


def test_f1_cli_refuses_misaligned_one_column_files_and_charges_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    assert _run(url, "dataset", "create", "np", "--rho", "5",
                "--allow-nonprivate").exit_code == 0
    rng = np.random.default_rng(0)
    f = rng.uniform(0, 2, 300)
    y = f + rng.normal(0, 0.3, 300)
    fl: list[Any] = f.tolist()
    yl: list[Any] = y.tolist()
    fl[30], yl[200] = None, None
    preds = _one_column(tmp_path / "p.csv", "pred", fl)
    targets = _one_column(tmp_path / "t.csv", "y", yl)
    res = _run(url, "calibrate", "split", "--dataset", "np", "--alpha", "0.1", "--preds",
               preds, "--targets", targets, "--score", "absolute")
    assert res.exit_code == 1, res.output
    assert res.stderr.strip() == "error: predictions: row 30 is nan (must be a finite number)"
    assert _charges(url, "np") == 0
    # predict on one-column predictions with a gap: refused, not one interval short
    np.save(tmp_path / "p.npy", f)
    np.save(tmp_path / "t.npy", y)
    assert _run(url, "calibrate", "split", "--dataset", "np", "--alpha", "0.1", "--preds",
                str(tmp_path / "p.npy"), "--targets", str(tmp_path / "t.npy"),
                "--score", "absolute").exit_code == 0
    res = _run(url, "predict", "--release", "1", "--preds", preds, "--out",
               str(tmp_path / "iv.csv"))
    assert res.exit_code == 1 and "row 30 is nan" in res.stderr, res.output
    assert not (tmp_path / "iv.csv").exists()


# ------------------------------------------------------------------ F2
def test_f2_sets_from_a_regression_release_say_it_gives_intervals(tmp_path: Path) -> None:
    """``predict --probs`` on a release calibrated with ``--score absolute`` said only
    "score 'absolute' is a regression score; it has no per-class scores"."""
    url = f"sqlite:///{tmp_path}/l.sqlite"
    acct = Accountant(Ledger(url))
    acct.create_dataset("h", rho=1, allow_nonprivate=True)
    rng = np.random.default_rng(1)
    f = rng.uniform(0, 1, 200)
    rel = acct.calibrate("split", dataset="h", preds=f, targets=f + rng.normal(0, 0.1, 200),
                         score="absolute", alpha=0.1)
    probs = rng.dirichlet(np.ones(3), 5)
    np.save(tmp_path / "p.npy", probs)
    want = (f"release {rel.id} was calibrated on the regression score 'absolute': it gives "
            "intervals (--preds, or --lower-preds and --upper-preds), not prediction sets "
            "(--probs)")
    with pytest.raises(InvalidInput) as err:
        rel.predict_set(probs)
    assert str(err.value) == want
    for args in (("predict", "--release", str(rel.id), "--probs", str(tmp_path / "p.npy")),
                 ("evaluate", "--release", str(rel.id), "--probs", str(tmp_path / "p.npy"),
                  "--labels", str(tmp_path / "y.npy"))):
        np.save(tmp_path / "y.npy", np.zeros(5, dtype=int))
        res = _run(url, *args)
        assert res.exit_code == 1 and res.stderr.strip() == f"error: {want}", res.output
    acct.close()


# ------------------------------------------------------------------ F4
@pytest.mark.parametrize("value", ["a,b", "0,b", "0", "0,1,2", "0,1_0", ""])
def test_f4_a_malformed_score_range_is_a_usage_error(tmp_path: Path, value: str) -> None:
    """The README: "a malformed number is a usage error, exit 2" — ``--upper x`` was, and
    ``--score-range a,b`` was exit 1."""
    url = f"sqlite:///{tmp_path}/l.sqlite"
    assert _run(url, "dataset", "create", "d", "--rho", "1").exit_code == 0
    np.save(tmp_path / "s.npy", np.random.default_rng(2).random(100))
    res = _run(url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
               "--scores", str(tmp_path / "s.npy"), f"--score-range={value}", "--json")
    assert res.exit_code == 2, res.output
    err = json.loads(res.stdout)["error"]
    assert err["exit_code"] == 2 and "takes two plain numbers LO,HI" in err["message"]
    assert _charges(url, "d") == 0
    # a range out of order is bad input, as before
    res = _run(url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
               "--scores", str(tmp_path / "s.npy"), "--score-range", "4,0")
    assert res.exit_code == 1 and "lo < hi" in res.stderr


@pytest.mark.parametrize("orders", ["2,x", "2_0", "2,４"])
def test_f4_a_malformed_renyi_order_is_a_usage_error(tmp_path: Path, orders: str) -> None:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    res = _run(url, "dataset", "create", "d", "--approx-epsilon", "1", "--approx-delta",
               "1e-6", "--renyi-orders", orders)
    assert res.exit_code == 2, res.output
    assert "a Rényi order must be a number (plain, no '_')" in res.stderr
    assert not (tmp_path / "l.sqlite").exists()  # nothing created
    res = _run(url, "dataset", "create", "d", "--approx-epsilon", "1", "--approx-delta",
               "1e-6", "--renyi-orders", "0.5,2")
    assert res.exit_code == 1 and "(1, 1e6]" in res.stderr


# ------------------------------------------------------------------ F3
def test_f3_a_yes_no_model_is_evaluated_on_its_own_bool_labels() -> None:
    """A model fitted on a bool outcome has ``classes_ = [False, True]``; the wrapper records
    them as the names "False", "True" and calibrates on its bool labels, but
    ``release_.evaluate(probs, y_bool)`` said "labels must be numeric, got dtype bool"."""
    from privcal import PrivateConformalClassifier

    class YesNo:
        classes_ = np.array([False, True])

        def predict_proba(self, X: Any) -> np.ndarray:
            p = 1 / (1 + np.exp(-np.asarray(X, dtype=float)))
            return np.column_stack([1 - p, p])

    acct = Accountant(Ledger("sqlite://"))
    acct.create_dataset("c", rho=2, allow_nonprivate=True)
    rng = np.random.default_rng(3)
    X = rng.normal(size=1500)
    y = (X + rng.normal(size=1500)) > 0
    clf = PrivateConformalClassifier(YesNo(), method="split", confidence_level=0.9,
                                     accountant=acct, dataset="c").conformalize(X[:1000], y[:1000])
    assert clf.release_.classes == ["False", "True"]
    probs = YesNo().predict_proba(X[1000:])
    by_bool = clf.release_.evaluate(probs, y[1000:])
    by_name = clf.release_.evaluate(probs, np.where(y[1000:], "True", "False"))
    assert by_bool.coverage == by_name.coverage and by_bool.n == 500
    # bool labels are never read as column indices: against other names, refused by row
    rel = acct.calibrate("split", dataset="c", probs=probs, labels=y[1000:].astype(int),
                         classes=["0", "1"], score="lac", alpha=0.1)
    with pytest.raises(InvalidInput, match=r"row 0 is '(True|False)', not one of the classes"):
        rel.evaluate(probs, y[1000:])
    acct.close()
