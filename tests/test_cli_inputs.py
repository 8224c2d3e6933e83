"""Issue 15: inputs as users have them, through the CLI — a CSV with a header, ten probability
columns and a label column (with and without pandas' index), parquet, ids as text, and
``predict --out`` in .csv and .parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from privcal.cli import main

K = 10


def run(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, [*args, "--db-url", url], catch_exceptions=False)


def ok(url: str, *args: str) -> Any:
    res = run(url, *args, "--json")
    assert res.exit_code == 0, (args, res.stdout, res.stderr)
    return json.loads(res.stdout)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[str, Path, np.ndarray, np.ndarray]:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    ok(url, "dataset", "create", "d", "--rho", "10")
    gen = np.random.default_rng(3)
    probs = gen.dirichlet(np.ones(K) * 0.3, size=400)
    labels = np.array([gen.choice(K, p=p) for p in probs])
    head = ",".join([""] + [f"p{j}" for j in range(K)] + ["label"])
    rows = [",".join([str(i)] + [repr(float(v)) for v in p] + [str(y)])
            for i, (p, y) in enumerate(zip(probs, labels, strict=True))]
    (tmp_path / "calib.csv").write_text(head + "\n" + "\n".join(rows) + "\n")
    return url, tmp_path, probs, labels


def test_csv_with_columns_and_label_column(setup: Any) -> None:
    url, tmp, probs, labels = setup
    f = str(tmp / "calib.csv")
    ok(url, "dataset", "create", "open", "--rho", "1", "--allow-nonprivate")
    base = ["calibrate", "split", "--dataset", "open", "--alpha", "0.1", "--score", "lac"]
    a = ok(url, *base, "--probs", f, "--columns", "p0:p9", "--label-column", "label")
    b = ok(url, *base, "--probs", f, "--label-column", "label")  # every other column
    c = ok(url, *base, "--probs", f"{f}:p0:p9", "--labels", f"{f}:label")
    np.save(tmp / "p.npy", probs)
    np.save(tmp / "y.npy", labels)
    d = ok(url, *base, "--probs", str(tmp / "p.npy"), "--labels", str(tmp / "y.npy"))
    thresholds = {r["release"]["threshold"] for r in (a, b, c, d)}
    assert len(thresholds) == 1  # the same data, read four ways
    assert a["release"]["shape"]["n"] == 400
    res = run(url, *base, "--probs", f, "--columns", "p0:p8", "--label-column", "label")
    assert res.exit_code == 1 and "error:" in res.stderr  # labels up to 9 but k = 9
    res = run(url, *base, "--probs", f, "--columns", "p0:q9", "--label-column", "label")
    assert res.exit_code == 1 and "no column 'q9'" in res.stderr


def test_predict_writes_csv_and_parquet(setup: Any) -> None:
    url, tmp, _, _ = setup
    f = str(tmp / "calib.csv")
    rel = ok(url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "1",
             "--probs", f, "--label-column", "label", "--score", "lac")["release"]
    ref = ok(url, "predict", "--release", str(rel["id"]), "--probs", f, "--columns", "p0:p9")
    want = np.zeros((400, K), dtype=bool)
    for i, s in enumerate(ref["sets"]):
        want[i, s] = True
    for suffix in ("csv", "parquet"):
        out = tmp / f"sets.{suffix}"
        res = run(url, "predict", "--release", str(rel["id"]), "--probs", f, "--columns",
                  "p0:p9", "--out", str(out))
        assert res.exit_code == 0, res.stderr
        tab = pcsv.read_csv(out) if suffix == "csv" else pq.read_table(out)
        assert tab.column_names == [str(j) for j in range(K)] + ["size"]
        got = np.column_stack([tab.column(str(j)).to_numpy() for j in range(K)]).astype(bool)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(tab.column("size").to_numpy(), want.sum(axis=1))


def test_subjects_keep_their_spelling(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    ok(url, "dataset", "create", "u", "--epsilon", "1", "--subject-epsilon", "4")
    gen = np.random.default_rng(0)
    n = 202
    probs = gen.dirichlet(np.ones(K), size=n)
    np.save(tmp_path / "p.npy", probs)
    np.save(tmp_path / "y.npy", gen.integers(0, K, n))
    ids = [str(2**63 - 1 - i) for i in range(200)] + ["000007", "7"]
    (tmp_path / "ids.csv").write_text("subject\n" + "\n".join(ids) + "\n")
    out = ok(url, "calibrate", "ldp-label", "--dataset", "u", "--alpha", "0.1", "--epsilon", "2",
             "--k", str(K), "--probs", str(tmp_path / "p.npy"), "--labels",
             str(tmp_path / "y.npy"), "--subjects", str(tmp_path / "ids.csv"))
    assert out["release"]["shape"]["n"] == n  # 202 distinct subjects, none merged
    s = ok(url, "budget", "show", "--dataset", "u", "--subjects")["subject_summary"]
    assert s["subjects"] == n
    for sid in ("000007", "7"):
        assert ok(url, "budget", "show", "--dataset", "u", "--subject", sid)["subject"][
            "spent"] == "2"
