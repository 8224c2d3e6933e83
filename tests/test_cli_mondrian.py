"""Issue 12 part B through the CLI: --mondrian label / --groups FILE[:COL] with
--public-groups, --alpha 0.05,0.1; predict and evaluate with --alpha and --groups; the same
sets as the library; bad input refused with nothing charged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from click.testing import CliRunner

from privcal import Accountant
from privcal.cli import main


def _run(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


def _json(url: str, *args: str) -> Any:
    res = _run(url, *args, "--json")
    assert res.exit_code == 0, (args, res.stdout, res.stderr)
    return json.loads(res.stdout)


def _state(url: str) -> tuple[Any, ...]:
    return (_json(url, "audit", "head")["head"], len(_json(url, "release", "list")),
            json.dumps(_json(url, "budget", "show", "d")["spent"], sort_keys=True))


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    rng = np.random.default_rng(8)
    n = 1200
    probs = rng.dirichlet(np.ones(3) * 2, n)
    y = np.array([rng.choice(3, p=p) for p in probs])
    region = rng.choice(["north", "south"], size=n)
    np.save(tmp_path / "p.npy", probs)
    np.save(tmp_path / "y.npy", y)
    pcsv.write_csv(pa.table({"region": region, "other": np.arange(n)}), tmp_path / "g.csv")
    np.save(tmp_path / "pt.npy", probs[:40])
    np.save(tmp_path / "yt.npy", y[:40])
    pcsv.write_csv(pa.table({"region": region[:40]}), tmp_path / "gt.csv")
    return {k: str(tmp_path / f) for k, f in (("p", "p.npy"), ("y", "y.npy"), ("g", "g.csv"),
                                              ("pt", "pt.npy"), ("yt", "yt.npy"),
                                              ("gt", "gt.csv"))}


def test_cli_label_mondrian_levels_predict_evaluate(ledger_url: str,
                                                   files: dict[str, str]) -> None:
    url = ledger_url
    assert _run(url, "db", "upgrade").exit_code == 0
    assert _run(url, "dataset", "create", "d", "--rho", "5").exit_code == 0
    base = ["calibrate", "pcoqs", "--dataset", "d", "--probs", files["p"], "--labels",
            files["y"], "--score", "lac", "--rho", "0.2"]
    dry = _json(url, *base, "--alpha", "0.1,0.2", "--mondrian", "label", "--public-groups",
                "--dry-run")
    assert dry["cost"] == {"kind": "zcdp", "rho": "0.4"}
    rel = _json(url, *base, "--alpha", "0.1,0.2", "--mondrian", "label",
                "--public-groups")["release"]
    assert rel["method"] == "mondrian:levels:pcoqs"
    assert _json(url, "budget", "show", "d")["spent"] == {"rho": "0.4"}
    one = _json(url, "predict", "--release", str(rel["id"]), "--probs", files["pt"],
                "--alpha", "0.2")
    every = _json(url, "predict", "--release", str(rel["id"]), "--probs", files["pt"],
                  "--alpha", "all")
    assert set(every["levels"]) == {"0.1", "0.2"} and every["levels"]["0.2"] == one["sets"]
    lib = Accountant(url).release(rel["id"]).predict_labels(np.load(files["pt"]), alpha=0.2)
    assert one["sets"] == lib
    ev = _json(url, "evaluate", "--release", str(rel["id"]), "--probs", files["pt"],
               "--labels", files["yt"], "--alpha", "0.1")
    assert [g["group"] for g in ev["by_group"]] == ["0", "1", "2"]
    assert sum(g["n"] for g in ev["by_group"]) == 40
    shown = _run(url, "release", "show", str(rel["id"]))
    assert shown.exit_code == 0
    res = _run(url, "predict", "--release", str(rel["id"]), "--probs", files["pt"])
    assert res.exit_code == 1 and "choose one" in res.stderr
    assert _json(url, "audit", "verify")["guarantees_recomputed"] == 1


def test_cli_group_column(ledger_url: str, files: dict[str, str], tmp_path: Path) -> None:
    url = ledger_url
    assert _run(url, "db", "upgrade").exit_code == 0
    assert _run(url, "dataset", "create", "d", "--rho", "5").exit_code == 0
    rel = _json(url, "calibrate", "pcoqs", "--dataset", "d", "--probs", files["p"],
                "--labels", files["y"], "--score", "lac", "--rho", "0.2", "--alpha", "0.1",
                "--groups", f"{files['g']}:region", "--public-groups")["release"]
    assert rel["params"]["groups"] == ["north", "south"]
    assert _json(url, "budget", "show", "d")["spent"] == {"rho": "0.2"}
    out = tmp_path / "sets.npy"
    _json(url, "predict", "--release", str(rel["id"]), "--probs", files["pt"], "--groups",
          f"{files['gt']}:region", "--out", str(out))
    region = pcsv.read_csv(files["gt"]).column("region").to_numpy(zero_copy_only=False)
    lib = Accountant(url).release(rel["id"]).predict_set(np.load(files["pt"]), groups=region)
    assert np.array_equal(np.load(out), lib)
    res = _run(url, "predict", "--release", str(rel["id"]), "--probs", files["pt"])
    assert res.exit_code == 1 and "--groups" in res.stderr


@pytest.mark.parametrize("extra, code, match", [
    (["--mondrian", "label"], 1, "--public-groups"),
    (["--public-groups"], 1, "only matters"),
    (["--mondrian", "column", "--public-groups"], 1, "group of every row"),
    (["--alpha", "0.1,abc"], 2, "comma-separated"),
    (["--alpha", "0.1,0.1"], 1, "twice"),
])
def test_cli_bad_options_change_nothing(ledger_url: str, files: dict[str, str],
                                        extra: list[str], code: int, match: str) -> None:
    url = ledger_url
    assert _run(url, "db", "upgrade").exit_code == 0
    assert _run(url, "dataset", "create", "d", "--rho", "5").exit_code == 0
    before = _state(url)
    args = ["calibrate", "pcoqs", "--dataset", "d", "--probs", files["p"], "--labels",
            files["y"], "--score", "lac", "--rho", "0.2"]
    if "--alpha" not in extra:
        args += ["--alpha", "0.1"]
    res = _run(url, *args, *extra)
    assert res.exit_code == code and match in res.stderr, (res.stdout, res.stderr)
    assert _state(url) == before
