"""Red team 6, inputs: the names that probability columns carry are read at calibration by
the rule :func:`~privcal.calibrators.group_sets.align_columns` applies at predict time, and a
CSV's header is told from its data the same way by the header test and by pyarrow.

1. A DataFrame's columns / a ``--probs`` header / an uploaded header name the classes:
   ``classes`` must name the same columns (the columns' order is recorded, in which the
   probabilities are read); without ``classes`` the names are the classes (never the sorted
   labels). Before: probabilities by position, names from ``classes`` or sorted labels, and
   predict/evaluate by name — held-out coverage 0.80 under a recorded 0.9.
2. A first row ``0.0,1.0`` (pandas' header for ``classes_ = [0., 1.]``) is refused like
   ``0,1``. Before: read as a data row, every prediction set shifted by one.
3. Blank or whitespace-only lines before the header are skipped by pyarrow too; a header
   with a quoted line break is refused. Before: the header was read as data.
4. A header of number names other than 0 … k-1 (sklearn's ``1,2,3``, codes ``01,02``) makes
   the labels names: ``1`` is the column named ``1``, not column index 1. Before: coverage
   0.856 under a recorded 0.9.

Every refusal is checked to charge nothing; every accepted release to cover as it claims.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from privcal import Accountant, Ledger
from privcal.accountant.calibration import dry_run
from privcal.data.files import load_array
from privcal.errors import InvalidInput
from tests.cli_env import CliEnv

HEADER = ["cat", "dog", "bird"]  # the frame's / file's column order
SORTED = ["bird", "cat", "dog"]  # the classes in another order


def _animals(n: int, seed: int, *, birds: bool = False) -> pd.DataFrame:
    """The reviewer's data: the model puts most mass on ``bird``, which is (almost) never
    the label (any model is allowed: conformal coverage is model-free)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet([1, 1, 3], size=n)
    u = rng.uniform(size=n)
    y = np.where(u < 0.5, "cat", "dog")
    if birds:
        y = np.where(u > 0.95, "bird", y)
    df = pd.DataFrame(p, columns=HEADER)
    df["label"] = y
    return df


def _numbered(n: int, seed: int, names: list[str], codes: list[Any]) -> pd.DataFrame:
    """sklearn's layout for ``classes_ = [1, 2, 3]``: header ``1,2,3``; the labels are the
    first two classes only (the third never occurs), the model poor on the first."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet([1, 3, 1], size=n)
    df = pd.DataFrame(p, columns=names)
    df["label"] = np.where(rng.uniform(size=n) < 0.6, codes[0], codes[1])
    return df


def _coverage(sets: np.ndarray, classes: list[str], labels: Any) -> float:
    """Coverage of the true class, the sets' columns named by ``classes``."""
    idx = np.array([classes.index(str(v)) for v in labels])
    return float(sets[np.arange(len(idx)), idx].mean())


def _state(acct: Accountant, dataset: str = "d") -> tuple[Any, ...]:
    return (str(acct.ledger.head()), acct.budget(dataset).spent, len(acct.releases()))


@pytest.fixture
def acct() -> Accountant:
    a = Accountant(Ledger("sqlite://"))
    a.create_dataset("d", rho=5, allow_nonprivate=True)
    return a


# --- 1. the API: a DataFrame's column names ------------------------------------------


@pytest.mark.parametrize("method,kw", [("split", {}), ("pcoqs", {"rho": 0.5})])
def test_a_frames_names_are_matched_to_the_classes(acct: Accountant, method: str,
                                                    kw: dict[str, Any]) -> None:
    cal, test = _animals(3000, 0), _animals(20000, 1)
    rel = acct.calibrate(method, dataset="d", alpha=0.1, probs=cal[HEADER],
                         labels=cal["label"].to_numpy(), classes=SORTED, score="lac", **kw)
    assert rel.classes == HEADER  # the order the probabilities were read in
    ev = rel.evaluate(test[SORTED], test["label"].to_numpy())  # matched by name
    assert ev.coverage >= 0.88, ev  # before: 0.80
    aligned = acct.calibrate("split", dataset="d", alpha=0.1, probs=cal[SORTED],
                             labels=cal["label"].to_numpy(), classes=SORTED, score="lac")
    if method == "split":  # the same calibration, whatever the columns' order
        assert rel.threshold == aligned.threshold


def test_a_frame_without_classes_names_them_in_column_order(acct: Accountant) -> None:
    cal, test = _animals(3000, 0, birds=True), _animals(20000, 1, birds=True)
    rel = acct.calibrate("split", dataset="d", alpha=0.1, probs=cal[HEADER],
                         labels=cal["label"].to_numpy(), score="lac")
    assert rel.classes == HEADER  # before: the sorted labels ['bird', 'cat', 'dog']
    assert rel.evaluate(test[HEADER], test["label"].to_numpy()).coverage >= 0.88


