"""Each method's coverage guarantee says what it assumes of the data (exchangeable, or i.i.d.
for the high-probability and federated guarantees), where people read the guarantee:
``calibrate``, ``release show``, the quickstart, ``audit report``, and every JSON of a release
(``--json``, the HTTP API, a saved release, the UI's table). The data assumption cannot be checked;
it must not be stated weaker than the theorem's (an "exchangeable" under a guarantee proven
for i.i.d. draws would be a false claim)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from click.testing import CliRunner

from privcal.calibrators.assumptions import ASSUMES, NOT_STATED, data_assumption, method_assumption
from privcal.calibrators.registry import BUILTINS, get
from privcal.cli import main

#: methods whose theorem is proven for i.i.d. draws (DKW / binomial tails over the
#: calibration data; Humbert et al.'s i.i.d. scores across agents)
IID = {"ldp-label", "ldp-score", "fedcp-qq", "fedcp2-qq"}


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_states_its_assumption(name: str) -> None:
    text = data_assumption(get(name).calibrator)
    assert text == ASSUMES[name]
    if name in IID:
        assert "i.i.d. draws from one distribution" in text and "exchangeable" not in text
    else:
        assert text.startswith("the calibration points and the test point are exchangeable")


def test_wrappers_assume_what_their_method_does() -> None:
    assert data_assumption(get("levels:split").calibrator) == ASSUMES["split"]
    assert data_assumption(get("mondrian:exponq").calibrator) == (
        "within each group, " + ASSUMES["exponq"])
    assert data_assumption(get("mondrian:levels:pcoqs").calibrator) == (
        "within each group, " + ASSUMES["pcoqs"])


class _Plugin:
    name: ClassVar[str] = "acme"


class _StatingPlugin(_Plugin):
    assumes: ClassVar[str] = "the scores are i.i.d. and bounded"


def test_a_plugin_states_its_own_or_none() -> None:
    assert data_assumption(_StatingPlugin()) == "the scores are i.i.d. and bounded"
    assert data_assumption(_Plugin()) is None


def test_an_unknown_method_gets_no_line() -> None:
    assert method_assumption("no-such-method") is None
    assert method_assumption("pcoqs") == ASSUMES["pcoqs"]
    assert method_assumption("mondrian:split") == "within each group, " + ASSUMES["split"]
    assert NOT_STATED.startswith("not stated")


def _run(url: str, *args: str) -> Any:
    res = CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.stdout


def _ledger(tmp_path: Path, **columns: np.ndarray) -> str:
    """A migrated ledger with dataset ``d`` (non-private allowed), 200 uniform scores in
    ``s.npy`` and each of ``columns`` saved as ``NAME.npy``; its URL."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _run(url, "db", "upgrade")
    _run(url, "dataset", "create", "d", "--epsilon", "5", "--allow-nonprivate")
    np.save(tmp_path / "s.npy", np.random.default_rng(3).random(200))
    for name, values in columns.items():
        np.save(tmp_path / f"{name}.npy", values)
    return url


def test_calibrate_and_release_show_print_it(tmp_path: Path) -> None:
    url = _ledger(tmp_path, a=np.repeat(np.arange(4), 50))
    out = _run(url, "calibrate", "split", "--dataset", "d", "--alpha", "0.1",
               "--scores", str(tmp_path / "s.npy"))
    assert f"assuming            {ASSUMES['split']}" in out
    out = _run(url, "calibrate", "fedcp-qq", "--dataset", "d", "--alpha", "0.2",
               "--scores", str(tmp_path / "s.npy"), "--agent-of", str(tmp_path / "a.npy"))
    assert "assuming            every agent's scores and the test point are i.i.d." in out
    shown = " ".join(_run(url, "release", "show", "2").split())
    assert "assuming " + " ".join(ASSUMES["fedcp-qq"].split()) in shown


def test_every_json_of_a_release_says_it(tmp_path: Path) -> None:
    """``--json`` of calibrate, release show/list and audit report carry ``assumes`` (a
    machine reading the guarantee reads its assumption too); a saved release keeps it and
    loads back equal to the ledger's record."""
    from privcal.accountant import Accountant, Release
    from privcal.storage import Ledger

    url = _ledger(tmp_path, g=np.repeat(np.arange(2), 100))
    made = json.loads(_run(url, "calibrate", "split", "--dataset", "d", "--alpha", "0.1",
                           "--scores", str(tmp_path / "s.npy"), "--json"))
    assert made["release"]["assumes"] == ASSUMES["split"]
    _run(url, "calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--scores",
         str(tmp_path / "s.npy"), "--groups", str(tmp_path / "g.npy"), "--public-groups")
    shown = json.loads(_run(url, "release", "show", "2", "--json"))
    assert shown["method"].startswith("mondrian")
    assert shown["assumes"] == "within each group, " + ASSUMES["split"]
    listed = json.loads(_run(url, "release", "list", "--json"))
    assert [r["assumes"] for r in listed] == [ASSUMES["split"],
                                              "within each group, " + ASSUMES["split"]]
    report = json.loads(_run(url, "audit", "report", "--json"))
    assert [r["assumes"] for r in report[0]["releases"]] == [r["assumes"] for r in listed]
    text = _run(url, "audit", "report")
    assert f"#1 assuming: {ASSUMES['split']}" in text

    led = Ledger(url)
    try:
        rel = Accountant(led).release(2)
        saved = rel.model_dump_json()
        assert json.loads(saved)["assumes"] == "within each group, " + ASSUMES["split"]
        back = Release.load(saved)
        assert back == rel and back.assumes == rel.assumes
    finally:
        led.close()
