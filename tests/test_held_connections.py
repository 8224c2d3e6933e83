"""The connections the charge hot path keeps between writes (storage/held_connections.py):
reused only when clean, bounded, replaced when idle too long, per process, closed with the
ledger; and the SQLite audit head read with the dataset row, appended only from that head."""

from __future__ import annotations

import multiprocessing as mp
import threading
from typing import Any

import pytest

from privcal.costs import ZCDP
from privcal.errors import BudgetRefused, LedgerError
from privcal.storage import engine as engine_mod
from privcal.storage import held_connections as held_mod


def _driver(conn: Any) -> Any:
    return conn.connection.driver_connection


def test_a_charge_reuses_the_connection_of_the_last_one(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    led = accountant.ledger
    accountant.charge("d", ZCDP(rho="0.01"))
    (kept,) = led.held_connections()
    drv = _driver(kept)
    accountant.charge("d", ZCDP(rho="0.01"))
    assert [_driver(c) for c in led.held_connections()] == [drv]
    assert led.verify().charges == 2


def test_a_refused_or_failed_write_keeps_no_connection(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    led = accountant.ledger
    accountant.charge("d", ZCDP(rho="0.01"))
    assert len(led.held_connections()) == 1
    with pytest.raises(BudgetRefused):
        accountant.charge("d", ZCDP(rho="5"))
    assert led.held_connections() == []  # closed: the pool rolled it back
    accountant.charge("d", ZCDP(rho="0.01"))
    assert len(led.held_connections()) == 1

    def boom(conn: Any) -> None:
        led.dataset_row(conn, "d")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        led.write_core(boom)
    assert led.held_connections() == []
    assert led.verify().charges == 2


def test_an_idle_connection_is_not_reused(accountant: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    accountant.create_dataset("d", rho=1)
    led = accountant.ledger
    accountant.charge("d", ZCDP(rho="0.01"))
    (old,) = led.held_connections()
    monkeypatch.setattr(engine_mod, "IDLE_PING_S", -1.0)
    accountant.charge("d", ZCDP(rho="0.01"))
    (new,) = led.held_connections()
    assert new is not old and old.closed


def test_held_connections_are_bounded_and_closed_with_the_ledger(accountant: Any) -> None:
    for i in range(8):
        accountant.create_dataset(f"d{i}", rho=1)
    led = accountant.ledger
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait(10)
            for _ in range(5):
                accountant.charge(f"d{i}", ZCDP(rho="0.01"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    kept = led.held_connections()
    assert 1 <= len(kept) <= held_mod.MAX_HELD
    assert len({id(_driver(c)) for c in kept}) == len(kept)  # never one connection twice
    assert led.verify().charges == 40
    led.close()
    assert led.held_connections() == [] and all(c.closed for c in kept)
    accountant.charge("d0", ZCDP(rho="0.01"))  # usable again after close
    assert led.verify().charges == 41


def _child_charges(accountant: Any, q: Any) -> None:
    try:
        led = accountant.ledger
        inherited = [_driver(c) for c, _ in led._held]
        accountant.charge("d", ZCDP(rho="0.01"))
        mine = [_driver(c) for c in led.held_connections()]
        q.put(("ok", bool(inherited), any(m is i for m in mine for i in inherited)))
    except BaseException as exc:
        q.put(("error", repr(exc), None))


def test_a_forked_child_never_uses_the_parents_connection(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    led = accountant.ledger
    accountant.charge("d", ZCDP(rho="0.01"))
    (kept,) = led.held_connections()
    led.engine.dispose(close=False)  # SQLAlchemy's own fork recipe for the pool
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_charges, args=(accountant, q))
    p.start()
    status, had_inherited, reused = q.get(timeout=120)
    p.join(60)
    assert status == "ok", had_inherited
    assert had_inherited and not reused
    # the parent's connection still works (the child neither used nor closed it)
    assert led.held_connections() == [kept]
    accountant.charge("d", ZCDP(rho="0.01"))
    assert led.verify().charges == 3


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_the_sqlite_append_moves_the_head_only_from_the_head_it_read(accountant: Any) -> None:
    """The dataset read brings the audit head (one statement fewer); should the head move
    between that read and the append, the write is refused and nothing is committed."""
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.01"))
    led = accountant.ledger
    before = led.head()

    def tx(conn: Any) -> None:
        ds = led.dataset_row(conn, "d")
        led.append_audit(conn, "charge", {"dataset_id": ds.id})
        _driver(conn).execute("UPDATE audit_head SET entry_hash = ? WHERE id = 1", ("ff" * 32,))

    with pytest.raises(LedgerError, match="audit head changed"):
        led.write_core(tx)
    assert led.head() == before
    assert led.verify().charges == 1


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_a_missing_sqlite_head_refuses_the_charge(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    led = accountant.ledger
    with led.engine.begin() as conn:
        _driver(conn).execute("DELETE FROM audit_head")
    with pytest.raises(LedgerError, match="audit_head row is missing"):
        accountant.charge("d", ZCDP(rho="0.01"))
    assert accountant.budget("d").charges == 0


def test_an_in_memory_ledger_keeps_no_connection() -> None:
    """Its one connection is lent to one thread at a time (engine.py): kept, it would shut
    out every other thread; so threads still take turns and charge exactly the cap."""
    from privcal.accountant import Accountant

    acct = Accountant("sqlite://")
    acct.create_dataset("d", rho=1)
    acct.charge("d", ZCDP(rho="0.01"))
    assert acct.ledger.held_connections() == []
    done: list[int] = []

    def work() -> None:
        for _ in range(20):
            try:
                acct.charge("d", ZCDP(rho="0.01"))
                done.append(1)
            except BudgetRefused:
                pass

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert len(done) == 99 and acct.ledger.verify().charges == 100
    acct.ledger.close()
