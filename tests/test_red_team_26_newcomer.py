"""Red team 26, newcomer: a hospital ML engineer following the README with files as
their tools write them (Excel's semicolons, R's ``NA``, labels in the probability table)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from privcal.calibrators.validation import id_strings
from privcal.cli import main
from privcal.data.files import load_array, load_reports
from privcal.errors import InvalidInput


def _run(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


def _charges(url: str, dataset: str) -> int:
    return int(json.loads(_run(url, "budget", "show", dataset, "--json").stdout)["charges"])


def _local_dataset(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    res = _run(url, "dataset", "create", "app", "--epsilon", "1", "--subject-epsilon", "6")
    assert res.exit_code == 0, res.output
    return url


def _simulate(url: str, scores: str, subjects: str) -> Any:
    return _run(url, "calibrate", "ldp-score", "--simulate", "--dataset", "app", "--alpha",
                "0.1", "--epsilon", "2", "--scores", scores, "--subjects", subjects)


# ------------------------------------------------------------------ F1
@pytest.mark.parametrize("sep", [";", "\t"])
def test_f1_a_semicolon_or_tab_separated_id_file_is_refused(tmp_path: Path, sep: str) -> None:
    """Read with ',', each line of ``to_csv(sep=';')`` (Excel's separator in most European
    locales) was one id "ROW;ID": the same 400 people in four row orders were four times
    400 new subjects, each person charged 4 × ε0 = 8 past the cap 6 while the ledger said 0
    for them. Now the file is refused in one line and nothing is charged."""
    url = _local_dataset(tmp_path)
    rng = np.random.default_rng(0)
    n = 400
    people = np.array([f"s{i}" for i in range(n)])
    scores = rng.uniform(0, 1, n)
    for run in range(4):
        perm = rng.permutation(n)
        ids = tmp_path / f"ids{run}.csv"
        pd.DataFrame({"subject": people[perm]}).to_csv(ids, sep=sep)
        np.save(tmp_path / f"s{run}.npy", scores[perm])
        res = _simulate(url, str(tmp_path / f"s{run}.npy"), str(ids))
        assert res.exit_code == 1, res.output
        what = "a semicolon" if sep == ";" else "a tab"
        assert f"is one field holding {what}: privcal reads comma-separated" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
        with pytest.raises(InvalidInput, match="comma-separated"):
            load_array(str(ids), "subjects", ids=True)
    assert _charges(url, "app") == 0
    # the same people in a comma-separated file are charged as themselves
    pd.DataFrame({"subject": people}).to_csv(tmp_path / "ok.csv")
    np.save(tmp_path / "ok.npy", scores)
    assert _simulate(url, str(tmp_path / "ok.npy"), str(tmp_path / "ok.csv")).exit_code == 0
    spent = _run(url, "budget", "show", "app", "--subject", "s5", "--json")
    assert json.loads(spent.stdout)["subject"] == {"id": "s5", "spent": "2"}, spent.stdout


# ------------------------------------------------------------------ F2
@pytest.mark.parametrize("missing", ["NA", "#N/A", "NULL", "nan", "<NA>"])
def test_f2_an_id_written_as_a_missing_value_is_refused(tmp_path: Path, missing: str) -> None:
    """R's write.csv writes a missing id as NA (Excel #N/A, SQL exports NULL): each was read
    as the id "NA", one subject for every patient without an id (one row used, the others
    dropped as duplicates, charged to no person). The README says missing ids are refused."""
    url = _local_dataset(tmp_path)
    n = 400
    ids = [f'"p{i}"' for i in range(n)]
    ids[7] = ids[300] = missing
    f = tmp_path / "ids.csv"
    f.write_text('"subject"\n' + "\n".join(ids) + "\n")
    np.save(tmp_path / "s.npy", np.random.default_rng(1).uniform(0, 1, n))
    res = _simulate(url, str(tmp_path / "s.npy"), str(f))
    assert res.exit_code == 1, res.output
    assert res.stderr.strip() == (f"error: {f}: subjects: row 7 is {missing!r}, a missing value "
                                  "as R, Excel or pandas write one; every row needs its "
                                  "subject's id")
    assert _charges(url, "app") == 0
    # a session batch too; a group named NA stays a group (no person is charged by it)
    (tmp_path / "r.csv").write_text(f"subject,bit,round\na,1,0\n{missing},0,0\n")
    with pytest.raises(InvalidInput, match=r"row 1 is .* a missing value"):
        load_reports(str(tmp_path / "r.csv"), "subject", "bit")
    assert load_array(str(f), "groups", ids=True)[7] == missing
    # and wherever ids come from: str() of a missing id (None, NaN) in the Python API
    for gone in (None, float("nan")):
        with pytest.raises(InvalidInput, match=f"row 1 is '{gone}', a missing value"):
            id_strings(np.array(["p0", str(gone), "p2"]), "subjects", people=True)


# ------------------------------------------------------------------ F3
def _ledger_and_table(tmp_path: Path, seed: int) -> tuple[str, pd.DataFrame]:
    """A ledger with dataset ``d`` (non-private runs allowed) and a model's table: ten
    probability columns p0..p9 and a ``label`` column drawn from them, 500 rows."""
    url = f"sqlite:///{tmp_path}/l.sqlite"
    assert _run(url, "dataset", "create", "d", "--rho", "5",
                "--allow-nonprivate").exit_code == 0
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(10), size=500)
    df = pd.DataFrame(p, columns=[f"p{i}" for i in range(10)])
    df["label"] = [rng.choice(10, p=r) for r in p]
    return url, df


def test_f3_labels_given_as_a_column_of_the_probs_table(tmp_path: Path) -> None:
    """``--labels calib.csv:label`` with ``--probs calib.csv`` read the label column as an
    11th probability column: "row 0 sums to 6 … for 11 classes". It is now the same run as
    ``--label-column label`` (a deterministic split threshold, compared exactly)."""
    url, df = _ledger_and_table(tmp_path, 2)
    for suffix in (".csv", ".parquet"):
        t = tmp_path / f"calib{suffix}"
        df.to_csv(t) if suffix == ".csv" else df.to_parquet(t)
        base = ("calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--score", "lac",
                "--probs", str(t), "--json")
        a = _run(url, *base, "--labels", f"{t}:label")
        assert a.exit_code == 0, a.output
        b = _run(url, *base, "--label-column", "label")
        ra, rb = json.loads(a.stdout)["release"], json.loads(b.stdout)["release"]
        assert ra["threshold"] == rb["threshold"] and ra["shape"] == rb["shape"]
        ev = _run(url, "evaluate", "--release", str(ra["id"]), "--probs", str(t),
                  "--labels", f"{t}:label", "--json")
        assert ev.exit_code == 0, ev.output
        assert json.loads(ev.stdout)["n"] == 500


# ------------------------------------------------------------------ F4
@pytest.mark.parametrize("item", ["lam", "=0"])
def test_f4_a_malformed_score_option_is_a_usage_error(tmp_path: Path, item: str) -> None:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    assert _run(url, "dataset", "create", "d", "--rho", "5").exit_code == 0
    rng = np.random.default_rng(3)
    np.save(tmp_path / "p.npy", rng.dirichlet(np.ones(3), size=500))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 500))
    res = _run(url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
               "--probs", str(tmp_path / "p.npy"), "--labels", str(tmp_path / "y.npy"),
               "--score", "raps", "--score-option", item)
    assert res.exit_code == 2, res.output
    assert f"Invalid value for '--score-option': takes KEY=VALUE, got {item!r}" in res.stderr
    res = _run(url, "session", "open", "ldp-score", "--dataset", "d", "--alpha", "0.1",
               "--epsilon", "2", "--rounds", "4", "--group-size", "50", "--score", "raps",
               "--score-option", item)
    assert res.exit_code == 2, res.output
    assert _charges(url, "d") == 0


# ------------------------------------------------------------------ F7
def test_f7_label_column_of_a_probs_table_given_with_its_column_range(tmp_path: Path) -> None:
    """``--probs calib.csv:p0:p9 --label-column label`` (the README's FILE:FIRST:LAST with the
    help's "the labels' column … of the --probs table") was refused: "give the label column
    once". It is now the run ``--probs calib.csv --columns p0:p9 --label-column label``
    makes (a deterministic split threshold, compared exactly)."""
    url, df = _ledger_and_table(tmp_path, 4)
    df["site"] = "north"
    t = tmp_path / "calib.csv"
    df.to_csv(t)
    base = ("calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--score", "lac", "--json")
    a = _run(url, *base, "--probs", f"{t}:p0:p9", "--label-column", "label")
    assert a.exit_code == 0, a.output
    b = _run(url, *base, "--probs", str(t), "--columns", "p0:p9", "--label-column", "label")
    ra, rb = json.loads(a.stdout)["release"], json.loads(b.stdout)["release"]
    assert ra["threshold"] == rb["threshold"] and ra["shape"] == rb["shape"]
    ev = _run(url, "evaluate", "--release", str(ra["id"]), "--probs", f"{t}:p0:p9",
              "--label-column", "label", "--json")
    assert ev.exit_code == 0, ev.output
    assert json.loads(ev.stdout)["n"] == 500
    # a label column given twice is still refused
    res = _run(url, *base, "--probs", f"{t}:p0:p9", "--labels", f"{t}:label",
               "--label-column", "label")
    assert res.exit_code == 1 and "give the label column once" in res.stderr


# ------------------------------------------------------------------ F5
def test_f5_a_class_name_a_spreadsheet_runs_as_a_formula_is_not_written_to_csv(
        tmp_path: Path) -> None:
    """``predict --out sets.csv`` wrote the release's class names as the CSV header: a class
    ``=HYPERLINK(…)`` recorded by another analyst ran as a formula in the spreadsheet of
    whoever opened the sets. Now refused for .csv (nothing written); .parquet still works,
    and numbers such as ``-1`` stay plain names."""
    url = f"sqlite:///{tmp_path}/l.sqlite"
    assert _run(url, "dataset", "create", "d", "--rho", "5",
                "--allow-nonprivate").exit_code == 0
    rng = np.random.default_rng(5)
    np.save(tmp_path / "p.npy", rng.dirichlet(np.ones(2), size=300))
    np.save(tmp_path / "y.npy", rng.integers(0, 2, 300))
    for classes, ok in (("=HYPERLINK(\"http://x\"),b", False), ("@SUM(A1),b", False),
                        ("-1,+1", True)):
        res = _run(url, "calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--score",
                   "lac", "--probs", str(tmp_path / "p.npy"), "--labels",
                   str(tmp_path / "y.npy"), "--classes", classes, "--json")
        assert res.exit_code == 0, res.output
        rid = str(json.loads(res.stdout)["release"]["id"])
        out = tmp_path / f"sets{rid}.csv"
        res = _run(url, "predict", "--release", rid, "--probs", str(tmp_path / "p.npy"),
                   "--out", str(out))
        if ok:
            assert res.exit_code == 0 and out.read_text().startswith('"-1","+1","size"')
            continue
        assert res.exit_code == 1 and "would run its header as a formula" in res.stderr
        assert not out.exists()
        assert _run(url, "predict", "--release", rid, "--probs", str(tmp_path / "p.npy"),
                    "--out", str(tmp_path / f"sets{rid}.parquet")).exit_code == 0
