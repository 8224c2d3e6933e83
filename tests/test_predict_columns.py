"""A release that records class names applies a probability table by column NAME, not position
(review finding 3): ``privcal predict``/``evaluate`` on a ``--probs`` table with a header,
and ``Release.predict_set``/``evaluate`` on a pandas DataFrame, reorder the columns to the
release's classes; a missing or extra class is refused with one line and nothing written; an
array or a headerless CSV is taken by position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from privcal import Accountant
from privcal.accountant import Release
from privcal.errors import InvalidInput
from tests.cli_env import CliEnv
from tests.seeded import Seeded

NAMES = ["cat", "dog", "fox"]
PERM = ["dog", "cat", "fox"]


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    logits = rng.normal(size=(n, 3))
    logits[np.arange(n), y] += 2.5
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True), y


def _frame(p: np.ndarray, cols: list[str], y: np.ndarray | None = None) -> pd.DataFrame:
    df = pd.DataFrame({c: p[:, NAMES.index(c)] for c in cols})
    if y is not None:
        df["label"] = np.array(NAMES)[y]
    return df


def _run(url: str, *args: str) -> Any:
    return CliEnv(url, Path()).run(*args)


def _json(url: str, *args: str) -> Any:
    return CliEnv(url, Path()).json(*args)


@pytest.fixture
def cli(ledger_url: str, tmp_path: Path) -> dict[str, Any]:
    """A ledger with a plain release (1) and a label-Mondrian release at two levels (2),
    both calibrated on a table with header cat,dog,fox,label; and test files."""
    url = ledger_url
    assert _run(url, "db", "upgrade").exit_code == 0
    assert _run(url, "dataset", "create", "d", "--rho", "5").exit_code == 0
    p, y = _data(900, 3)
    _frame(p, NAMES, y).to_csv(tmp_path / "cal.csv", index=False)
    pt, yt = _data(300, 4)
    f = {"orig": _frame(pt, NAMES, yt), "perm": _frame(pt, PERM, yt),
         "orig_p": _frame(pt, NAMES), "perm_p": _frame(pt, PERM)}
    for name, df in f.items():
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    f["perm_p"].to_parquet(tmp_path / "perm_p.parquet")
    cal = ["calibrate", "pcoqs", "--dataset", "d", "--probs", str(tmp_path / "cal.csv"),
           "--label-column", "label", "--score", "lac", "--rho", "0.2"]
    plain = _json(url, *cal, "--alpha", "0.1")["release"]
    mond = _json(url, *cal, "--alpha", "0.05,0.1", "--mondrian", "label",
                 "--public-groups")["release"]
    assert plain["diagnostics"]["classes"] == NAMES == mond["diagnostics"]["classes"]
    return {"url": url, "dir": tmp_path, "plain": str(plain["id"]), "mond": str(mond["id"]),
            "pt": pt, "yt": yt}


def test_cli_permuted_header_gives_the_same_sets_and_evaluation(cli: dict[str, Any]) -> None:
    url, d = cli["url"], cli["dir"]
    for rel in (cli["plain"], cli["mond"]):
        alpha = ["--alpha", "0.1"] if rel == cli["mond"] else []
        orig = _json(url, "predict", "--release", rel, "--probs", str(d / "orig_p.csv"), *alpha)
        for probs in ("perm_p.csv", "perm_p.parquet"):
            got = _json(url, "predict", "--release", rel, "--probs", str(d / probs), *alpha)
            assert got == orig, (rel, probs)
        # the columns picked from a table with a label column, in the file's own order
        got = _json(url, "predict", "--release", rel, "--probs", str(d / "perm.csv"),
                    "--columns", "dog,cat,fox", *alpha)
        assert got == orig
        ev = [_json(url, "evaluate", "--release", rel, "--probs", str(d / f"{f}.csv"),
                    "--label-column", "label", *alpha) for f in ("orig", "perm")]
        assert ev[0] == ev[1] and ev[1]["coverage"] >= 0.85
    # the sets are those of the true class order; coverage near the guarantee
    cov = np.mean([NAMES[y] in s for y, s in zip(cli["yt"], orig["sets"], strict=True)])
    assert cov >= 0.85
    # --alpha all and --out .csv: the same output for either column order
    outs = []
    for f in ("orig_p", "perm_p"):
        all_ = _json(url, "predict", "--release", cli["mond"], "--probs", str(d / f"{f}.csv"),
                     "--alpha", "all")
        assert _run(url, "predict", "--release", cli["plain"], "--probs", str(d / f"{f}.csv"),
                    "--out", str(d / f"{f}_sets.csv")).exit_code == 0
        outs.append((all_, (d / f"{f}_sets.csv").read_text()))
    assert outs[0] == outs[1]
    assert outs[1][1].splitlines()[0] == '"cat","dog","fox","size"'


@pytest.mark.parametrize("cols, message", [
    (["cat", "dog", "cow"], "has no column for the class 'fox'"),
    (["cat", "dog", "fox", "cow"], "has a column 'cow' that is not a class"),
    (["cat", "dog"], "has no column for the class 'fox'"),
])
def test_cli_missing_or_extra_class_is_refused(cli: dict[str, Any], cols: list[str],
                                               message: str) -> None:
    url, d = cli["url"], cli["dir"]
    pt = cli["pt"]
    df = pd.DataFrame({c: pt[:, NAMES.index(c)] if c in NAMES else pt[:, 2] for c in cols})
    df = df.div(df.sum(axis=1), axis=0)
    df.to_csv(d / "bad.csv", index=False)
    out = d / "sets.csv"
    res = _run(url, "predict", "--release", cli["plain"], "--probs", str(d / "bad.csv"),
               "--out", str(out))
    assert res.exit_code == 1, res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --probs ") and message in lines[0]
    assert f"release {cli['plain']} records the classes cat, dog, fox" in lines[0]
    assert not out.exists()
    df["label"] = np.array(NAMES)[cli["yt"]]
    df.to_csv(d / "bad_l.csv", index=False)
    res = _run(url, "--json", "evaluate", "--release", cli["mond"], "--probs",
               str(d / "bad_l.csv"), "--label-column", "label", "--alpha", "0.1")
    assert res.exit_code == 1
    err = json.loads(res.stdout)["error"]
    assert err["exit_code"] == 1 and message in err["message"]


def test_cli_headerless_file_keeps_position(cli: dict[str, Any]) -> None:
    url, d = cli["url"], cli["dir"]
    pt = cli["pt"]
    np.savetxt(d / "nohead_orig.csv", pt, delimiter=",")
    np.savetxt(d / "nohead_perm.csv", pt[:, [1, 0, 2]], delimiter=",")
    np.save(d / "perm.npy", pt[:, [1, 0, 2]])
    rel = cli["plain"]

    def sets(f: str) -> Any:
        return _json(url, "predict", "--release", rel, "--probs", str(d / f))["sets"]

    orig = sets("orig_p.csv")
    assert sets("nohead_orig.csv") == orig
    # without names the columns are taken by position: a permuted file is another matrix
    assert sets("nohead_perm.csv") == sets("perm.npy") != orig
    assert sets("perm_p.csv") == orig  # with a header they are matched by name
    help_ = _run(url, "predict", "--help").stdout
    assert "without a header, by position" in " ".join(help_.split())


def test_release_without_names_takes_a_named_table_by_position(ledger_url: str,
                                                               tmp_path: Path) -> None:
    url = ledger_url
    assert _run(url, "db", "upgrade").exit_code == 0
    assert _run(url, "dataset", "create", "d", "--rho", "5").exit_code == 0
    p, y = _data(900, 3)
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "y.npy", y)
    rel = _json(url, "calibrate", "pcoqs", "--dataset", "d", "--probs", str(tmp_path / "p.npy"),
                "--labels", str(tmp_path / "y.npy"), "--score", "lac", "--rho", "0.2",
                "--alpha", "0.1")["release"]
    assert "classes" not in rel["diagnostics"]
    pt, _ = _data(50, 4)
    _frame(pt, PERM).to_csv(tmp_path / "perm_p.csv", index=False)
    np.save(tmp_path / "perm.npy", pt[:, [1, 0, 2]])
    np.save(tmp_path / "orig.npy", pt)

    def sets(rid: Any, f: str) -> Any:
        return _json(url, "predict", "--release", str(rid), "--probs", str(tmp_path / f))["sets"]

    assert sets(rel["id"], "perm_p.csv") == sets(rel["id"], "perm.npy")
    # while a release with names matches the same header by name
    _frame(p, NAMES, y).to_csv(tmp_path / "cal.csv", index=False)
    named = _json(url, "calibrate", "pcoqs", "--dataset", "d", "--probs",
                  str(tmp_path / "cal.csv"), "--label-column", "label", "--score", "lac",
                  "--rho", "0.2", "--alpha", "0.1")["release"]
    assert sets(named["id"], "perm_p.csv") == sets(named["id"], "orig.npy")


def test_api_dataframe_columns_matched_by_name(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, delta=1e-6)
    p, y = _data(900, 3)
    kw: dict[str, Any] = {"dataset": "d", "score": "lac", "rho": 0.2, "classes": NAMES}
    rel = accountant.calibrate("pcoqs", probs=p, labels=np.array(NAMES)[y], alpha=0.1,
                               rng=Seeded(1), **kw)
    mond = accountant.calibrate("pcoqs", probs=p, labels=np.array(NAMES)[y],
                                alpha=[0.05, 0.1], mondrian="label", public_groups=True,
                                rng=Seeded(2), **kw)
    pt, yt = _data(300, 4)
    labels = np.array(NAMES)[yt]
    saved = Release.load(rel.model_dump_json())
    for r, extra in ((rel, {}), (mond, {"alpha": 0.1}), (saved, {})):
        want = r.predict_set(pt, **extra)
        for cols in (NAMES, PERM, ["fox", "dog", "cat"]):
            np.testing.assert_array_equal(r.predict_set(_frame(pt, cols), **extra), want)
        assert r.predict_labels(_frame(pt, PERM), **extra) == r.predict_labels(pt, **extra)
        assert r.evaluate(_frame(pt, PERM), labels, **extra) == r.evaluate(pt, labels, **extra)
    # pandas' default columns 0 … k-1 are no names: by position
    np.testing.assert_array_equal(rel.predict_set(pd.DataFrame(pt[:, [1, 0, 2]])),
                                  rel.predict_set(pt[:, [1, 0, 2]]))
    for cols, message in ((["cat", "dog", "cow"], "has no column for the class 'fox'"),
                          (["cat", "dog", "fox", "cow"], "has a column 'cow' that is not a class"),
                          (["cat", "dog"], "has no column for the class 'fox'")):
        df = pd.DataFrame({c: pt[:, NAMES.index(c)] if c in NAMES else pt[:, 2] for c in cols})
        df = df.div(df.sum(axis=1), axis=0)
        for r in (rel, saved):
            with pytest.raises(InvalidInput, match=message) as exc:
                r.predict_set(df)
            assert "\n" not in str(exc.value)
        with pytest.raises(InvalidInput, match=message):
            mond.evaluate(df, labels, alpha=0.1)


def test_a_partly_named_frame_is_refused(accountant: Accountant) -> None:
    """Columns ["dog", "cat", 2] were neither all names nor pandas' positions: taken by
    position, dog's probabilities were read as cat's."""
    accountant.create_dataset("d", rho=1)
    p, y = _data(300, 1)
    rel = accountant.calibrate("pcoqs", probs=p, labels=np.array(NAMES)[y], alpha=0.1,
                               dataset="d", score="lac", rho=0.2, classes=NAMES)
    pt, _ = _data(50, 2)
    mixed = pd.DataFrame({"dog": pt[:, 1], "cat": pt[:, 0], 2: pt[:, 2]})
    with pytest.raises(InvalidInput, match="neither all class names nor pandas' default"):
        rel.predict_set(mixed)
