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
    (["token", "create", "--role", "analyst", "--dataset", "d"], "a dataset"),
    (["token", "create", "--role", "device", "--session", "1", "--subject", "a"], "a session"),
    (["token", "create", "--role", "device", "--session", "1", "--count", "2",
      "--subject-prefix", "p"], "a session"),
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


@pytest.mark.parametrize("key", ["", " ", "\t"])
def test_f2_a_blank_idempotency_key_is_refused(tmp_path: Path, key: str) -> None:
    """F2: ``--idempotency-key "$JOB"`` with JOB unset bound every nightly charge to the
    first night's: one charge for three real mechanism runs. The service already refused
    an empty Idempotency-Key; the CLI and the library now do too, charging nothing."""
    from privcal import ZCDP, Accountant, Ledger
    from privcal.errors import InvalidInput

    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert _run("--db-url", url, "dataset", "create", "d", "--rho", "1").exit_code == 0
    res = _run("--db-url", url, "charge", "d", "--rho", "0.1", "--idempotency-key", key)
    assert res.exit_code == 1, res.output
    assert res.output == ("error: idempotency key is empty: give a non-blank key (one per "
                          "logical request, reused on its retries), or none\n")
    acct = Accountant(Ledger(url))
    with pytest.raises(InvalidInput, match="idempotency key is empty"):
        acct.charge("d", ZCDP(0.1), idempotency_key=key)
    with pytest.raises(InvalidInput, match="idempotency key is empty"):
        acct.calibrate("pcoqs", dataset="d", scores=np.linspace(0, 1, 500), alpha=0.1,
                       rho=0.1, idempotency_key=key)
    assert acct.budget("d").charges == 0 and acct.releases() == []


@pytest.mark.parametrize(("args", "message"), [
    (["--method", "pcoqs", "--rho", "0.5", "--k", "7"],
     "--k applies to advise --method local, not pcoqs"),
    (["--method", "pcoqs", "--rho", "0.5", "--slack", "0.01"],
     "--slack applies to advise --method local, not pcoqs"),
    (["--method", "exponq", "--epsilon", "0.5", "--rounds", "5"],
     "--rounds applies to advise --method local, not exponq"),
    (["--method", "exponq", "--epsilon", "0.5", "--nominal"],
     "--nominal applies to advise --method pcoqs, not exponq"),
    (["--n", "100", "--k", "5", "--epsilon", "0.5", "--nominal"],
     "--nominal applies to advise --method pcoqs, not local"),
    (["--method", "exponq", "--epsilon", "0.5", "--failure-probability", "0.01"],
     "--failure-probability applies to advise --method local or pcoqs, not exponq"),
])
def test_f1_advise_refuses_another_methods_option(args: list[str], message: str) -> None:
    """F1: advise dropped the options of the other methods and answered (exit 0) a question
    not asked; it is a usage error, as --tol, --epsilon and --rho of the wrong kind were."""
    res = _run("advise", "--alpha", "0.1", *args)
    assert res.exit_code == 2, res.output
    assert f"Error: {message}" in res.output
    res = _run("--json", "advise", "--alpha", "0.1", *args)
    assert json.loads(res.stdout)["error"]["message"] == message


def test_f1_advise_still_takes_each_methods_own_options() -> None:
    assert _run("advise", "--alpha", "0.1", "--method", "pcoqs", "--rho", "0.5", "--nominal",
                "--failure-probability", "0.1", "--tol", "1e-3", "--n", "500").exit_code == 0
    assert _run("advise", "--alpha", "0.1", "--n", "2000", "--k", "10", "--epsilon", "2",
                "--slack", "0.1", "--rounds", "6", "--failure-probability", "0.01"
                ).exit_code == 0


@pytest.mark.parametrize("url", ["", "sqlite://", "sqlite:///:memory:"])
@pytest.mark.parametrize("where", ["root", "command"])
def test_f4_an_empty_or_in_memory_ledger_url_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, where: str) -> None:
    """F4: ``--db-url ""`` (a script's "$LEDGER", unset) wrote to the embedded default
    ledger; ``--db-url sqlite://`` printed an admin token "shown only now" that no ledger
    kept, and "created dataset" in a ledger gone when the command ended."""
    monkeypatch.setenv("PRIVCAL_HOME", str(tmp_path))
    monkeypatch.delenv("PRIVCAL_DATABASE_URL", raising=False)
    for command in (["dataset", "create", "d", "--rho", "1"], ["token", "create", "--role",
                                                              "admin"]):
        args = (["--db-url", url, *command] if where == "root"
                else [*command, "--db-url", url])
        res = _run(*args)
        assert res.exit_code == 1, res.output
        assert res.output.startswith("error: ") and res.output.count("\n") == 1
        assert ("malformed ledger URL ''" if url == "" else
                "an in-memory ledger (sqlite://) is gone when the command ends") in res.output
    assert list(tmp_path.iterdir()) == []  # the embedded default ledger was not made


def test_f5_quickstart_does_not_break_a_number_from_its_unit() -> None:
    """F5: the quickstart's first step printed "held-out test set: 500" and "rows; k = 10"
    on two lines."""
    res = _run("quickstart")
    assert res.exit_code == 0, res.output
    assert "Calibration set: 900 rows; held-out test set: 500 rows; k = 10 classes." \
        in res.output.splitlines()[3]
