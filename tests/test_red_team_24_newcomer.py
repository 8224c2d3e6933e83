"""Red team 24, newcomer: a new user's typos and unset shell variables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from privcal.cli import main


def _run(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(("command", "needs"), [
    (["charge", "d", "--rho", "0.1"], "a dataset"),
    (["calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
      "--scores", "{scores}", "--dry-run"], "a dataset"),
    (["calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
      "--scores", "{scores}"], "a dataset"),
    (["session", "open", "fedcp-qq", "--dataset", "d", "--alpha", "0.1", "--agents", "5",
      "--local-n", "100"], "a dataset"),
    (["session", "submit", "1", "--reports", "{reports}"], "a session"),
    (["session", "close", "1", "--abandon"], "a session"),
])
def test_f3_a_command_on_a_dataset_or_session_makes_no_ledger(
        tmp_path: Path, command: list[str], needs: str) -> None:
    """F3: a mistyped --db-url made a new ledger for charge, calibrate (even --dry-run,
    which "writes nothing") and session open/submit/close, then said "unknown dataset"."""
    np.save(tmp_path / "s.npy", np.linspace(0, 1, 500))
    (tmp_path / "r.csv").write_text("subject,bit,round\na,1,0\n")
    args = [a.format(scores=tmp_path / "s.npy", reports=tmp_path / "r.csv") for a in command]
    path = tmp_path / "clnic.sqlite"
    res = _run("--db-url", f"sqlite:///{path}", *args)
    assert res.exit_code == 1, res.output
    assert (f"error: no ledger at {path}: this command needs {needs} of an existing ledger "
            "and makes none") in res.output
    assert not path.exists()
    doc = json.loads(_run("--json", "--db-url", f"sqlite:///{path}", *args).stdout)
    assert doc["error"]["type"] == "NotFound" and not path.exists()
