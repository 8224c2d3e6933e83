"""Red team 14 (README walk-through), the CLI's messages: a one-column CSV of subject (or
agent) ids without a header line lost its first id to the header, and the count check said
only "got 1999"; the error now says which line was read as the column's name, before anything
is charged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from privcal.accountant import Accountant
from privcal.cli import main


@pytest.mark.parametrize("dry_run", [False, True])
def test_headerless_subject_ids_say_their_first_line_was_the_header(
        ledger: Any, tmp_path: Path, dry_run: bool) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    Accountant(ledger).create_dataset("u", rho=1, subject_epsilon=5)
    np.save(tmp_path / "s.npy", np.random.default_rng(0).random(200))
    ids = tmp_path / "ids.csv"
    ids.write_text("".join(f"user-{i}\n" for i in range(200)))
    head = ledger.head()
    args = ["--db-url", url, "calibrate", "ldp-score", "--simulate", "--dataset", "u",
            "--alpha", "0.1", "--epsilon", "2", "--scores", str(tmp_path / "s.npy"),
            "--subjects", str(ids), *(["--dry-run"] if dry_run else [])]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert ("got 199 subject ids instead of 200 (a 1-D array of 200 ids, one per row); if "
            "the file has no header line, its first line 'user-0' was read as the column's "
            "name") in res.output
    assert ledger.head() == head and Accountant(ledger).subject_spend("u", "user-1") == 0
    ids.write_text("subject\n" + "".join(f"user-{i}\n" for i in range(200)))  # with a header
    assert CliRunner().invoke(main, args).exit_code == 0


def test_api_parameter_messages_name_the_mistake(accountant: Any) -> None:
    """Red team 14: ``epsilon=`` given to pcoqs said "invalid rho: Field required" (the
    unknown parameter is named first now); a validator's message kept pydantic's "Value
    error, " prefix; a missing score named CLI flags only."""
    from privcal.errors import InvalidInput, with_article

    accountant.create_dataset("d", rho=1)
    s = np.random.default_rng(0).random(100)
    head = accountant.ledger.head()
    with pytest.raises(InvalidInput, match=r"^pcoqs takes no parameter 'epsilon'$"):
        accountant.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, epsilon=0.1)
    with pytest.raises(InvalidInput) as e:
        accountant.calibrate("exponq", dataset="d", scores=s, alpha=0.6, epsilon=1)
    assert str(e.value).startswith("exponq: invalid parameters: exponq needs α ≤ 1/2")
    probs = np.full((100, 3), 1 / 3)
    with pytest.raises(InvalidInput, match=r"score= in Python, --score on the CLI"):
        accountant.calibrate("pcoqs", dataset="d", probs=probs, labels=np.zeros(100, int),
                             alpha=0.1, rho=0.1)
    assert accountant.ledger.head() == head
    assert [with_article(w) for w in ("auditor", "device", "Admin")] == [
        "an auditor", "a device", "an Admin"]


def test_a_postgresql_url_without_its_driver_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team 14: without the postgres extra, a PostgreSQL URL said only "No module named
    'psycopg'" (``privcal serve`` names its extra; the ledger now does too)."""
    import sys

    from privcal.errors import LedgerError
    from privcal.storage.engine import make_engine

    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if it were not installed
    with pytest.raises(LedgerError, match=r"pip install 'privcal\[postgres\]'\)$"):
        make_engine("postgresql+psycopg://postgres@127.0.0.1:5432/nowhere")


@pytest.mark.parametrize("bad", ["7.0", "7.", "1.2345678901234568e+18", "1.23457E+18",
                                 "1.2345678901234568E18", "1.0E7", "7.0e0", "1e+18"])
def test_an_id_written_as_a_float_in_a_file_is_refused(ledger: Any, tmp_path: Path,
                                                       bad: str) -> None:
    """Red team 14: pandas writes an integer id column with a missing value as floats, and
    "7.0" was read as text — another person than "7", with a per-subject budget of its own.
    Such an id in a file is refused (nothing charged); hexadecimal and dotted ids load."""
    from privcal.data.files import load_array
    from privcal.errors import InvalidInput

    url = ledger.engine.url.render_as_string(hide_password=False)
    acct = Accountant(ledger)
    acct.create_dataset("u", rho=1, subject_epsilon=5)
    np.save(tmp_path / "s.npy", np.random.default_rng(0).random(50))
    ids = tmp_path / "ids.csv"
    ids.write_text("subject\n" + "".join(f"{i}\n" for i in range(49)) + f"{bad}\n")
    head = ledger.head()
    res = CliRunner().invoke(main, [
        "--db-url", url, "calibrate", "ldp-score", "--simulate", "--dataset", "u", "--alpha",
        "0.1", "--epsilon", "2", "--scores", str(tmp_path / "s.npy"), "--subjects", str(ids)])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert f"row 49 is {bad!r}, an integer written as a float" in res.output
    assert ledger.head() == head and acct.subject_spend("u", "1") == 0
    ok = tmp_path / "ok.csv"
    ok.write_text("subject\n00e5\n1234e5678\n1e18\n3.10\nv1.0\n1.2.3\n7.5\n+4915112345678\n")
    assert load_array(str(ok), "subjects", ids=True).tolist() == [
        "00e5", "1234e5678", "1e18", "3.10", "v1.0", "1.2.3", "7.5", "+4915112345678"]
    # a group's label is no person: "5.0" (pandas' np.floor(age / 10)) stays a group
    groups = tmp_path / "g.csv"
    groups.write_text(f"age_bin\n5.0\n{bad}\n")
    assert load_array(str(groups), "groups", ids=True).tolist() == ["5.0", bad]
    reports = tmp_path / "r.csv"
    reports.write_text(f"subject,bit,round\n7,1,0\n{bad},0,0\n")
    from privcal.data.files import load_reports

    with pytest.raises(InvalidInput, match="an integer written as a float"):
        load_reports(str(reports), "subject", "bit")
