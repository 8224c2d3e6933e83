"""The ledger: schema and migrations, the embedded default, URLs, stale schemas."""

from __future__ import annotations

import json
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from privcal.accountant import Accountant
from privcal.costs import ZCDP
from privcal.errors import LedgerError, SchemaOutOfDate
from privcal.storage import Ledger
from privcal.storage.models import Base


def test_migration_creates_exactly_the_models(ledger: Any) -> None:
    """The hand-written migration 0001 and the ORM models describe the same schema. SQLite's
    two expression indexes (on the release id in a payload) cannot be reflected, so autogenerate
    skips them, warning: tests/test_migration_0011.py checks them."""
    with ledger.engine.connect() as conn, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Skipped unsupported reflection of expression-based")
        warnings.filterwarnings("ignore", "autogenerate skipping metadata-specified expression")
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diffs == []
    assert ledger.current() == ledger.head_revision() == ledger.check()


def test_upgrade_is_idempotent(ledger: Any) -> None:
    assert ledger.upgrade() == ledger.head_revision()
    assert ledger.upgrade() == ledger.head_revision()
    assert ledger.verify().entries == 0


def test_stale_schema_is_refused_naming_the_upgrade(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    if led.backend == "postgresql":
        with pytest.raises(SchemaOutOfDate, match="run `privcal db upgrade`"):
            Accountant(led).datasets()  # empty database: not migrated
    else:  # issue 15: a new SQLite file is created and migrated on first use
        assert Accountant(led).datasets() == []
    led.upgrade()
    Accountant(led).create_dataset("d", rho=1)
    # another process rewinds the schema: a fresh Ledger refuses it
    with led.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0007'"))
    with pytest.raises(SchemaOutOfDate, match=r"at revision 0007.*privcal db upgrade"):
        Accountant(Ledger(ledger_url)).charge("d", ZCDP(rho=0.1))
    with pytest.raises(SchemaOutOfDate):
        Ledger(ledger_url).check()
    # a revision no migration of this privcal names (a newer privcal's): never "db upgrade"
    with led.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0000'"))
    with pytest.raises(SchemaOutOfDate, match=r"'0000', which this privcal does not know"):
        Accountant(Ledger(ledger_url)).charge("d", ZCDP(rho=0.1))


def test_downgrade_then_refused(ledger: Any, ledger_url: str) -> None:
    ledger.downgrade("base")
    assert ledger.current() is None
    with pytest.raises(SchemaOutOfDate, match="without a privcal schema"):
        Ledger(ledger_url).head()


def test_embedded_default_is_created_and_migrated(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVCAL_HOME", str(tmp_path / "home"))
    led = Ledger()
    assert led.is_default and led.url == f"sqlite:///{tmp_path}/home/privcal.sqlite"
    Accountant(led).create_dataset("d", rho=1)  # first use creates and migrates
    path = tmp_path / "home" / "privcal.sqlite"
    assert path.exists() and led.current() == led.head_revision()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with led.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_an_older_embedded_default_is_refused_until_db_upgrade(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team 17 (upg F0): an embedded default of an older privcal was migrated in place by
    any command (even ``budget show``) — under an older privcal server still running on it,
    which then wrote releases without the rows the new schema expects, and ``audit verify``
    failed for good. It is refused (exit 5) like every other ledger until ``privcal db
    upgrade``, which says what it did."""
    from click.testing import CliRunner

    from privcal.cli import main

    monkeypatch.setenv("PRIVCAL_HOME", str(tmp_path / "home"))
    led = Ledger()
    Accountant(led).create_dataset("d", rho=1)  # a new default: created and migrated
    led.downgrade("0010")  # as an older privcal left it
    led.close()
    res = CliRunner().invoke(main, ["budget", "show", "d"])
    assert res.exit_code == 5, res.output
    assert ("at revision 0010, this privcal needs revision 0011: run `privcal db upgrade` "
            "once every older privcal using it is stopped") in res.stderr
    again = Ledger()
    assert again.current() == "0010"  # nothing migrated
    again.close()
    res = CliRunner().invoke(main, ["db", "upgrade"])
    assert res.exit_code == 0 and "migrated from revision 0010 to 0011" in res.stdout
    res = CliRunner().invoke(main, ["db", "upgrade", "--json"])
    assert json.loads(res.stdout)["from_revision"] == "0011"
    assert CliRunner().invoke(main, ["budget", "show", "d"]).exit_code == 0


def test_database_url_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/env.sqlite"
    monkeypatch.setenv("PRIVCAL_DATABASE_URL", url)
    led = Ledger()
    assert not led.is_default and led.url == url
    # issue 15: a new SQLite file named by URL is created and migrated on first use
    assert not (tmp_path / "env.sqlite").exists()  # opening it created nothing yet
    assert led.head().seq == 0
    assert (tmp_path / "env.sqlite").exists() and led.current() == led.head_revision()


@pytest.mark.parametrize("url", ["not a url", "mysql://u@h/db", "postgresql+asyncpg://u@h/db",
                                 "sqlite+aiosqlite:///x.db", "://"])
def test_malformed_or_unsupported_url(url: str) -> None:
    with pytest.raises(LedgerError) as ei:
        Ledger(url)
    assert "\n" not in str(ei.value)


def test_unreachable_server_is_a_one_line_error() -> None:
    led = Ledger("postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2")
    with pytest.raises(LedgerError, match="cannot reach the ledger at") as ei:
        led.check()
    assert "\n" not in str(ei.value)


def test_unwritable_sqlite_location(tmp_path: Path) -> None:
    led = Ledger(f"sqlite:///{tmp_path}/no/such/dir/x.sqlite")
    with pytest.raises(LedgerError, match="cannot reach the ledger"):
        led.upgrade()


def test_releases_of_unknown_dataset(accountant: Any) -> None:
    from privcal.errors import NotFound

    with pytest.raises(NotFound, match="unknown dataset"):
        accountant.ledger.releases("nope")
    with pytest.raises(NotFound, match="unknown release 7"):
        accountant.ledger.release(7)
    assert accountant.ledger.releases() == []


def test_transient_lock_errors_are_retried_a_bounded_number_of_times(ledger: Any) -> None:
    import sqlite3

    from sqlalchemy.exc import OperationalError

    locked = OperationalError("BEGIN IMMEDIATE", {}, sqlite3.OperationalError("database is locked"))
    calls = []

    def flaky(session: Any) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise locked
        return "done"

    assert ledger.write(flaky) == "done" and len(calls) == 3

    def always(session: Any) -> None:
        calls.append(1)
        raise locked

    calls.clear()
    with pytest.raises(LedgerError, match="stayed locked after 4 attempts"):
        ledger.write(always, attempts=4)
    assert len(calls) == 4

    def broken(session: Any) -> None:  # not transient: raised at once
        calls.append(1)
        raise OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: x"))

    calls.clear()
    with pytest.raises(OperationalError):
        ledger.write(broken)
    assert len(calls) == 1
