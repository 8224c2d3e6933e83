"""Red team 26, ledger: one SQLite file under other names, and commits that are not durable.

F1: SQLite percent-decodes a ``file:`` URI's keys, values and path once more than SQLAlchemy
does, so ``n%256flock=1`` (SQLite reads ``nolock=1``), ``mod%2565=memory``, ``vfs=memd%2562``
or ``file:%253Amemory%253A`` passed the refusals of red team 25 (F4, F8): six processes were
told 81 charges of ε 0.1 were recorded on a pure cap of 5.

F2: one ledger file through two hard links: SQLite names ``-wal`` and ``-shm`` (where WAL's
write lock lives) after each name, so both names wrote at once — 60 charges of ε 0.1
acknowledged on a cap of 3, the file kept 30, and verified under both names.

F3: a keyed run's ``.keylocks`` handle, closed at the end of the run, released every POSIX
lock the process held on the file — the key locks of its other threads' runs too.

F5: PostgreSQL's ``synchronous_commit = off`` (URL, role or database default) was kept: a
COMMIT returned before its WAL was flushed, so a server crash could lose an acknowledged charge.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from privcal.accountant import Accountant
from privcal.costs import PureDP
from privcal.errors import LedgerError
from privcal.storage import Ledger

PG_ONLY = pytest.mark.parametrize(
    "ledger_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)


# ------------------------------------------------------------------ F1
@pytest.mark.parametrize(("args", "what"), [
    ("n%256flock=1", "file locking off"),
    ("nolock=%2531", "file locking off"),
    ("vfs=unix-non%2565", "file locking off"),
    ("mod%2565=memory", "in memory"),
    ("vfs=memd%2562", "in memory"),
    ("cach%2565=shared", "shared-cache"),
])
def test_a_percent_encoded_sqlite_uri_argument_is_read_as_sqlite_reads_it(
        tmp_path: Path, args: str, what: str) -> None:
    with pytest.raises(LedgerError, match=what):
        Ledger(f"sqlite:///file:{tmp_path / 'l.sqlite'}?{args}&uri=true")
    assert not (tmp_path / "l.sqlite").exists()


def test_a_percent_encoded_memory_path_or_inline_argument_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="in memory"):
        Ledger("sqlite:///file:%253Amemory%253A?uri=true")
    with pytest.raises(LedgerError, match="file locking off"):  # "?" inside the database part
        Ledger(f"sqlite:///file:{tmp_path / 'l.sqlite'}%3Fn%256flock%3D1?uri=true")


def test_a_key_lock_is_taken_unless_sqlite_really_opens_read_only(tmp_path: Path) -> None:
    """``mode=ro&mod%65=rwc``: SQLite reads two ``mode`` arguments and opens read-write (the
    last wins); the key locks took the first for the mode and locked nothing."""
    from privcal.storage.engine import parse_url
    from privcal.storage.key_locks import _lock_path

    db = tmp_path / "l.sqlite"
    assert _lock_path(parse_url(f"sqlite:///file:{db}?mode=ro&mod%2565=rwc&uri=true")) \
        == os.path.realpath(db)
    assert _lock_path(parse_url(f"sqlite:///file:{db}?mode=ro&uri=true")) is None
    assert _lock_path(parse_url(f"sqlite:///file:{db}?immutable=%2531&uri=true")) is None


# ------------------------------------------------------------------ F2
def test_a_ledger_file_with_another_hard_link_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "a.sqlite"
    acct = Accountant(f"sqlite:///{db}")
    acct.create_dataset("d", epsilon=3)
    acct.ledger.close()
    os.link(db, tmp_path / "b.sqlite")
    for name in ("a.sqlite", "b.sqlite"):
        with pytest.raises(LedgerError, match="has 2 hard links") as err:
            Accountant(f"sqlite:///{tmp_path / name}").charge("d", PureDP("0.1"))
        assert "\n" not in str(err.value)
    assert not (tmp_path / "b.sqlite-wal").exists()  # nothing written under the second name
    (tmp_path / "b.sqlite").unlink()
    ok = Accountant(f"sqlite:///{db}")
    assert ok.charge("d", PureDP("0.1")).charge_id == 1
    ok.ledger.close()


# ------------------------------------------------------------------ F3
def _take_key(path: str, q: Any) -> None:
    led = Ledger(f"sqlite:///{path}")
    t0 = time.monotonic()
    with led.key_lock("d", "K1"):
        q.put(time.monotonic() - t0)
    led.close()


def test_a_key_lock_outlives_another_key_s_run_in_the_same_process(tmp_path: Path) -> None:
    """Thread 1 holds key K1; thread 2 takes and releases K2 (its handle of the lock file
    closed); another process must still wait for K1 — it took it at once."""
    db = str(tmp_path / "l.sqlite")
    led = Ledger(f"sqlite:///{db}")
    led.ensure_schema()
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with led.key_lock("d", "K1"):
            held.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(10)
    with led.key_lock("d", "K2"):
        pass
    q: Any = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_take_key, args=(db, q))
    p.start()
    time.sleep(3)  # the other process starts and asks for K1 (held here throughout)
    took_early = not q.empty()
    done.set()
    t.join()
    waited = q.get(timeout=30)
    p.join(30)
    led.close()
    assert not took_early, f"another process took K1 after {waited:.3f} s while it was held"


# ------------------------------------------------------------------ F5
@PG_ONLY
@pytest.mark.parametrize(("setting", "kept"), [("off", "on"), ("remote_apply", "remote_apply")])
def test_postgres_commits_are_durable_whatever_synchronous_commit_says(
        ledger_url: str, ledger: Ledger, setting: str, kept: str) -> None:
    from test_red_team_25_ledger import _with_options

    with Ledger(_with_options(ledger_url, f"synchronous_commit={setting}")) as led, \
            led.engine.connect() as conn:
        assert conn.execute(text("SHOW synchronous_commit")).scalar() == kept


# ------------------------------------------------------------------ F4
@PG_ONLY
def test_db_upgrade_says_the_search_path_names_no_schema(ledger_url: str) -> None:
    """Known leftover of red team 25: ``search_path`` empty, or naming no existing schema, and
    ``db upgrade`` said "cannot reach the ledger" (the server had answered)."""
    from test_red_team_25_ledger import _with_options

    with Ledger(_with_options(ledger_url, "search_path=privcal_no_such_schema")) as led:
        with pytest.raises(LedgerError, match="no schema to create its tables in") as err:
            led.upgrade()
        assert "cannot reach" not in str(err.value)
    with Ledger(ledger_url) as led:  # the fixture's own schema: nothing was written in it
        assert led.current() is None


# ------------------------------------------------------------------ F6
@pytest.mark.parametrize("arg", ["immutable=on", "immutable=yes", "immutabl%2565=1"])
def test_an_immutable_open_beside_a_wal_is_refused_however_spelt(tmp_path: Path,
                                                                 arg: str) -> None:
    """Red team 23 F5 refused ``immutable=1`` beside a ``-wal`` holding transactions (SQLite
    then reads the main file only: older budgets and head); ``immutable=on`` (SQLite's boolean
    spellings) or a percent-escaped key opened it and showed ε spent 0 of 2.5."""
    import sqlite3

    db = tmp_path / "l.sqlite"
    writer = Accountant(f"sqlite:///{db}")
    writer.create_dataset("d", epsilon=3)
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for _ in range(5):  # the writer stays open: its transactions stay in the -wal
        writer.charge("d", PureDP("0.5"))
    assert (tmp_path / "l.sqlite-wal").stat().st_size > 32
    with pytest.raises(LedgerError, match="write-ahead log beside it"):
        Accountant(f"sqlite:///file:{db}?{arg}&uri=true").budget("d")
    writer.ledger.close()


# ------------------------------------------------------------------ F8
def test_a_ledger_moved_or_linked_while_open_takes_no_more_writes(tmp_path: Path) -> None:
    """``mv a.sqlite b.sqlite`` under running writers: they went on writing through
    ``a.sqlite-wal`` while processes opening ``b.sqlite`` wrote ``b.sqlite-wal`` — 60 charges
    of ε 0.1 acknowledged on a cap of 3, 30 kept, verified. A connection opened before the
    move (or before another hard link was made) now refuses to begin a write."""
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    acct = Accountant(f"sqlite:///{a}")
    acct.create_dataset("d", epsilon=3)
    acct.charge("d", PureDP("0.1"))  # the hot path's connection, kept
    os.link(a, tmp_path / "c.sqlite")
    with pytest.raises(LedgerError, match="has 2 hard links"):
        acct.charge("d", PureDP("0.1"))
    (tmp_path / "c.sqlite").unlink()
    acct.charge("d", PureDP("0.1"))
    os.rename(a, b)
    with pytest.raises(LedgerError, match="moved, replaced or deleted") as err:
        acct.charge("d", PureDP("0.1"))
    assert "\n" not in str(err.value)
    with pytest.raises(LedgerError, match="moved, replaced or deleted"):
        acct.create_dataset("e", epsilon=1)  # the ORM write path too
    assert acct.budget("d").charges == 2  # nothing written by the refused calls
    assert [d.name for d in acct.datasets()] == ["d"]
    acct.ledger.close()


# ------------------------------------------------------------------ F9
def _hold_then_want(path: str, first: str, second: str, delay: float, q: Any) -> None:
    led = Ledger(f"sqlite:///{path}")
    out: list[str] = []

    def hold() -> None:
        with led.key_lock("d", first):
            time.sleep(3)

    def want() -> None:
        time.sleep(delay)
        try:
            with led.key_lock("d", second):
                out.append("ok")
        except Exception as exc:
            out.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=hold), threading.Thread(target=want)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    led.close()
    q.put(out)


def test_key_locks_wait_where_the_kernel_sees_a_deadlock_between_processes(
        tmp_path: Path) -> None:
    """Process A: one thread holds K1, another waits for K2; process B: one holds K2, another
    then waits for K1. No thread waits for itself, but POSIX locks belong to processes: B's
    wait was refused with a raw ``OSError: Resource deadlock avoided``."""
    db = str(tmp_path / "l.sqlite")
    Ledger(f"sqlite:///{db}").ensure_schema()
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    ps = [ctx.Process(target=_hold_then_want, args=(db, "K1", "K2", 0.5, q)),
          ctx.Process(target=_hold_then_want, args=(db, "K2", "K1", 1.0, q))]
    for p in ps:
        p.start()
    outs = [q.get(timeout=60) for _ in ps]
    for p in ps:
        p.join(30)
    assert outs == [["ok"], ["ok"]]


# ------------------------------------------------------------------ F11
def test_a_new_ledger_named_by_a_percent_encoded_uri_is_private(tmp_path: Path) -> None:
    """``file:/…/my%20dir/l.sqlite``: privcal made its 0600 file at the undecoded path
    (``my%20dir``, no such directory) and SQLite created ``my dir/l.sqlite`` with the umask's
    0644 — the ledger holding the pseudonyms' secret readable by every local user."""
    folder = tmp_path / "my dir"
    folder.mkdir()
    old = os.umask(0o022)
    try:
        url = f"sqlite:///file:{tmp_path.as_posix().replace(' ', '%2520')}/my%2520dir/l.sqlite" \
              "?uri=true"
        acct = Accountant(url)
        acct.create_dataset("d", epsilon=1)
        acct.ledger.close()
    finally:
        os.umask(old)
    assert (folder / "l.sqlite").stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "my%20dir").exists()


# ------------------------------------------------------------------ F12
def test_the_key_lock_file_is_private(tmp_path: Path) -> None:
    """``<db>.keylocks`` was made with the umask's 0644: a local user able to open it could
    hold a read lock that blocks every keyed run's exclusive lock."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    led.ensure_schema()
    old = os.umask(0o022)
    try:
        with led.key_lock("d", "k"):
            pass
    finally:
        os.umask(old)
    led.close()
    assert (tmp_path / "l.sqlite.keylocks").stat().st_mode & 0o777 == 0o600
