"""String class labels (issue 15, "Inputs as users have them"): calibrate from probabilities
and class-name labels through the API and the CLI; the release records the class names in
probability-column order, ``predict`` returns them, and a label outside the classes is refused
with nothing charged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal import Accountant
from privcal.cli import main
from privcal.errors import AuditFailed, InvalidInput
from tests.seeded import Seeded

NAMES = ["cat", "dog", "bird"]  # column order: deliberately not sorted


def _data(n: int = 600, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(3) * 2, n)
    y = np.array([rng.choice(3, p=p) for p in probs])
    return probs, y


def _state(acct: Accountant) -> tuple[Any, ...]:
    b = acct.budget("d")
    return b.spent, b.charges, len(acct.releases("d")), acct.ledger.head()


def test_string_labels_api_end_to_end(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, delta=1e-6)
    probs, y = _data()
    names = np.array(NAMES)[y]  # numpy str array
    a = accountant.calibrate("pcoqs", dataset="d", probs=probs, labels=names, score="lac",
                             classes=NAMES, alpha=0.1, rho=0.2, rng=Seeded(4))
    b = accountant.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac",
                             alpha=0.1, rho=0.2, rng=Seeded(4))
    # names map to the columns they name: the same data, the same release
    assert a.threshold == b.threshold
    assert a.classes == NAMES and b.classes is None
    assert accountant.release(a.id).classes == NAMES  # stored, not only in memory
    sets = a.predict_set(probs[:20])
    assert sets.dtype == bool and sets.shape == (20, 3)
    named = a.predict_labels(probs[:20])
    assert named == [[NAMES[j] for j in np.flatnonzero(r)] for r in sets]
    assert b.predict_labels(probs[:20]) == [np.flatnonzero(r).tolist() for r in sets]
    ev_names = a.evaluate(probs, list(names))
    ev_ints = a.evaluate(probs, y)
    assert ev_names == ev_ints and 0 < ev_names.coverage <= 1
    with pytest.raises(InvalidInput, match="records none"):
        b.evaluate(probs, names)
    with pytest.raises(InvalidInput, match="'cow', not one of the classes"):
        a.evaluate(probs[:3], ["cat", "cow", "dog"])


def test_sorted_names_fallback_only_when_all_classes_appear(accountant: Accountant) -> None:
    # a non-private method only: a private one never reads its class names from the labels
    # (tests/test_red_team_5_runs.py)
    accountant.create_dataset("d", rho=1, delta=1e-6, allow_nonprivate=True)
    probs, y = _data()
    labels = np.array(["a", "b", "c"], dtype=object)[y]
    rel = accountant.calibrate("split", dataset="d", probs=probs, labels=labels, score="lac",
                               alpha=0.1, rng=Seeded(1))
    assert rel.classes == ["a", "b", "c"]
    before = _state(accountant)
    two = np.where(y == 2, "a", labels)  # only 2 of the 3 classes appear: no safe guess
    with pytest.raises(InvalidInput, match="2 distinct names appear for 3 probability columns"):
        accountant.calibrate("split", dataset="d", probs=probs, labels=two, score="lac",
                             alpha=0.1)
    assert _state(accountant) == before


@pytest.mark.parametrize("bad, message", [
    (["cat", "dog", "cow"], "row 2 is 'cow', not one of the classes"),
    (["cat", 1, "dog"], "row 1 is 1, not a class name"),
])
def test_wrong_label_refused_nothing_charged(accountant: Accountant, bad: list[Any],
                                             message: str) -> None:
    accountant.create_dataset("d", rho=1, delta=1e-6)
    probs, y = _data()
    labels = list(np.array(NAMES)[y])
    labels[: len(bad)] = bad
    before = _state(accountant)
    for method, extra in (("pcoqs", {"score": "lac", "rho": 0.2}),
                          ("ldp-label", {"epsilon": 2, "k": 3})):
        with pytest.raises(InvalidInput, match=message):
            accountant.calibrate(method, dataset="d", probs=probs, labels=labels,
                                 classes=NAMES, alpha=0.1, **extra)
    assert _state(accountant) == before


@pytest.mark.parametrize("classes, message", [
    (["cat", "dog"], "2 class names given, but the probabilities have 3 columns"),
    (["cat", "dog", "cat"], "'cat' is named twice"),
    ("cat,dog,bird", "classes must be a list"),
])
def test_bad_classes_refused(accountant: Accountant, classes: Any, message: str) -> None:
    accountant.create_dataset("d", rho=1, delta=1e-6)
    probs, y = _data()
    with pytest.raises(InvalidInput, match=message):
        accountant.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac",
                             classes=classes, alpha=0.1, rho=0.2)
    assert accountant.budget("d").charges == 0


def test_class_names_survive_audit_verify(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, delta=1e-6, subject_epsilon=10)
    probs, y = _data()
    names = np.array(NAMES)[y]
    a = accountant.calibrate("pcoqs", dataset="d", probs=probs, labels=names, score="lac",
                             classes=NAMES, alpha=0.1, rho=0.2, rng=Seeded(2))
    accountant.calibrate("ldp-label", dataset="d", probs=probs, labels=names, classes=NAMES,
                         alpha=0.1, epsilon=2, k=3, rng=Seeded(2),
                         subjects=[f"u{i}" for i in range(len(names))])
    report = accountant.verify()
    assert report.releases == 2
    # the names are part of the recorded release document: swapping two in the database
    # (a silent relabelling of every prediction set) is caught by the audit
    swapped = json.dumps({**a.diagnostics, "classes": ["dog", "cat", "bird"]})
    cast = "CAST(:v AS JSON)" if accountant.ledger.backend == "postgresql" else ":v"
    with accountant.ledger.engine.begin() as conn:
        conn.execute(text(f"UPDATE releases SET diagnostics = {cast} WHERE id = :i"),
                     {"v": swapped, "i": a.id})
    with pytest.raises(AuditFailed):
        accountant.verify()


# ------------------------------------------------------------------------------------ CLI
def _run(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


def _json(url: str, *args: str) -> Any:
    res = _run(url, *args, "--json")
    assert res.exit_code == 0, (args, res.stdout, res.stderr)
    return json.loads(res.stdout)


def _cli_state(url: str) -> tuple[Any, ...]:
    return (_json(url, "audit", "head")["head"], len(_json(url, "release", "list")),
            json.dumps(_json(url, "budget", "show", "d")["spent"], sort_keys=True))


def test_string_labels_cli_end_to_end(ledger_url: str, tmp_path: Path) -> None:
    url = ledger_url
    assert _run(url, "db", "upgrade").exit_code == 0
    assert _run(url, "dataset", "create", "d", "--rho", "5").exit_code == 0
    probs, y = _data()
    table = {**{c: probs[:, j] for j, c in enumerate(NAMES)}, "label": np.array(NAMES)[y]}
    pcsv.write_csv(pa.table(table), tmp_path / "calib.csv")
    np.save(tmp_path / "p.npy", probs)
    pcsv.write_csv(pa.table({"y": np.array(NAMES)[y]}), tmp_path / "y.csv")
    # the class names are the --probs table's column names
    rel = _json(url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.2",
                "--probs", str(tmp_path / "calib.csv"), "--columns", "cat:bird",
                "--label-column", "label", "--score", "lac")["release"]
    assert rel["diagnostics"]["classes"] == NAMES
    # or given with --classes for an array without names; the same data, the same names
    rel2 = _json(url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.2",
                 "--probs", str(tmp_path / "p.npy"), "--labels", str(tmp_path / "y.csv"),
                 "--classes", "cat,dog,bird", "--score", "lac")["release"]
    assert rel2["diagnostics"]["classes"] == NAMES
    doc = _json(url, "predict", "--release", str(rel["id"]), "--probs", str(tmp_path / "p.npy"))
    assert doc["classes"] == NAMES
    sets = np.load(tmp_path / "p.npy")  # the sets, recomputed by the library
    from privcal.calibrators.prediction_sets import sets_for

    mat = sets_for(rel["diagnostics"]["score"], rel["threshold"], sets)
    assert doc["sets"] == [[NAMES[j] for j in np.flatnonzero(r)] for r in mat]
    for out in ("s.csv", "s.parquet"):
        assert _run(url, "predict", "--release", str(rel["id"]), "--probs",
                    str(tmp_path / "p.npy"), "--out", str(tmp_path / out)).exit_code == 0
    got_csv = pcsv.read_csv(tmp_path / "s.csv")
    got_pq = pq.read_table(tmp_path / "s.parquet")
    for got in (got_csv, got_pq):
        assert got.column_names == [*NAMES, "size"]
        np.testing.assert_array_equal(got.column("dog").to_numpy(), mat[:, 1].astype(int))
    (tmp_path / "o.json").unlink(missing_ok=True)
    assert _run(url, "predict", "--release", str(rel["id"]), "--probs",
                str(tmp_path / "p.npy"), "--out", str(tmp_path / "o.json")).exit_code == 0
    assert json.loads((tmp_path / "o.json").read_text()) == doc["sets"]
    ev = _json(url, "evaluate", "--release", str(rel["id"]), "--probs",
               str(tmp_path / "calib.csv"), "--columns", "cat:bird", "--label-column", "label")
    assert ev["n"] == 600 and 0 < ev["coverage"] <= 1
    assert _json(url, "audit", "verify")["releases"] == 2

    before = _cli_state(url)
    bad = np.array(NAMES)[y].astype(object)
    bad[7] = "cow"
    pcsv.write_csv(pa.table({"y": bad.astype(str)}), tmp_path / "bad.csv")
    res = _run(url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.2",
               "--probs", str(tmp_path / "p.npy"), "--labels", str(tmp_path / "bad.csv"),
               "--classes", "cat,dog,bird", "--score", "lac")
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [
        "error: labels: row 7 is 'cow', not one of the classes (cat, dog, bird)"]
    assert _cli_state(url) == before
