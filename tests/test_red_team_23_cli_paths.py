"""Red team 22, newcomer F1 (left then, mended in the next landing): a directory given where
a file is read or written was click's usage error (exit 2, ``Usage:``/``Try``/``Error:``
lines) while a missing file was one ``error:`` line (exit 1). Every file option and
argument now answers a directory as a missing file is answered, and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from privcal.cli import main

CASES = {
    "calibrate --scores": ["calibrate", "split", "--dataset", "d", "--alpha", "0.1",
                           "--scores", "{dir}"],
    "calibrate --probs": ["calibrate", "split", "--dataset", "d", "--alpha", "0.1",
                          "--probs", "{dir}", "--labels", "{dir}", "--score", "lac"],
    "predict --probs": ["predict", "--release", "1", "--probs", "{dir}"],
    "session submit --reports": ["session", "submit", "1", "--reports", "{dir}"],
    "token create --subjects": ["token", "create", "--role", "device", "--session", "1",
                                "--subjects", "{dir}"],
    "audit keygen KEYFILE": ["audit", "keygen", "{dir}"],
    "audit verify --trusted-key": ["audit", "verify", "--trusted-key", "{dir}"],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("as_json", [False, True])
def test_a_directory_for_a_file_is_one_error_line(tmp_path: Path, case: str,
                                                   as_json: bool) -> None:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    runner = CliRunner()
    assert runner.invoke(main, ["dataset", "create", "d", "--rho", "1", "--db-url", url],
                         catch_exceptions=False).exit_code == 0
    before = (tmp_path / "l.sqlite").read_bytes()
    folder = tmp_path / "adir"
    folder.mkdir()
    args = [a.replace("{dir}", str(folder)) for a in CASES[case]]
    res = runner.invoke(main, [*args, "--db-url", url, *(["--json"] if as_json else [])],
                        catch_exceptions=False)
    assert res.exit_code == 1, (case, res.exit_code, res.stderr)
    named = case.split(" ")[-1]  # the option, or the argument's metavar
    assert res.stderr.strip().splitlines() == [
        f"error: {named} {folder}: is a directory; name a file"]
    if as_json:
        assert json.loads(res.stdout)["error"]["exit_code"] == 1
    assert (tmp_path / "l.sqlite").read_bytes() == before
    assert list(folder.iterdir()) == []
