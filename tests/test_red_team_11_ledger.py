"""Red team 11 (embed): a ledger inside someone's program — forked, threaded, logged, closed.

- Pickled (a ``spawn`` pool): a bare AttributeError; now one TypeError naming what to do.
- A PostgreSQL ledger used before ``fork`` (gunicorn ``--preload``, ``multiprocessing``):
  parent and children shared pooled connections, their replies mixed, and a charge could
  read another process's row — a dataset's total ended below its logged charges (an
  overspend ``audit verify`` blamed on an edited row). A forked child now drops the
  parent's connections (SQLAlchemy's recipe, in ``os.register_at_fork``).
- An in-memory ledger (``sqlite://``) used across ``fork``: each child a copy of the budget
  (4 children released ρ = 3.6 against a cap of 1). Refused in the child, one line.
- The ledger secret (what tests a guessed subject id) was in SQLAlchemy's log when an
  application turned SQL logging on: INFO (the INSERT's parameters), DEBUG (the row read).
- A malformed ledger URL was echoed with its password.
- Several threads opening new ledgers at once swapped Alembic's process-wide context.
- An in-memory ledger used after ``close()``: a multi-line SQLAlchemy error (its data are
  gone); ``Ledger`` and ``Accountant`` were not context managers.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privcal.accountant import Accountant
from privcal.costs import ZCDP
from privcal.errors import LedgerError
from privcal.storage import Ledger


def _child_charges(acct: Any, q: Any, n: int) -> None:
    try:
        for _ in range(n):
            acct.charge("d", ZCDP(rho="0.001"))
        q.put(("ok", str(acct.budget("d").spent["rho"])))
    except BaseException as exc:
        q.put(("error", repr(exc)[:300]))


def test_forked_children_charge_a_ledger_the_parent_used_without_mixing_connections(
        accountant: Any) -> None:
    """No ``dispose`` before the fork (the suite's own fork tests do one): 3 children of a
    parent that has charged and holds pooled connections, each charging 15 times while the
    parent charges too. Every charge is counted once; the totals are the logged charges'."""
    acct = accountant
    acct.create_dataset("d", rho=1)
    for _ in range(3):
        acct.charge("d", ZCDP(rho="0.001"))
    acct.budget("d")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child_charges, args=(acct, q, 15)) for _ in range(3)]
    for p in procs:
        p.start()
    for _ in range(10):
        acct.charge("d", ZCDP(rho="0.001"))
    got = [q.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(status == "ok" for status, _ in got), got
    assert acct.budget("d").spent["rho"] == Decimal("0.058")  # 3 + 45 + 10 charges
    rep = acct.verify()
    assert rep.charges == 58


def _child_memory(acct: Any, q: Any) -> None:
    try:
        acct.charge("d", ZCDP(rho="0.9"))
        q.put("charged")
    except LedgerError as exc:
        q.put(f"LedgerError: {exc}")
    except BaseException as exc:
        q.put(f"other: {exc!r}"[:300])


def test_an_in_memory_ledger_is_refused_in_a_forked_child() -> None:
    acct = Accountant("sqlite://")
    acct.create_dataset("d", rho=1)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_memory, args=(acct, q))
    p.start()
    out = q.get(timeout=120)
    p.join(60)
    assert out.startswith("LedgerError: an in-memory ledger (sqlite://) cannot be used in a "
                          "forked process"), out
    assert "\n" not in out
    assert acct.budget("d").spent["rho"] == 0  # the parent's own is untouched and usable
    acct.charge("d", ZCDP(rho="0.5"))