def test_classes_that_do_not_name_the_columns_are_refused_uncharged(acct: Accountant) -> None:
    cal = _animals(500, 0)
    before = _state(acct)
    for classes, match in ((["bird", "cat", "fox"], "'fox' is not one of its columns"),
                           (["bird", "cat"], "'dog' is not one of the classes"),
                           (["bird", "cat", "dog", "fox"], "'fox' is not one of its columns"),
                           (["bird", "cat", "cat"], "named twice")):
        with pytest.raises(InvalidInput, match=match):
            acct.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.5, probs=cal[HEADER],
                           labels=cal["label"].to_numpy(), classes=classes, score="lac")
        with pytest.raises(InvalidInput, match=match):  # a dry run refuses them too
            dry_run(acct, "pcoqs", {"alpha": 0.1, "rho": 0.5}, dataset="d", probs=cal[HEADER],
                    labels=cal["label"].to_numpy(), classes=classes, score="lac")
    assert _state(acct) == before


def test_a_frame_numbered_by_class_labels_is_refused_uncharged(acct: Accountant) -> None:
    """Columns [1, 2, 3] (``pd.DataFrame(p, columns=clf.classes_)``): predict refuses such a
    frame, so calibration does too, before the charge."""
    df = _numbered(500, 0, [1, 2, 3], [1, 2])  # type: ignore[list-item]
    before = _state(acct)
    with pytest.raises(InvalidInput, match="neither all class names"):
        acct.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.5, probs=df[[1, 2, 3]],
                       labels=df["label"].to_numpy(), score="lac")
    assert _state(acct) == before


def test_a_frame_named_by_numbers_takes_number_labels_as_names(acct: Accountant) -> None:
    cal, test = _numbered(3000, 0, ["1", "2", "3"], [1, 2]), _numbered(20000, 1,
                                                                       ["1", "2", "3"], [1, 2])
    cols = ["1", "2", "3"]
    rel = acct.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.5, probs=cal[cols],
                         labels=cal["label"].to_numpy(), score="lac")
    assert rel.classes == cols
    sets = rel.predict_set(test[cols].to_numpy())
    assert _coverage(sets, cols, test["label"]) >= 0.88  # label 1 is the column named 1
    # names that are not numbers (or are 0 … k-1) keep integer labels as column indices
    df = _numbered(500, 0, ["p0", "p1", "p2"], [0, 1])
    for cols in (["p0", "p1", "p2"], ["0", "1", "2"]):
        frame = df[["p0", "p1", "p2"]].set_axis(cols, axis=1)
        a = acct.calibrate("split", dataset="d", alpha=0.1, probs=frame,
                           labels=df["label"].to_numpy(), score="lac")
        b = acct.calibrate("split", dataset="d", alpha=0.1, probs=frame.to_numpy(),
                           labels=df["label"].to_numpy(), score="lac")
        assert a.classes is None and b.classes is None and a.threshold == b.threshold


# --- 1 and 4. the CLI: a --probs header ----------------------------------------------


def _cli(ledger_url: str, tmp_path: Path) -> CliEnv:
    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    assert env.run("dataset", "create", "d", "--rho", "5", "--allow-nonprivate").exit_code == 0
    return env


def _ledger_state(url: str) -> tuple[Any, ...]:
    a = Accountant(url)
    try:
        return _state(a)
    finally:
        a.ledger.close()


def test_cli_classes_in_another_order_than_the_header(ledger_url: str, tmp_path: Path) -> None:
    env = _cli(ledger_url, tmp_path)
    _animals(3000, 0).to_csv(tmp_path / "cal.csv", index=False)
    _animals(20000, 1).to_csv(tmp_path / "test.csv", index=False)
    out = env.json("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.5",
                   "--score", "lac", "--probs", env.f("cal.csv"), "--label-column", "label",
                   "--classes", "bird,cat,dog")
    assert out["release"]["diagnostics"]["classes"] == HEADER
    ev = env.json("evaluate", "--release", str(out["release"]["id"]), "--probs",
                  env.f("test.csv"), "--label-column", "label")
    assert ev["coverage"] >= 0.88  # before: 0.81


def test_cli_classes_that_do_not_name_the_header_are_refused_uncharged(
        ledger_url: str, tmp_path: Path) -> None:
    env = _cli(ledger_url, tmp_path)
    _animals(300, 0).to_csv(tmp_path / "cal.csv", index=False)
    before = _ledger_state(ledger_url)
    for classes in ("bird,cat,fox", "bird,cat", "cat,dog,bird,fox", "cat,cat,dog"):
        for extra in ((), ("--dry-run",)):
            res = env.run("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho",
                          "0.5", "--score", "lac", "--probs", env.f("cal.csv"),
                          "--label-column", "label", "--classes", classes, *extra)
            assert res.exit_code != 0, (classes, extra)
            assert res.stderr.count("\n") == 1 and "error:" in res.stderr, res.stderr
    assert _ledger_state(ledger_url) == before


