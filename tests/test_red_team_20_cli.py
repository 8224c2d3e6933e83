"""Red team 20 on the CLI: a label-Mondrian dry run whose class names come from the
``--probs`` table's header (coverage F3) — refused "labels must be numeric" where the run
accepted the same request, because the dry run read the label groups but never matched
them to the header's names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from privcal.cli import main


def _run(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("names", [["cat", "dog", "emu"], ["2", "1", "0"]])
def test_a_label_mondrian_dry_run_reads_the_class_names_as_the_run_does(
        tmp_path: Path, names: list[str]) -> None:
    """Names in the header and name labels; and a number-named, permuted header with
    integer labels that are the names. The dry run prices what the run then charges."""
    g = np.random.default_rng(0)
    p = g.dirichlet(np.ones(3), size=3000)
    y = np.array([g.choice(3, p=q) for q in p])
    table = pd.DataFrame(p, columns=names)
    table["label"] = [names[j] if names[0] == "cat" else int(names[j]) for j in y]
    table.to_csv(tmp_path / "calib.csv", index=False)
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert _run("--db-url", url, "dataset", "create", "d", "--rho", "5").exit_code == 0
    args = ["--db-url", url, "--json", "calibrate", "pcoqs", "--dataset", "d", "--rho", "0.5",
            "--alpha", "0.1", "--probs", str(tmp_path / "calib.csv"), "--label-column",
            "label", "--score", "lac", "--mondrian", "label", "--public-groups"]
    dry = _run(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output  # type: ignore[attr-defined]
    planned = json.loads(dry.stdout)  # type: ignore[attr-defined]
    assert planned["allowed"] and not planned["trivial"]
    run = _run(*args)
    assert run.exit_code == 0, run.output  # type: ignore[attr-defined]
    done = json.loads(run.stdout)["release"]  # type: ignore[attr-defined]
    assert planned["guarantee"] == done["coverage"]["statement"]
    assert planned["cost"] == done["privacy"]["cost"]
