"""Red team 10, a fresh user on a fresh machine (r10install).

- F2: every SQLite ledger privcal created, the embedded default included, was readable by
  every local user under the usual umask 022 (0644 in a 0755 directory): any account read
  ``ledger_secret`` and tested a guessed subject id. A new ledger file is created 0600 and
  the default directory 0700; a ledger with data keeps the mode its owner gave it.
- F3: ``calibrate split --help`` said a retry under the same key "records the run once";
  for a non-private method it recorded a second release. Since migration 0010 the key of a
  non-private run is bound too (``release_keys``), and the help says so for every method.
- F6: ``privcal serve --json`` wrote nothing on stdout, against "every command takes --json".
- F7: the CLI never closed the ledger it opened (on PostgreSQL every command left its pooled
  connections to be collected, with a ResourceWarning each).
"""

from __future__ import annotations

import json
import os
import select
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from privcal.cli import main
from privcal.storage import Ledger


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# ------------------------------------------------------------------------------ F2
def test_a_new_default_ledger_and_its_directory_are_private(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None) -> None:
    home = tmp_path / "home" / "privcal"
    monkeypatch.setenv("PRIVCAL_HOME", str(home))
    monkeypatch.delenv("PRIVCAL_DATABASE_URL", raising=False)
    res = CliRunner().invoke(main, ["dataset", "create", "d", "--epsilon", "1"])
    assert res.exit_code == 0, res.output
    assert _mode(home) == 0o700
    assert _mode(home / "privcal.sqlite") == 0o600


