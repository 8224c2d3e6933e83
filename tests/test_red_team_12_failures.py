"""Red team 12 (r12crash, "the machine fails"): what a caller gets when the database fails
under a write. The ledger stayed consistent in every case the review tried (verify ok, no key
charged twice); these are the errors around it.

- F1: a PostgreSQL connection lost during a bulk write (``charge_subjects``, a session batch)
  escaped as a raw exception — psycopg's own from the COPY run on the driver's cursor, or
  SQLAlchemy's ``PendingRollbackError`` from the write's cleanup touching an invalidated
  connection's ``info`` — and was not retried, though nothing had been committed: a
  traceback on the CLI, a 500 from the service. Now retried on a fresh connection.
- F2: the hot path's own errors carried their statements' parameters (pseudonyms, amounts)
  in their text, past the engines' ``hide_parameters``.
- F3: a ``statement_timeout`` set on the server, role, database or URL gave a raw traceback
  (or, at the schema check, "cannot reach the ledger"); now one line saying what happened
  (and, r12rev, not "nothing was written": a calibration's charge commits before its
  release, whose transaction the timeout may be the one to cancel); also in a read whose
  statement runs on the driver's own cursor (r12rev F3: the service's stored reports).
- F4: a SQLite ledger whose write lock another process held made a write wait 12 × the busy
  timeout (≈ 6.3 minutes) before its error; now one busy timeout in all.
- F6: SQLite's read-only URI (``file:…?mode=ro&uri=true``) was refused as a missing
  directory: an auditor with read access only could not verify.
- F7: a key pair that could not be written whole (a full disk) left its private half.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit, urlunsplit

import numpy as np
import pytest
from sqlalchemy import event

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.costs import ZCDP, LocalDP
from privcal.errors import LedgerError
from privcal.storage import Ledger
from privcal.storage.statements import HotStatements

_pg = pytest.mark.parametrize("ledger_url", [pytest.param("postgresql",
                                                          marks=pytest.mark.postgres)],
                              indirect=True)


def _terminate(url: str, pid: int) -> None:
    """Terminate backend ``pid`` from another connection and wait until it is gone."""
    import psycopg

    from privcal.storage.engine import parse_url

    u = parse_url(url)
    with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database,
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(500):
            if admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                             (pid,)).fetchone()[0] == 0:  # type: ignore[index]
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} did not end")


def _kill_at_first_copy(monkeypatch: Any, url: str, target: str) -> list[int]:
    """The first ``COPY`` naming ``target`` finds its backend terminated (a server restart,
    an idle kill): psycopg's cursor is patched, so every COPY site of privcal is reached."""
    import psycopg

    real = psycopg.Cursor.copy
    fired: list[int] = []

    def copy(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        if target in str(statement) and not fired:
            fired.append(self.connection.info.backend_pid)
            _terminate(url, fired[0])
        return real(self, statement, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "copy", copy)
    return fired


@_pg
def test_a_connection_lost_at_a_subject_charges_copy_is_retried(
        ledger: Any, ledger_url: str, monkeypatch: Any) -> None:
    acct = Accountant(ledger)
    acct.create_dataset("d", epsilon=10, subject_epsilon=5)
    fired = _kill_at_first_copy(monkeypatch, ledger_url, "privcal_batch")
    ids = [f"s{i}" for i in range(3000)]
    res = acct.charge_subjects("d", LocalDP(eps0=1), ids, idempotency_key="k1")
    assert fired and res.accepted == 3000
    again = acct.charge_subjects("d", LocalDP(eps0=1), ids, idempotency_key="k1")
    assert again.charge_id == res.charge_id  # replayed: charged once
    acct.verify()  # raises AuditFailed if the chain or a total is wrong


@_pg
def test_a_connection_lost_at_a_session_batchs_copy_is_retried(
        ledger: Any, ledger_url: str, monkeypatch: Any) -> None:
    acct = Accountant(ledger)
    acct.create_dataset("d", rho=10, subject_epsilon=10)
    info = S.open_session(acct, "ldp-score", dataset="d", alpha=0.1, epsilon=2, rounds=2,
                          group_size=500)
    fired = _kill_at_first_copy(monkeypatch, ledger_url, "session_reports")
    subjects = [f"u{i}" for i in range(500)]
    bits = np.random.default_rng(0).integers(0, 2, 500)
    res = S.submit_reports(acct, info.id, subjects, bits, [0] * 500, idempotency_key="b1")
    assert fired and res.accepted == 500
    assert S.session_status(acct, info.id).round == 1
    acct.verify()  # raises AuditFailed if the chain or a total is wrong


@_pg
def test_a_connection_lost_after_the_copy_is_retried_not_a_pending_rollback_error(
        ledger: Any, ledger_url: str) -> None:
    """The backend dies at the statement after the COPY (SQLAlchemy's own, which invalidates
    the connection it holds a transaction on): the cleanup touched that connection's
    ``info`` and raised PendingRollbackError over the retryable error."""
    acct = Accountant(ledger)
    acct.create_dataset("d", epsilon=10, subject_epsilon=5)
    fired: list[int] = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def _kill(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("ANALYZE privcal_batch") and not fired:
            fired.append(conn.connection.driver_connection.info.backend_pid)
            _terminate(ledger_url, fired[0])

    res = acct.charge_subjects("d", LocalDP(eps0=1), [f"s{i}" for i in range(2000)])
    assert fired and res.accepted == 2000
    acct.verify()  # raises AuditFailed if the chain or a total is wrong


def test_the_hot_paths_errors_do_not_carry_their_parameters(ledger: Any) -> None:
    """A pseudonym bound to a statement of the hot path is not in the error's text."""
    secret = "c0ffee" * 10
    with ledger.engine.connect() as conn:
        orig = conn.dialect.loaded_dbapi.OperationalError("canceling statement")
        err = HotStatements._db_error(conn, orig, "SELECT 1 WHERE 'x' = :ids", {"ids": secret})
    assert secret not in str(err) and "hidden" in str(err)


def _with_statement_timeout(url: str, ms: int) -> str:
    parts = urlsplit(url)
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    q["options"] = f"{q.get('options', '')} -cstatement_timeout={ms}".strip()
    return urlunsplit(parts._replace(query=urlencode(q, quote_via=quote)))


@_pg
def test_a_statement_timeout_is_one_line_and_writes_nothing(ledger: Any,
                                                             ledger_url: str) -> None:
    """The dataset's row held by another transaction past the URL's statement_timeout: the
    charge is cancelled, and says so in one line (it was a SQLAlchemy traceback)."""
    import psycopg

    from privcal.storage.engine import parse_url

    Accountant(ledger).create_dataset("d", rho=1)
    acct = Accountant(_with_statement_timeout(ledger_url, 300))
    u = parse_url(ledger_url)
    schema = parse_qs(urlsplit(ledger_url).query)["options"][0].split("=", 1)[1]
    with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database,
                         options=f"-csearch_path={schema}") as holder:
        holder.execute("SELECT * FROM datasets WHERE name = 'd' FOR UPDATE")
        with pytest.raises(LedgerError) as err:
            acct.charge("d", ZCDP(rho="0.1"), idempotency_key="t1")
        holder.rollback()
    msg = str(err.value)
    assert "\n" not in msg and "cancelled a statement" in msg and "statement_timeout" in msg
    assert "rolled back" in msg
    assert err.value.public is not None and "nothing was written" not in err.value.public
    assert "same idempotency key" in err.value.public  # a calibration's charge may stand
    fresh = Accountant(ledger)
    assert fresh.budget("d").charges == 0
    fresh.verify()
    acct.ledger.close()


def test_a_sqlite_write_lock_held_elsewhere_fails_after_one_busy_timeout(
        tmp_path: Any, monkeypatch: Any) -> None:
    """Another process holds the write lock for good (an operator's sqlite3 shell): the
    write's error comes after one busy timeout, not after 12 (here 1 s instead of 30 s)."""
    import privcal.storage.engine as engine
    import privcal.storage.transactions as transactions

    monkeypatch.setattr(engine, "BUSY_TIMEOUT_MS", 1000)
    monkeypatch.setattr(transactions, "BUSY_TIMEOUT_MS", 1000, raising=False)
    path = tmp_path / "l.sqlite"
    acct = Accountant(Ledger(f"sqlite:///{path}"))
    acct.create_dataset("d", rho=1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    t = time.monotonic()
    with pytest.raises(LedgerError, match="stayed locked"):
        acct.charge("d", ZCDP(rho="0.1"))
    assert time.monotonic() - t < 5  # 12 attempts of 1 s each took ≥ 12 s
    holder.execute("ROLLBACK")
    holder.close()
    # brief contention is still waited out: the lock released within the busy timeout
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, lambda: holder.execute("ROLLBACK")).start()
    assert acct.charge("d", ZCDP(rho="0.1")).charge_id
    time.sleep(0.1)
    holder.close()
    acct.ledger.close()


@pytest.mark.parametrize("mode", ["mode=ro", "immutable=1"])
def test_an_auditor_opens_a_sqlite_ledger_read_only(tmp_path: Any, mode: str) -> None:
    """F6: SQLite's read-only URI was refused ("cannot create the ledger file:…: no such
    directory"), so an auditor with read access only could not run ``audit verify``."""
    path = tmp_path / "l.sqlite"
    acct = Accountant(f"sqlite:///{path}")
    acct.create_dataset("d", rho=1)
    acct.charge("d", ZCDP(rho="0.1"))
    acct.ledger.close()
    ro = Accountant(f"sqlite:///file:{path}?{mode}&uri=true")
    assert ro.verify().entries == 2 and ro.budget("d").charges == 1
    if mode == "mode=ro":
        with pytest.raises(LedgerError, match="cannot be written now") as err:
            ro.charge("d", ZCDP(rho="0.1"))
        assert "\n" not in str(err.value)
    ro.ledger.close()
    assert Accountant(f"sqlite:///{path}").budget("d").charges == 1


def test_a_keyed_run_on_a_sqlite_ledger_named_by_its_uri_locks_its_file(tmp_path: Any) -> None:
    """Left by the eighteenth landing, now fixed: the key locks took the URI's text for a
    path (``<cwd>/file:/…/l.sqlite.keylocks``), so every keyed charge or calibration on a
    ledger opened as ``file:…?uri=true`` was a FileNotFoundError traceback. The URI locks
    its file's real path — the one a plain URL locks — and a read-only one, which refuses
    the write, makes no lock file but still replays a key it holds."""
    import numpy as np

    path = tmp_path / "l.sqlite"
    Accountant(f"sqlite:///{path}").create_dataset("d", rho=10)
    uri = Accountant(f"sqlite:///file:{path}?uri=true")
    first = uri.charge("d", ZCDP(rho="0.1"), idempotency_key="k")
    s = np.random.default_rng(0).random(300)
    rel = uri.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=0.1, idempotency_key="c")
    uri.ledger.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".keylocks")) == [
        "l.sqlite.keylocks"]
    plain = Accountant(f"sqlite:///{path}")  # the same key, through the plain URL: replayed
    assert plain.charge("d", ZCDP(rho="0.1"), idempotency_key="k").charge_id == first.charge_id
    plain.ledger.close()
    (tmp_path / "l.sqlite.keylocks").unlink()
    ro = Accountant(f"sqlite:///file:{path}?mode=ro&uri=true")
    assert ro.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=0.1,
                        idempotency_key="c").id == rel.id
    with pytest.raises(LedgerError, match="cannot be written now"):
        ro.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=0.1, idempotency_key="c2")
    ro.ledger.close()
    assert not (tmp_path / "l.sqlite.keylocks").exists()


