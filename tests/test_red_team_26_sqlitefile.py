"""Red team 26, sqlitefile: a SQLite ``file:`` URI read as SQLite reads it, ``%00`` included.

F1: SQLite's URI parser (``sqlite3ParseUri``) decodes ``%00`` and then skips the rest of that
path, key or value, so ``nolock%00x=1`` is ``nolock=1`` to SQLite; privcal decoded it to the key
``'nolock\\x00x'`` and let the URL through. Six processes charging ε 0.1 twenty times each on a
cap of 3 through ``?nolock%2500x=1&uri=true`` were told 38 charges were recorded, 24 were kept
and others failed with "database disk image is malformed"; ``vfs=unix-none%2500``: 40 told.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import pytest

from privcal.errors import LedgerError
from privcal.storage import Ledger
from privcal.storage.engine import parse_url
from privcal.storage.key_locks import _lock_path


@pytest.mark.parametrize(("args", "what"), [
    ("nolock%2500x=1", "file locking off"),
    ("nolock=1%2500x", "file locking off"),
    ("vfs=unix-none%2500", "file locking off"),
    ("vfs=unix-none%2500junk", "file locking off"),
    ("mode=memory%2500", "in memory"),
    ("vfs=memdb%2500", "in memory"),
    ("cache=shared%2500x", "shared-cache"),
])
def test_a_nul_escape_cuts_a_uri_key_or_value_as_sqlite_cuts_it(
        tmp_path: Path, args: str, what: str) -> None:
    with pytest.raises(LedgerError, match=what) as err:
        Ledger(f"sqlite:///file:{tmp_path / 'l.sqlite'}?{args}&uri=true")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "l.sqlite").exists()  # nothing made


def test_a_nul_escape_cuts_the_path_and_read_only_as_sqlite_reads_them(tmp_path: Path) -> None:
    """SQLite opens ``l.sqlite`` for ``l.sqlite%00junk``: the key locks lock that file's; and
    ``mode=ro%00x`` is read-only to SQLite (no lock file is needed there)."""
    db = tmp_path / "l.sqlite"
    assert _lock_path(parse_url(f"sqlite:///file:{db}%2500junk?uri=true")) \
        == os.path.realpath(db)
    assert _lock_path(parse_url(f"sqlite:///file:{db}?mode=ro%2500x&uri=true")) is None


def _hold_key(db_url: str, cwd: str, q: Any) -> None:
    os.chdir(cwd)
    ledger = Ledger(db_url)
    with ledger.key_lock("d", "k"):
        q.put("held")
        time.sleep(3)


def test_a_key_lock_stays_on_the_ledger_s_file_after_a_chdir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F3: ``sqlite:///rel.sqlite`` made in ``one/``, then ``chdir(two/)``: SQLite still writes
    ``one/rel.sqlite``, but the key lock was taken in ``two/rel.sqlite.keylocks``, so a keyed run
    of another process in ``one/`` holding the same key did not make this one wait."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    monkeypatch.chdir(one)
    ledger = Ledger("sqlite:///rel.sqlite")
    monkeypatch.chdir(two)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_hold_key, args=("sqlite:///rel.sqlite", str(one), q))
    p.start()
    try:
        assert q.get(timeout=60) == "held"
        t0 = time.monotonic()
        with ledger.key_lock("d", "k"):
            waited = time.monotonic() - t0
        assert waited > 1.0  # the other process held it ~3 s
        assert not (two / "rel.sqlite.keylocks").exists()
    finally:
        p.join(30)
        ledger.engine.dispose()