@pytest.mark.parametrize("names,codes", [(["1", "2", "3"], [1, 2]),
                                         (["01", "02", "03"], ["01", "02"])])
def test_cli_a_header_of_number_names_makes_the_labels_names(
        ledger_url: str, tmp_path: Path, names: list[str], codes: list[Any]) -> None:
    env = _cli(ledger_url, tmp_path)
    _numbered(3000, 0, names, codes).to_csv(tmp_path / "cal.csv", index=False)
    test = _numbered(20000, 1, names, codes)
    test.to_csv(tmp_path / "test.csv", index=False)
    out = env.json("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.5",
                   "--score", "lac", "--probs", env.f("cal.csv"), "--label-column", "label")
    rid = out["release"]["id"]
    assert out["release"]["diagnostics"]["classes"] == names  # before: none recorded
    a = Accountant(ledger_url)
    try:
        sets = a.release(rid).predict_set(test[names].to_numpy())
    finally:
        a.ledger.close()
    assert _coverage(sets, names, test["label"]) >= 0.88  # before: 0.856 for 1,2,3
    ev = env.json("evaluate", "--release", str(rid), "--probs", env.f("test.csv"),
                  "--label-column", "label")
    assert ev["coverage"] >= 0.88
    # README's --columns p0:p9 --label-column label: integer labels stay column indices
    df = _numbered(500, 0, ["p0", "p1", "p2"], [0, 1])
    df.to_csv(tmp_path / "plain.csv", index=False)
    np.save(tmp_path / "p.npy", df[["p0", "p1", "p2"]].to_numpy())
    np.save(tmp_path / "y.npy", df["label"].to_numpy())
    common = ("calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--score", "lac")
    ra = env.json(*common, "--probs", env.f("plain.csv"), "--columns", "p0:p2",
                  "--label-column", "label")["release"]
    rb = env.json(*common, "--probs", env.f("p.npy"), "--labels", env.f("y.npy"))["release"]
    assert ra["threshold"] == rb["threshold"]
    assert (ra["diagnostics"] or {}).get("classes") is None


def test_cli_a_label_that_is_no_numbered_class_is_refused_uncharged(
        ledger_url: str, tmp_path: Path) -> None:
    env = _cli(ledger_url, tmp_path)
    df = _numbered(300, 0, ["1", "2", "3"], [1, 2])
    df.loc[7, "label"] = 0  # column index 0 before; no class is named 0
    df.to_csv(tmp_path / "cal.csv", index=False)
    before = _ledger_state(ledger_url)
    res = env.run("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.5",
                  "--score", "lac", "--probs", env.f("cal.csv"), "--label-column", "label")
    assert res.exit_code != 0
    assert "row 7 is '0', not one of the classes" in res.stderr, res.stderr
    assert _ledger_state(ledger_url) == before


# --- 1 and 4. the service: an uploaded header ----------------------------------------


def test_service_uploaded_header_names_the_classes(ledger_url: str) -> None:
    pytest.importorskip("fastapi")
    from tests.service.conftest import serve

    buf = _animals(3000, 0).to_csv(index=False).encode()
    bad = {"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.5}, "score": "lac",
           "label_column": "label", "classes": ["bird", "cat", "fox"]}
    good = {**bad, "classes": SORTED}
    nums = {"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.5}, "score": "lac",
            "label_column": "label"}
    with serve(ledger_url) as lv, lv.client("analyst") as c:
        def post(req: dict[str, Any], content: bytes) -> Any:
            return c.post("/v1/datasets/d/calibrations",
                          headers={"Idempotency-Key": uuid.uuid4().hex},
                          data={"request": json.dumps(req)},
                          files={"probs": ("cal.csv", content)})

        before = (str(lv.accountant.ledger.head()), lv.accountant.budget("d").spent)
        r = post(bad, buf)
        assert r.status_code == 422, r.text
        assert "'fox' is not one of its columns" in r.json()["detail"]
        assert "privcal-upload" not in r.json()["detail"]
        assert (str(lv.accountant.ledger.head()), lv.accountant.budget("d").spent) == before
        r = post(good, buf)
        assert r.status_code == 201, r.text
        rel = lv.accountant.release(r.json()["id"])
        assert rel.classes == HEADER
        test = _animals(20000, 1)
        assert rel.evaluate(test[SORTED], test["label"].to_numpy()).coverage >= 0.88
        # sklearn's header 1,2,3: the labels are the names
        r = post(nums, _numbered(3000, 0, ["1", "2", "3"], [1, 2]).to_csv(index=False).encode())
        assert r.status_code == 201, r.text
        rel = lv.accountant.release(r.json()["id"])
        assert rel.classes == ["1", "2", "3"]
        t = _numbered(20000, 1, ["1", "2", "3"], [1, 2])
        sets = rel.predict_set(t[["1", "2", "3"]].to_numpy())
        assert _coverage(sets, ["1", "2", "3"], t["label"]) >= 0.88


