"""A SQLite ledger file that cannot be opened or written says why, in one line (red team 17
upg F5/F6): a full disk read "cannot reach the ledger: disk I/O error", a read-only mount
"unable to open database file" even for a read; and a ``file:`` URL is shown as given, not
percent-escaped (docs F4)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from privcal.accountant import Accountant
from privcal.errors import LedgerError
from privcal.storage import Ledger
from privcal.storage import engine as engine_mod
from privcal.storage.engine import sqlite_file_hint


def _statvfs(flag: int = 0, free_blocks: int = 10**6) -> Any:
    def fake(_path: Any) -> Any:
        return SimpleNamespace(f_flag=flag, f_bavail=free_blocks, f_frsize=4096)
    return fake


def test_hint_read_only_mount(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(engine_mod.os, "statvfs", _statvfs(flag=os.ST_RDONLY))
    hint = sqlite_file_hint(str(tmp_path / "l.db"))
    assert "mounted read-only" in hint and "l.db-wal" in hint
    assert f"sqlite:///file:{tmp_path / 'l.db'}?immutable=1&uri=true" in hint
    # the file: form of the URL names the same file
    assert sqlite_file_hint(f"file:{tmp_path / 'l.db'}") == hint


def test_hint_full_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(engine_mod.os, "statvfs", _statvfs(free_blocks=0))
    assert "is full: 0 bytes free" in sqlite_file_hint(str(tmp_path / "l.db"))


def test_no_hint_when_nothing_is_known(tmp_path: Path) -> None:
    assert sqlite_file_hint(str(tmp_path / "l.db")) == ""  # a writable folder with room
    assert sqlite_file_hint(":memory:") == sqlite_file_hint(None) == ""
    assert sqlite_file_hint(str(tmp_path / "missing" / "l.db")) == ""  # statvfs fails


def test_an_unopenable_file_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The hint reaches the one-line error of a ledger SQLite cannot open."""
    (tmp_path / "l.db").mkdir()  # a directory where the file should be: SQLite cannot open it
    url = f"sqlite:///{tmp_path / 'l.db'}"
    monkeypatch.setattr(engine_mod.os, "statvfs", _statvfs(flag=os.ST_RDONLY))
    with pytest.raises(LedgerError) as err:
        Accountant(url).datasets()
    msg = str(err.value)
    assert msg.startswith(f"cannot reach the ledger at {url}: unable to open database file")
    assert "mounted read-only" in msg and "\n" not in msg


def test_file_url_shown_as_given(tmp_path: Path) -> None:
    url = f"sqlite:///file:{tmp_path / 'l.db'}?mode=ro&uri=true"
    led = Ledger(url)
    try:
        assert led.url == url and "%3A" not in repr(led)
    finally:
        led.close()
