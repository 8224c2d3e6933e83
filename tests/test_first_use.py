"""Issue 15: a clean first hour — a new SQLite ledger named by URL (or in memory) is created
and migrated on first use; only an existing ledger of an older schema is refused (exit 5)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from privcal import Accountant, Ledger
from privcal.cli import main
from privcal.errors import LedgerError, SchemaOutOfDate


def test_in_memory_ledger_for_a_one_off_calibration() -> None:
    acct = Accountant(Ledger("sqlite://"))  # no upgrade()
    acct.create_dataset("d", rho=1)
    rel = acct.calibrate("pcoqs", dataset="d", scores=np.random.default_rng(0).random(500),
                         alpha=0.1, rho=0.1)
    assert rel.id == 1 and acct.verify().guarantees_recomputed == 1


def test_new_sqlite_file_by_url_is_created_on_first_use(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.sqlite"
    r = CliRunner().invoke(main, ["dataset", "create", "d", "--rho", "1", "--db-url", url])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "new.sqlite").exists()
    led = Ledger(url)
    assert led.current() == led.head_revision()
    # an empty file (e.g. `touch`) is new too: a writing command makes it a ledger; a
    # command that only reads makes none (red team 19: a typo'd URL "verified" as empty)
    (tmp_path / "empty.sqlite").touch()
    empty = f"sqlite:///{tmp_path}/empty.sqlite"
    r = CliRunner().invoke(main, ["--db-url", empty, "dataset", "list", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["error"]["type"] == "NotFound"
    assert (tmp_path / "empty.sqlite").stat().st_size == 0
    r = CliRunner().invoke(main, ["--db-url", empty, "dataset", "create", "e", "--epsilon", "1"])
    assert r.exit_code == 0, r.stderr
    r = CliRunner().invoke(main, ["--db-url", empty, "dataset", "list", "--json"])
    assert r.exit_code == 0 and [d["name"] for d in json.loads(r.stdout)] == ["e"]


def test_older_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.sqlite"
    old = Ledger(url)
    old.upgrade("0001")
    with pytest.raises(SchemaOutOfDate, match=r"at revision 0001.*privcal db upgrade"):
        Accountant(Ledger(url)).datasets()
    assert Ledger(url).current() == "0001"
    r = CliRunner().invoke(main, ["--db-url", url, "dataset", "list"])
    assert r.exit_code == 5 and "privcal db upgrade" in r.stderr


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="no such directory"):
        Accountant(Ledger(f"sqlite:///{tmp_path}/nope/l.sqlite")).datasets()
    assert not (tmp_path / "nope").exists()