def test_the_ledger_secret_is_never_in_sqlalchemys_log(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    caplog.set_level(logging.DEBUG, logger="sqlalchemy.engine")
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    acct = Accountant(url)  # a new file: migrated, its secret made (INSERT)
    acct.create_dataset("d", epsilon=10, subject_epsilon=10)
    acct.charge_subjects("d", 1.0, ["alice", "bob"])
    acct.ledger.close()
    again = Accountant(url)  # another process's first read of the secret (SELECT)
    again.charge_subjects("d", 1.0, ["carol"])
    again.verify()  # verify reads it too (r11rev: verify_subjects did, through the ORM)
    secret = again.ledger.subject_key().hex()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "ledger_secret" in logged  # the statements were logged …
    assert secret not in logged  # … never the secret
    again.ledger.close()


def test_a_malformed_urls_password_is_not_echoed() -> None:
    with pytest.raises(LedgerError) as err:
        Ledger("postgresql+psycopg://svc:S3cretPW@db.internal:54x2/privcal")
    assert "S3cretPW" not in str(err.value) and "psycopg://***@db.internal" in str(err.value)


def test_threads_opening_new_ledgers_at_once(tmp_path: Path) -> None:
    """8 threads, each a new ledger (one file shared by all, or each its own in memory),
    first used at the same moment: Alembic's context is one per process."""
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    errors: list[str] = []
    start = threading.Barrier(16)

    def work(u: str) -> None:
        try:
            start.wait()
            a = Accountant(u)
            a.datasets()
            if u == "sqlite://":
                a.create_dataset("d", rho=1)
                a.charge("d", ZCDP(rho="0.5"))
        except BaseException as exc:
            errors.append(repr(exc)[:200])

    threads = [threading.Thread(target=work, args=(u,))
               for u in [url] * 8 + ["sqlite://"] * 8]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    Accountant(url).create_dataset("later", rho=1)  # the file is not left locked


def test_an_in_memory_ledger_used_after_close_is_one_line_and_context_managers() -> None:
    with Accountant("sqlite://") as acct:
        acct.create_dataset("d", rho=1)
        led = acct.ledger
    with pytest.raises(LedgerError, match="was closed: its data are gone") as err:
        acct.budget("d")
    assert "\n" not in str(err.value)
    with Ledger("sqlite://") as led2:
        assert led2.head().seq == 0
    assert led._gone is not None and led2._gone is not None


def test_a_file_ledger_reopens_after_close(tmp_path: Path) -> None:
    with Accountant(f"sqlite:///{tmp_path / 'l.sqlite'}") as acct:
        acct.create_dataset("d", rho=1)
    assert acct.budget("d").spent["rho"] == 0  # a file ledger is still there


def test_calibration_works_in_a_forked_child_of_a_file_ledger(tmp_path: Path) -> None:
    acct = Accountant(f"sqlite:///{tmp_path / 'l.sqlite'}")
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child() -> None:
        try:
            rel = acct.calibrate("split", dataset="d", scores=np.arange(50) / 50, alpha=0.1)
            q.put(("ok", rel.id))
        except BaseException as exc:
            q.put(("error", repr(exc)[:200]))

    p = ctx.Process(target=child)
    p.start()
    got = q.get(timeout=120)
    p.join(60)
    assert got[0] == "ok", got
    assert [r.id for r in acct.releases("d")] == [got[1]]


# ------------------------------------------------- review of the fixes (r11rev, helper 116)
def _child_key_lock(led: Any, q: Any) -> None:
    try:
        with led.key_lock("d", "job-1"):
            q.put("taken")
    except BaseException as exc:
        q.put(f"error: {exc!r}"[:200])


def test_a_forked_child_takes_a_key_lock_a_parents_thread_held_at_the_fork(
        ledger: Any) -> None:
    """The in-process lock of a key a parent's thread held at the fork stayed locked in the
    child for ever (no thread there to release it): its retry of the key never returned.
    Now the child waits only for the parent's run itself (the file or advisory lock)."""
    assert _fork_while_held(lambda: ledger.key_lock("d", "job-1"), _child_key_lock,
                            (ledger,)) == "taken"


def _fork_while_held(hold: Any, target: Any, args: tuple[Any, ...]) -> Any:
    """A thread of the parent inside ``hold()`` (a context manager) at the fork; the child
    runs ``target(*args, queue)``; the parent's thread leaves once the child started. The
    child's message (a 60 s timeout: it used to wait for ever)."""
    held, release = threading.Event(), threading.Event()

    def holding() -> None:
        with hold():
            held.set()
            release.wait(30)

    t = threading.Thread(target=holding)
    t.start()
    assert held.wait(30)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    release.set()  # the parent's holder ends (its run, its migration): the child's copy of
    t.join(30)  # an in-process lock stays as the fork left it, the parent's own is free
    try:
        return q.get(timeout=60)
    finally:
        p.join(30)


def _child_new_ledger(path: str, q: Any) -> None:
    try:
        Accountant(f"sqlite:///{path}").create_dataset("d", rho=1)
        q.put("ok")
    except BaseException as exc:
        q.put(f"error: {exc!r}"[:200])


def test_a_fork_while_a_thread_migrates_does_not_stall_the_childs_migrations(
        tmp_path: Path) -> None:
    from privcal.storage import schema

    # a thread of the parent inside Alembic at the fork
    assert _fork_while_held(lambda: schema._ALEMBIC, _child_new_ledger,
                            (str(tmp_path / "child.sqlite"),)) == "ok"


def test_a_ledger_that_needs_no_migration_is_not_held_up_by_anothers(tmp_path: Path) -> None:
    """The Alembic lock was held around every ledger's first use: one database that did not
    answer held up every other ledger's first use in the process."""
    from privcal.storage import schema

    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    Accountant(url).create_dataset("d", rho=1)  # made and migrated
    done: list[Any] = []
    with schema._ALEMBIC:  # another thread stuck inside a migration
        t = threading.Thread(target=lambda: done.append(Accountant(url).datasets()))
        t.start()
        t.join(30)
    assert done and [d.name for d in done[0]] == ["d"]


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://svc:pa/ss@db.internal:54x2/privcal",
    "postgresql+psycopg://svc:p@ss@db.internal:54x2/privcal",
    "postgresql+psycopg://svc:S3cret@db.internal:54x2/privcal",
])
def test_a_malformed_urls_password_is_masked_whatever_it_holds(url: str) -> None:
    with pytest.raises(LedgerError) as err:
        Ledger(url)
    assert "pa/ss" not in str(err.value) and "ss@" not in str(err.value)
    assert "S3cret" not in str(err.value) and "://***@db.internal" in str(err.value)


def _nothing(_: Any) -> int:
    return 1


def test_pickling_a_ledger_or_accountant_is_one_line_naming_what_to_do(tmp_path: Path) -> None:
    """A ``spawn`` pool given an Accountant raised a bare AttributeError ("Can't pickle local
    object 'create_engine.<locals>.connect'"); now one TypeError saying to pass the URL."""
    import copy
    import pickle

    acct = Accountant(f"sqlite:///{tmp_path / 'p.db'}")
    # a copy of a ledger would share its connections and locks (a shallow copy of an
    # Accountant shares its ledger, as Accountant(ledger) twice does: allowed)
    for obj, ways in ((acct, (pickle.dumps, copy.deepcopy)),
                      (acct.ledger, (pickle.dumps, copy.copy, copy.deepcopy))):
        for refuse in ways:
            with pytest.raises(TypeError, match=r"^a privcal Ledger or Accountant holds "
                                                r"database connections and cannot be pickled, "
                                                r"copied .* open Accountant\(url\)"):
                refuse(obj)
    assert copy.copy(acct).ledger is acct.ledger
    with mp.get_context("spawn").Pool(1) as pool, pytest.raises(TypeError, match="URL"):
        pool.apply(_nothing, (acct,))
    acct.create_dataset("d", rho=1)  # still usable
    acct.ledger.close()