def test_a_key_pair_that_cannot_be_written_whole_leaves_no_file(tmp_path: Any,
                                                                monkeypatch: Any) -> None:
    """F7: ``audit keygen`` on a full disk left a private key and an empty ``.pub``; every
    retry then refused ("already exists") while ``--sign`` still used the orphan key."""
    import builtins

    from privcal.errors import InvalidInput
    from privcal.storage.signing import generate_keypair

    real_open = builtins.open

    class Full:  # the file is made; its write finds the disk full
        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.fh.close()

        def write(self, data: bytes) -> int:
            raise OSError(28, "No space left on device")

    def full_disk(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        fh = real_open(file, mode, *args, **kwargs)
        return Full(fh) if str(file).endswith(".pub") and "x" in mode else fh

    monkeypatch.setattr(builtins, "open", full_disk)
    with pytest.raises(InvalidInput, match="no key was kept"):
        generate_keypair(tmp_path / "k.key")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(builtins, "open", real_open)
    priv, pub, _ = generate_keypair(tmp_path / "k.key")  # the retry makes the pair
    assert priv.exists() and pub.read_bytes().startswith(b"-----BEGIN PUBLIC KEY")


@_pg
def test_a_statement_timeout_in_a_read_on_the_driver_is_one_line(ledger: Any,
                                                                 ledger_url: str) -> None:
    """r12rev F3: a read that runs its statement on the driver's own cursor (the service's
    stored-reports lookup) let psycopg's QueryCanceled through ``read()``: a 500."""
    slow = Ledger(_with_statement_timeout(ledger_url, 100))
    with pytest.raises(LedgerError, match="cancelled a statement") as err:
        with slow.read() as s:
            with s.connection().connection.driver_connection.cursor() as cur:
                cur.execute("SELECT pg_sleep(2)")
    assert "\n" not in str(err.value)
    with slow.read() as s:  # the connection is still good for the next read
        assert s.connection().exec_driver_sql("SELECT 1").scalar() == 1
    slow.close()


@_pg
def test_a_copy_first_in_a_write_runs_inside_its_transaction(ledger: Any) -> None:
    """r12rev's note: the COPY helper did not send a write's deferred ``BEGIN`` (the driver
    connection is in autocommit mode until a statement carries it), so a COPY first in a
    write would commit on its own; every current COPY happens to follow such a statement."""
    from privcal.storage.pg_copy import copy_in

    def write(conn: Any) -> None:
        copy_in(conn, "COPY ledger_meta_probe (v) FROM STDIN", "1\n")
        raise RuntimeError("roll it back")

    with ledger.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE ledger_meta_probe (v int)")
    with pytest.raises(RuntimeError, match="roll it back"):
        ledger.write_core(write)
    with ledger.engine.connect() as c:
        assert c.exec_driver_sql("SELECT count(*) FROM ledger_meta_probe").scalar() == 0