def test_a_new_ledger_file_is_0600_and_its_wal_too(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "led.sqlite"
    led = Ledger(f"sqlite:///{path}")
    try:
        led.ensure_schema()
        assert _mode(path) == 0o600
        from privcal.accountant import Accountant

        Accountant(led).create_dataset("d", epsilon=1)
        with led.read():  # the WAL and its index exist while a connection is open
            for extra in (Path(f"{path}-wal"), Path(f"{path}-shm")):
                if extra.exists():
                    assert _mode(extra) == 0o600, extra
    finally:
        led.close()
    # db upgrade on a new file, and an empty file made beforehand (umask 022: 0644)
    fresh = tmp_path / "fresh.sqlite"
    res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{fresh}", "db", "upgrade"])
    assert res.exit_code == 0, res.output
    assert _mode(fresh) == 0o600
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    assert _mode(empty) == 0o644
    Ledger(f"sqlite:///{empty}").ensure_schema()
    assert _mode(empty) == 0o600


def test_a_ledger_with_data_keeps_its_owners_mode(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "shared.sqlite"
    led = Ledger(f"sqlite:///{path}")
    led.upgrade()
    led.close()
    os.chmod(path, 0o640)  # its owner shares it with a group on purpose
    led = Ledger(f"sqlite:///{path}")
    led.ensure_schema()
    led.close()
    assert _mode(path) == 0o640


# ------------------------------------------------------------------------------ F3
def test_idempotency_key_help_says_what_it_does(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    split = CliRunner().invoke(main, ["--db-url", url, "calibrate", "split", "--help"])
    pcoqs = CliRunner().invoke(main, ["--db-url", url, "calibrate", "pcoqs", "--help"])
    for out in (split.output, pcoqs.output):
        assert ("records the run once (another request under the key is refused)"
                in " ".join(out.split()))


# ------------------------------------------------------------------------------ F6
def test_serve_json_writes_one_document_once_bound(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")  # the server extra (installed by the test extra)
    import httpx

    env = {**os.environ, "PRIVCAL_DATABASE_URL": f"sqlite:///{tmp_path}/s.sqlite"}
    # serve only reads its ledger's schema: it makes none (red team 19, a mistyped URL)
    assert CliRunner().invoke(main, ["--db-url", env["PRIVCAL_DATABASE_URL"], "db",
                                     "upgrade"]).exit_code == 0
    proc = subprocess.Popen([sys.executable, "-c", "from privcal.cli import main; main()",
                             "serve", "--port", "0", "--log-level", "warning", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        got = b""
        doc: Any = None
        deadline = time.monotonic() + 60
        while doc is None:  # the pipe read as it comes (a reader's buffer would hide it)
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "serve --json wrote no document within 60 s of starting"
            chunk = os.read(fd, 65536)
            assert chunk, "serve --json ended without a document"
            got += chunk
            try:
                doc = json.loads(got)
            except json.JSONDecodeError:
                continue
        assert set(doc) == {"listening", "port", "workers"} and doc["workers"] == 1
        assert doc["listening"] == f"http://127.0.0.1:{doc['port']}"
        for _ in range(600):
            try:
                assert httpx.get(doc["listening"] + "/healthz").status_code == 200
                break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            raise AssertionError("the server did not answer")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert out == b""  # nothing else on stdout


# ------------------------------------------------------------------------------ F7
def test_the_cli_closes_the_ledger_it_opened(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []
    real = Ledger.close

    def close(self: Ledger) -> None:
        closed.append(self.url)
        real(self)

    monkeypatch.setattr(Ledger, "close", close)
    url = f"sqlite:///{tmp_path}/c.sqlite"
    for args in (["dataset", "create", "d", "--epsilon", "1"], ["budget", "show", "d"],
                 ["budget", "show", "missing"]):
        closed.clear()
        CliRunner().invoke(main, ["--db-url", url, *args])
        assert closed == [url], args


# ---------------------------------------------- F2, reviewed (r10rev 2 and 6)
def test_db_current_or_check_first_does_not_leave_the_ledger_readable(
        tmp_path: Path, umask_022: None) -> None:
    """``db current`` / ``db check`` opened a missing file through SQLite (4096 bytes, 0644);
    the ``db upgrade`` their message asks for then kept 0644, ``ledger_secret`` included."""
    for first in (["db", "current"], ["db", "check"]):
        path = tmp_path / f"{first[1]}.sqlite"
        url = f"sqlite:///{path}"
        res = CliRunner().invoke(main, ["--db-url", url, *first])
        # they only read: no file at all now (red team 19), so none left readable
        assert res.exit_code == 1 and not path.exists(), (first, res.output)
        assert CliRunner().invoke(main, ["--db-url", url, "db", "upgrade"]).exit_code == 0
        assert _mode(path) == 0o600, first
    # a file made by SQLite itself (an older privcal's `db current`): made private when
    # privcal creates its schema in it
    import sqlite3

    older = tmp_path / "older.sqlite"
    sqlite3.connect(older).execute("PRAGMA user_version = 0").connection.close()
    os.chmod(older, 0o644)
    res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{older}", "db", "upgrade"])
    assert res.exit_code == 0, res.output
    assert _mode(older) == 0o600


def test_a_symlinked_or_unchangeable_ledger_path_is_not_a_traceback(
        tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "real.sqlite"
    link = tmp_path / "link.sqlite"
    link.symlink_to(target)  # dangling: the ledger is made at its target, 0600
    res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{link}", "dataset", "create", "d",
                                    "--epsilon", "1"])
    assert res.exit_code == 0, res.output
    assert _mode(target) == 0o600
    # an empty file privcal may not chmod (os.chmod refused): used as it is, no traceback
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    real_chmod = os.chmod

    def refuse(*a: Any, **k: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    os.chmod = refuse  # type: ignore[assignment]
    try:
        res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{empty}", "dataset", "create",
                                        "d", "--epsilon", "1"])
    finally:
        os.chmod = real_chmod
    assert res.exit_code == 0, res.output


def test_a_symlink_loop_is_a_one_line_error(tmp_path: Path) -> None:
    """``Path.resolve`` raises RuntimeError on a loop (Python 3.11): the ledger's own
    one-line error, not a traceback (r10rev2 1)."""
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    a.symlink_to(b)
    b.symlink_to(a)
    for args in (["db", "current"], ["db", "check"], ["dataset", "list"]):
        res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{a}", *args])
        # the ledger's own one-line error: a clean exit, not an exception escaping
        assert res.exit_code != 0 and isinstance(res.exception, SystemExit), (
            args, res.output, res.exception)
        assert "Traceback" not in res.output and "RuntimeError" not in res.output, args