# --- 2. a header of float class labels -----------------------------------------------


def test_a_first_row_spelling_0_to_k_1_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "p.csv"
    for first in ("0.0,1.0", "00,01", "0.,1.00", "0, 1.0, 2"):
        k = first.count(",") + 1
        f.write_text(first + "\n" + ",".join(["0.5"] * k) + "\n")
        with pytest.raises(InvalidInput, match="what pandas writes as a header"):
            load_array(str(f), "probs", matrix=True)
    # rows that do not spell 0 … k-1 in plain decimals stay data
    for text, want in (("0.000e+00,1.000e+00\n0.5,0.5\n", [[0, 1], [0.5, 0.5]]),
                       ("0.0,0.9\n0.5,0.5\n", [[0, 0.9], [0.5, 0.5]]),
                       ("0.0\n1\n", [0.0, 1.0])):
        f.write_text(text)
        assert load_array(str(f), "probs", matrix=True).squeeze().tolist() == want


def test_cli_predict_refuses_a_float_label_header(ledger_url: str, tmp_path: Path) -> None:
    env = _cli(ledger_url, tmp_path)
    rng = np.random.default_rng(0)
    p = rng.dirichlet([1, 1], size=400)
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "y.npy", (rng.uniform(size=400) < p[:, 1]).astype(int))
    rel = env.json("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.5",
                   "--score", "lac", "--probs", env.f("p.npy"), "--labels", env.f("y.npy"))
    pd.DataFrame(p[:5], columns=[0.0, 1.0]).to_csv(tmp_path / "t.csv", index=False)
    assert (tmp_path / "t.csv").read_text().startswith("0.0,1.0\n")
    before = _ledger_state(ledger_url)
    res = env.run("predict", "--release", str(rel["release"]["id"]), "--probs",
                  env.f("t.csv"), "--out", env.f("sets.csv"))
    assert res.exit_code != 0 and "'0.0,1.0' is what pandas writes" in res.stderr
    assert not (tmp_path / "sets.csv").exists()
    assert _ledger_state(ledger_url) == before


# --- 3. lines before the header ------------------------------------------------------


@pytest.mark.parametrize("lead", ["\n", "\n\n", " , \n", "  \n\n"])
def test_blank_lines_before_the_header_are_skipped(tmp_path: Path, lead: str) -> None:
    f = tmp_path / "s.csv"
    f.write_text(lead + "subject\nA\nB\n")
    assert load_array(str(f), "subjects", ids=True).tolist() == ["A", "B"]
    f.write_text(lead + "score\n0.5\n0.25\n")
    assert load_array(str(f), "scores").tolist() == [0.5, 0.25]
    f.write_text(lead + "0.5\n0.25\n")  # headerless: the data start after the blank lines
    assert load_array(str(f), "scores").tolist() == [0.5, 0.25]


def test_a_header_with_a_quoted_line_break_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "s.csv"
    f.write_text('"sub\nject"\nA\nB\n')
    with pytest.raises(InvalidInput, match="spans lines 1-2") as exc:
        load_array(str(f), "subjects", ids=True)
    assert "\n" not in str(exc.value)


def test_cli_calibrate_reads_a_header_after_a_blank_line(ledger_url: str,
                                                         tmp_path: Path) -> None:
    env = _cli(ledger_url, tmp_path)
    df = _animals(3000, 0, birds=True)
    (tmp_path / "plain.csv").write_text(df.to_csv(index=False))
    (tmp_path / "blank.csv").write_text("\n" + df.to_csv(index=False))
    (tmp_path / "broken.csv").write_text('"c\nat",dog,bird,label\n'
                                         + df.to_csv(index=False, header=False))
    common = ("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.5",
              "--score", "lac", "--label-column", "label")
    a = env.json(*common, "--probs", env.f("plain.csv"))["release"]
    b = env.json(*common, "--probs", env.f("blank.csv"))["release"]  # before: an error
    assert a["diagnostics"]["classes"] == b["diagnostics"]["classes"] == HEADER
    assert a["shape"]["n"] == b["shape"]["n"] == 3000
    before = _ledger_state(ledger_url)
    res = env.run(*common, "--probs", env.f("broken.csv"))
    assert res.exit_code != 0 and "a quoted line break" in res.stderr, res.stderr
    assert _ledger_state(ledger_url) == before
