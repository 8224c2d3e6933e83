"""The optimistic charge on PostgreSQL (issue 11, :mod:`privcal.storage.optimistic`): one round
trip when this process's snapshot of the dataset row is current, and never a charge checked
against a stale one — another process's charge, an administrator's UPDATE of the cap, a
renamed dataset; nothing written when its statement fails; a connection lost while it runs
never charges twice; the same stored bytes as the locked path."""

from __future__ import annotations

import json
import multiprocessing as mp
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from privcal.costs import ZCDP, ApproxDP, PureDP
from privcal.errors import BudgetRefused, LedgerError, NotFound, PrivcalError
from privcal.storage.optimistic import OptimisticCharges

_pg = pytest.mark.parametrize("ledger_url", [pytest.param("postgresql",
                                                          marks=pytest.mark.postgres)],
                              indirect=True)


class _Spy:
    """Counts what :meth:`OptimisticCharges.cas_record_charge` answered (None: CAS failed)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.answers: list[Any] = []
        real = OptimisticCharges.cas_record_charge

        def spy(led: Any, *a: Any) -> Any:
            out = real(led, *a)
            self.answers.append(out)
            return out

        monkeypatch.setattr(OptimisticCharges, "cas_record_charge", spy)

    @property
    def recorded(self) -> int:
        return sum(isinstance(a, tuple) for a in self.answers)  # (charge id, new row)

    @property
    def failed(self) -> int:
        return sum(a is None for a in self.answers)


def _rows(led: Any, sql: str) -> list[tuple[Any, ...]]:
    with led.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def _charge_elsewhere(url: str, dataset: str, rho: str) -> None:
    """Another process (forked: it inherits this one's snapshots, and must not trust them)."""
    from privcal.accountant import Accountant

    acct = Accountant(url)
    acct.charge(dataset, ZCDP(rho=rho))
    acct.ledger.close()


def _in_process(url: str, dataset: str, rho: str) -> None:
    p = mp.get_context("fork").Process(target=_charge_elsewhere, args=(url, dataset, rho))
    p.start()
    p.join(60)
    assert p.exitcode == 0


# ------------------------------------------------------------------ a stale snapshot
@_pg
def test_another_process_s_charge_is_seen(accountant: Any, ledger_url: str,
                                          monkeypatch: Any) -> None:
    """A caches 0.5 spent of 1; B charges 0.4; A's 0.3 — fine against A's snapshot — must be
    refused (0.9 spent), and A's 0.1 then fits exactly. A CAS that compared nothing would
    overspend here."""
    spy = _Spy(monkeypatch)
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.5"))  # the locked path; the snapshot is kept
    accountant.ledger.engine.dispose()  # the child opens its own connections
    _in_process(ledger_url, "d", "0.4")
    with pytest.raises(BudgetRefused):
        accountant.charge("d", ZCDP(rho="0.3"))
    assert spy.failed == 1  # tried optimistically, and the CAS refused the stale row
    assert accountant.charge("d", ZCDP(rho="0.1")).remaining == {"rho": Decimal("0")}
    assert accountant.budget("d").spent == {"rho": Decimal("1.0")}
    assert accountant.ledger.verify().charges == 3


@_pg
@pytest.mark.parametrize("change", [
    "UPDATE datasets SET cap_rho = 0.6 WHERE name = 'd'",  # an administrator lowers the cap
    "UPDATE datasets SET spent_zcdp_rho = 0.9 WHERE name = 'd'",  # totals without the count
    "UPDATE datasets SET notion = 'pure', cap_epsilon = 1, cap_rho = NULL WHERE name = 'd'",
], ids=["cap", "totals", "notion"])
def test_a_datasets_writer_that_keeps_the_count_is_seen(
        accountant: Any, change: str, monkeypatch: Any) -> None:
    """Writers of the dataset row that do not touch ``charge_count``: the next charge is
    checked against the row as it is (a CAS on the count alone would charge 0.3 against
    the old cap and totals, overspending)."""
    spy = _Spy(monkeypatch)
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.5"))
    with accountant.ledger.engine.begin() as conn:
        conn.execute(text(change))
    with pytest.raises(BudgetRefused):
        accountant.charge("d", ZCDP(rho="0.3"))
    assert spy.failed == 1
    assert accountant.budget("d").charges == 1


@_pg
def test_a_renamed_dataset_is_not_charged_under_its_old_name(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))
    with accountant.ledger.engine.begin() as conn:
        conn.execute(text("UPDATE datasets SET name = 'e' WHERE name = 'd'"))
    with pytest.raises(NotFound, match="unknown dataset 'd'"):
        accountant.charge("d", ZCDP(rho="0.1"))
    assert accountant.budget("e").charges == 1


@_pg
def test_a_used_idempotency_key_replays_and_a_new_one_is_optimistic(
        accountant: Any, monkeypatch: Any) -> None:
    spy = _Spy(monkeypatch)
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))
    first = accountant.charge("d", ZCDP(rho="0.1"), idempotency_key="k")
    assert spy.recorded == 1 and not first.replayed
    again = accountant.charge("d", ZCDP(rho="0.1"), idempotency_key="k")
    assert again.replayed and again.charge_id == first.charge_id
    assert spy.failed == 1  # the key was there: the CAS wrote nothing, the locked path replayed
    assert accountant.budget("d").charges == 2
    assert accountant.ledger.verify().charges == 2


# ------------------------------------------------------------------ failures
@_pg
def test_a_failing_statement_writes_nothing(accountant: Any, monkeypatch: Any) -> None:
    """The audit append (the message's second statement) violates a constraint: the charge
    INSERT and the totals UPDATE of the first statement are rolled back with it — one
    implicit transaction — and so is the locked path's retry; afterwards all is well."""
    spy = _Spy(monkeypatch)
    led = accountant.ledger
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))
    before = _rows(led, "SELECT * FROM datasets"), _rows(led, "SELECT id FROM charges")
    with led.engine.begin() as conn:
        for table, col in (("audit_log", "payload"), ("audit_queue", "prefix")):
            conn.execute(text(f"ALTER TABLE {table} ADD CONSTRAINT boom "
                              f"CHECK ({col} NOT LIKE '%boom%')"))
    try:
        with pytest.raises(IntegrityError, match="boom"):
            accountant.charge("d", ZCDP(rho="0.1"), purpose="boom")
        assert spy.answers == [None]  # tried optimistically first, refused by the server
        assert (_rows(led, "SELECT * FROM datasets"),
                _rows(led, "SELECT id FROM charges")) == before
    finally:
        with led.engine.begin() as conn:
            for table in ("audit_log", "audit_queue"):
                conn.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT boom"))
    accountant.charge("d", ZCDP(rho="0.1"), purpose="fine")
    assert accountant.budget("d").charges == 2
    assert led.verify().charges == 2


@_pg
def test_a_connection_killed_between_charges_charges_once(accountant: Any) -> None:
    """pg_terminate_backend on the connection kept for the next charge: that charge's
    statement never ran, and it is made once on a fresh connection."""
    led = accountant.ledger
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))
    (held,) = led.held_connections()
    pid = held.connection.driver_connection.info.backend_pid
    with led.engine.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    accountant.charge("d", ZCDP(rho="0.1"))
    assert accountant.budget("d").charges == 2
    assert led.verify().charges == 2


class _DiesAfterCommit:
    """A cursor whose connection dies as the result of its statement arrives (it committed)."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, *a: Any) -> Any:
        from psycopg import OperationalError

        self._cur.execute(*a)
        self._cur.connection.close()
        raise OperationalError("server closed the connection unexpectedly")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


@_pg
@pytest.mark.parametrize("key", [None, "k"], ids=["unkeyed", "keyed"])
def test_a_connection_lost_as_the_statement_commits_never_charges_twice(
        accountant: Any, key: str | None) -> None:
    """The statement committed and the connection died before its answer: the outcome is
    unknown to the caller, so it is not blindly retried (that would charge twice) — an
    unkeyed charge raises a one-line LedgerError, a keyed one replays."""
    from psycopg import ClientCursor

    from privcal.storage import optimistic

    led = accountant.ledger
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))
    (held,) = led.held_connections()
    held.info[optimistic._CAS_CURSOR] = _DiesAfterCommit(
        ClientCursor(held.connection.driver_connection))
    if key is None:
        with pytest.raises(LedgerError, match="lost during the charge's commit"):
            accountant.charge("d", ZCDP(rho="0.1"))
    else:
        assert accountant.charge("d", ZCDP(rho="0.1"), idempotency_key=key).replayed
    assert accountant.budget("d").charges == 2  # the one that committed, once
    assert accountant.budget("d").spent == {"rho": Decimal("0.2")}
    assert led.verify().charges == 2
    accountant.charge("d", ZCDP(rho="0.1"))  # and the ledger goes on
    assert led.verify().charges == 3


# ------------------------------------------------------------------ the same bytes
@_pg
def test_the_optimistic_charge_stores_the_locked_path_s_bytes(
        accountant: Any, monkeypatch: Any) -> None:
    """The same charge (same instant) on two like datasets, one by the locked path and one
    optimistically: the charge rows, the dataset rows and the audit payloads are equal but
    for the ids and names; and the receipts likewise."""
    import privcal.accountant.charges as charges_mod

    spy = _Spy(monkeypatch)
    led = accountant.ledger
    for name in ("a", "b"):
        accountant.create_dataset(name, rho=3)
        accountant.charge(name, ZCDP(rho="0.01"), purpose="warm")
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    monkeypatch.setattr(charges_mod, "now", lambda: at)
    led.forget_dataset("a")
    got = [accountant.charge(n, ZCDP(rho="0.0123"), purpose="p\u00e9 \"q\"", requester="r",
                             idempotency_key="key") for n in ("a", "b")]
    assert spy.recorded == 1 and spy.answers[-1][0] == got[1].charge_id
    norm = [r.model_dump() for r in got]
    for r in norm:
        r.pop("charge_id")
        r.pop("dataset")
    assert norm[0] == norm[1]
    # (the request digest covers the dataset's name: it differs, as it would on either path)
    cols = "scope, notion, epsilon, delta, rho, eps0, subjects_accepted, subjects_rejected, " \
           "purpose, requester, idempotency_key, created_at, members_digest"
    rows = [_rows(led, f"SELECT {cols} FROM charges WHERE id = {r.charge_id}")
            for r in got]
    assert rows[0] == rows[1]
    ds = [_rows(led, f"SELECT * FROM datasets WHERE name = '{n}'")[0][2:] for n in "ab"]
    assert ds[0][:8] == ds[1][:8] and ds[0][9:] == ds[1][9:]  # all but created_at
    led.sequence_audit()
    by_id = {json.loads(p)["data"]["charge_id"]: p for (p,) in _rows(
        led, "SELECT payload FROM audit_log WHERE kind = 'charge'")}
    a, b = (by_id[r.charge_id] for r in got)
    da, db = (_rows(led, f"SELECT request_digest FROM charges WHERE id = {r.charge_id}")[0][0]
              for r in got)
    one = (a.replace(f'"charge_id":{got[0].charge_id},', "").replace(da, db)
           .replace('"dataset":"a","dataset_id":1', '"dataset":"b","dataset_id":2'))
    assert one.rsplit('"seq":', 1)[0] == \
        b.replace(f'"charge_id":{got[1].charge_id},', "").rsplit('"seq":', 1)[0]
    assert led.verify().charges == 4


# ------------------------------------------------------------------ the audit chain
@_pg
def test_an_optimistic_charge_queues_when_it_may_not_append(accountant: Any,
                                                           monkeypatch: Any) -> None:
    """K busy: the entry is queued with the charge (nothing after the COMMIT); the process's
    next charge sends the draining append, which chains the queued entry and then its own,
    in order, in the same statement — no charge needs the locked path to drain — and once a
    drain finds nothing queued, the plain append is sent again."""
    from tests.test_audit_queue import _chain, _queue, _sequencer_busy

    spy = _Spy(monkeypatch)
    led = accountant.ledger
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))
    with _sequencer_busy(led):
        accountant.charge("d", ZCDP(rho="0.1"))
    assert spy.recorded == 1 and len(_queue(led)) == 1
    assert led.charge_snapshot("d") is not None  # no drain is left to the locked path …
    assert led._drain_mode  # … but to the next charge's draining append
    accountant.charge("d", ZCDP(rho="0.1"))  # granted K, an entry queued before its own
    assert spy.recorded == 2 and _queue(led) == []
    ids = [d["charge_id"] for _, kind, d in _chain(led) if kind == "charge"]
    assert ids == sorted(ids) and len(ids) == 3  # chained in commit order
    assert led._drain_mode  # it drained one: the next drains too
    accountant.charge("d", ZCDP(rho="0.1"))  # optimistic again, nothing queued …
    assert spy.recorded == 3 and _queue(led) == []
    assert not led._drain_mode  # … so the plain append is back
    accountant.charge("d", ZCDP(rho="0.1"))
    assert spy.recorded == 4 and _queue(led) == []
    v = led.verify()
    assert (v.charges, v.queued) == (5, 0)


@_pg
def test_prepared_statements_dropped_under_it_are_prepared_again(
        accountant: Any, monkeypatch: Any) -> None:
    """``DEALLOCATE ALL`` on the kept connection (a pooler, an administrator): the next
    charge's EXECUTE fails — nothing written — and it is made by the locked path; the one
    after prepares the statements again and is optimistic."""
    spy = _Spy(monkeypatch)
    led = accountant.ledger
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))
    accountant.charge("d", ZCDP(rho="0.1"))
    (held,) = led.held_connections()
    drv = held.connection.driver_connection
    drv.execute("DEALLOCATE ALL")
    drv.commit()
    accountant.charge("d", ZCDP(rho="0.1"))
    accountant.charge("d", ZCDP(rho="0.1"))
    assert [isinstance(a, tuple) for a in spy.answers] == [True, False, True]
    assert spy.answers[1] is None
    assert accountant.budget("d").charges == 4
    assert led.verify().charges == 4


# ------------------------------------------------------------------ planning
@_pg
def test_the_optimistic_statements_run_generic_plans(accountant: Any,
                                                     monkeypatch: Any) -> None:
    """The server plans the optimistic charge once per connection, not at every charge:
    left to plan_cache_mode ``auto`` it chose a custom plan each time (≈ 0.3 ms of planning
    per charge); the message's SET LOCAL makes it run the generic plan, and only inside the
    message's own transaction (the connection's setting is unchanged afterwards)."""
    spy = _Spy(monkeypatch)
    accountant.create_dataset("d", rho=1000)
    for _ in range(25):
        accountant.charge("d", ZCDP(rho="0.001"))
    assert spy.recorded == 24  # the first charge takes the locked path
    (conn,) = accountant.ledger.held_connections()
    drv = conn.connection.driver_connection
    plans = drv.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                        "WHERE name LIKE 'privcal_cas_%'").fetchall()
    mode = drv.execute("SHOW plan_cache_mode").fetchone()[0]
    drv.rollback()
    # the charge and the plain audit append ran 24 times, on generic plans; the draining
    # append (nothing was ever queued) is prepared but never ran
    assert sorted(plans) == [(0, 0), (24, 0), (24, 0)], plans
    assert mode == "auto"


# ------------------------------------------------------------------ the cap checked in SQL
@_pg
def test_writers_of_one_dataset_do_not_fail_each_other(accountant: Any, ledger_url: str,
                                                       monkeypatch: Any) -> None:
    """Two processes' ledgers charging one zCDP dataset in turn: each charge is checked
    against the totals the other left, in its one statement — none falls back to the locked
    path (the compare-and-set of the whole row failed every one of them) — and the totals,
    count and chain are exact."""
    from privcal.accountant import Accountant

    spy = _Spy(monkeypatch)
    other = Accountant(ledger_url)
    try:
        accountant.create_dataset("d", rho=1)
        for acct in (accountant, other):  # each learns the dataset by the locked path
            acct.charge("d", ZCDP(rho="0.01"))
        assert spy.answers == []
        for _ in range(10):
            for acct in (accountant, other):
                r = acct.charge("d", ZCDP(rho="0.01"))
        assert (spy.recorded, spy.failed) == (20, 0)
        assert r.remaining == {"rho": Decimal("0.78")}
        assert accountant.budget("d").spent == {"rho": Decimal("0.22")}
        assert accountant.budget("d").charges == 22
        assert accountant.ledger.verify().charges == 22
    finally:
        other.ledger.close()


def _cost_elsewhere(url: str, dataset: str, cost: Any) -> None:
    from privcal.accountant import Accountant

    acct = Accountant(url)
    acct.charge(dataset, cost)
    acct.ledger.close()


@_pg
@pytest.mark.parametrize(("cap", "mine", "theirs", "last", "fits"), [
    ({"rho": 1}, ZCDP(rho="0.4"), ZCDP(rho="0.1"), ZCDP(rho="0.5"), True),  # at the cap
    ({"rho": 1}, ZCDP(rho="0.4"), ZCDP(rho="0.1"), ZCDP(rho="0.500000000001"), False),
    ({"rho": 1}, ZCDP(rho="0.4"), ZCDP(rho="0.1"), PureDP(eps="1"), True),  # ε²/2 = 0.5
    ({"rho": 1}, ZCDP(rho="0.4"), ZCDP(rho="0.1"), PureDP(eps="1.000000000001"), False),
    ({"epsilon": 1}, PureDP(eps="0.25"), PureDP(eps="0.25"), PureDP(eps="0.5"), True),
    ({"epsilon": 1}, PureDP(eps="0.25"), PureDP(eps="0.25"), PureDP(eps="0.500000000001"),
     False),
], ids=["rho-at-cap", "rho-over", "eps-on-zcdp-at-cap", "eps-on-zcdp-over", "eps-at-cap",
        "eps-over"])
def test_a_stale_snapshot_is_charged_against_the_committed_totals(
        accountant: Any, ledger_url: str, monkeypatch: Any, cap: dict[str, int], mine: Any,
        theirs: Any, last: Any, fits: bool) -> None:
    """A charges ``mine`` (its snapshot); another process charges ``theirs``; A's ``last``
    fits A's snapshot either way. It is recorded in one statement if it fits the totals as
    committed — to the last of 12 decimal places, exactly at the cap included, ε²/2 of a
    pure cost under a zCDP cap too — and if it does not, the statement writes nothing and
    the locked path refuses it."""
    spy = _Spy(monkeypatch)
    accountant.create_dataset("d", **cap)
    accountant.charge("d", mine)  # the locked path: A's snapshot
    accountant.ledger.engine.dispose()  # the child opens its own connections
    p = mp.get_context("fork").Process(target=_cost_elsewhere,
                                       args=(ledger_url, "d", theirs))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    (what,) = cap
    if fits:
        assert accountant.charge("d", last).remaining == {what: Decimal(0)}
        assert (spy.recorded, spy.failed) == (1, 0)
        assert accountant.budget("d").spent == {what: Decimal(1)}
    else:
        with pytest.raises(BudgetRefused, match="would exceed the cap"):
            accountant.charge("d", last)
        assert (spy.recorded, spy.failed) == (0, 1)
        assert accountant.budget("d").charges == 2
    assert accountant.ledger.verify().charges == (3 if fits else 2)


@_pg
@pytest.mark.parametrize("notion", ["pure", "zcdp", "approx"])
def test_the_statement_decides_as_the_python_filter_does(accountant: Any,
                                                         notion: str) -> None:
    """The statement's own check, with no Python check before it, against
    :func:`~privcal.accountant.privacy.filters.check_charge` on the committed row: 90 costs
    of every kind (pure, zCDP, (ε, δ)) filling the cap, all sent with the dataset's row as
    created (stale from the second charge on). Recorded exactly when the Python filter
    accepts the cost against the row as committed (under an (ε, δ) cap, only while the
    stale row's totals are still the committed ones), and the stored totals are the Python
    filter's."""
    import random

    from privcal.accountant import charges as charges_mod
    from privcal.accountant import privacy as acc
    from privcal.accountant.policy import policy_of, spent_columns, spent_of

    led = accountant.ledger
    cap = {"pure": {"epsilon": 3}, "zcdp": {"rho": 2},
           "approx": {"approx_epsilon": 4, "approx_delta": "0.001"}}[notion]
    accountant.create_dataset("d", **cap)

    def committed() -> Any:  # the row as the charge paths load it
        with led.engine.connect() as conn:
            return led.dataset_row(conn, "d")

    stale = committed()
    rng = random.Random(7)
    recorded = refused = 0
    for i in range(90):
        amount = Decimal(rng.randint(1, 400)) / 1000
        cost = [PureDP(eps=amount), ZCDP(rho=amount),
                ApproxDP(eps=amount, delta=Decimal("0.00001"))][i % 3]
        row = committed()
        try:
            want = acc.check_charge(policy_of(row), spent_of(row), cost, scope="d")
        except PrivcalError:
            want = None
        if notion == "approx" and spent_of(row) != spent_of(stale):
            want = None  # a compare-and-set of the totals: the stale row never passes
        values = charges_mod._values(1, cost, None, None, None, None)
        got = led.cas_record_charge(stale, values, cost.kind,
                                    spent_columns(acc.Spent().add(cost)))
        assert (got is not None) == (want is not None), (i, cost, row)
        if got is None:
            refused += 1
        else:
            recorded += 1
            assert spent_of(got[1]) == want
            assert spent_of(committed()) == want
    assert recorded >= (1 if notion == "approx" else 10) and refused >= 10
    assert led.verify().charges == recorded


@_pg
@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
def test_a_statement_orphaned_by_a_lost_connection_never_charges_too(
        accountant: Any, monkeypatch: Any, fenced: bool) -> None:
    """The connection is lost while the statement waits on the server (here for a lock on
    ``audit_head`` held by another session): the server process goes on, and — adding its
    cost to the totals as committed — would record the charge when it gets the lock, after
    the accountant's locked path made it too. The fence ends that process first
    (pg_terminate_backend of its pid *and* start time), so the call is recorded once.
    ``unfenced`` shows what the fence prevents: with it disabled the same call is recorded
    twice (the test asserts that, so that it cannot pass vacuously)."""
    import os
    import socket
    import threading
    import time as _time

    import psycopg

    led = accountant.ledger
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))  # the locked path
    accountant.charge("d", ZCDP(rho="0.1"))  # optimistic: the connection's process is known
    (held,) = led.held_connections()
    drv = held.connection.driver_connection
    pid = drv.info.backend_pid
    if not fenced:
        monkeypatch.setattr(OptimisticCharges, "_fence", lambda self, ident: True)
    url = led.engine.url.set(drivername="postgresql")
    dsn = url.render_as_string(hide_password=False)
    blocker = psycopg.connect(dsn)
    blocker.execute("LOCK TABLE audit_head IN ACCESS EXCLUSIVE MODE")
    watch = psycopg.connect(dsn, autocommit=True)
    errors: list[BaseException] = []

    def waiting(p: int) -> bool:
        return watch.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND "
                             "wait_event_type = 'Lock'", (p,)).fetchone() is not None

    def gone(p: int) -> bool:
        return watch.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                             (p,)).fetchone() is None

    def lose_then_release() -> None:
        try:
            deadline = _time.monotonic() + 30
            while not waiting(pid):  # the optimistic statement waits for audit_head
                assert _time.monotonic() < deadline
                _time.sleep(0.01)
            sock = socket.socket(fileno=os.dup(drv.fileno()))
            sock.shutdown(socket.SHUT_RDWR)  # the client's side of the connection is lost
            sock.close()
            # fenced: the orphan is terminated; unfenced: it still waits for the lock. Then
            # the locked path on a new connection waits for audit_head too (after its row lock)
            while not (gone(pid) if fenced else watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND pid <> %s", (pid,)).fetchone()[0] >= 1):
                assert _time.monotonic() < deadline
                _time.sleep(0.01)
            _time.sleep(0.2)
            blocker.rollback()  # audit_head free: whoever waits goes on
            while not gone(pid):  # (unfenced: the orphan commits, then finds its client gone)
                assert _time.monotonic() < deadline
                _time.sleep(0.01)
        except BaseException as exc:  # reported by the test
            errors.append(exc)
            blocker.rollback()

    t = threading.Thread(target=lose_then_release)
    t.start()
    try:
        receipt = accountant.charge("d", ZCDP(rho="0.1"))
    finally:
        t.join(60)
        blocker.close()
        watch.close()
    assert errors == []
    assert not receipt.replayed
    charges = accountant.budget("d").charges
    if fenced:
        assert charges == 3 and accountant.budget("d").spent == {"rho": Decimal("0.3")}
    else:  # the orphan recorded it as well: what the fence is for
        assert charges == 4 and accountant.budget("d").spent == {"rho": Decimal("0.4")}
    assert led.verify().charges == charges


@_pg
def test_a_drain_never_chains_what_another_holder_of_k_chained(
        accountant: Any, ledger_url: str, monkeypatch: Any) -> None:
    """The draining append's snapshot is taken before its try of K, so it can still see a
    queued entry that another holder of K chains and deletes in between. Made to happen
    here: the statement sleeps (a ``pg_sleep`` in its first CTE) while a reader of the chain
    drains the queue and commits; then it is granted K. It chains only what its DELETE
    returned — not the entry already chained — so every charge is in the chain once
    (chaining from what it *saw* queued would chain that entry twice: ``audit verify``
    fails)."""
    import threading
    import time as _time

    from privcal.storage import Ledger, optimistic_sql
    from privcal.storage.optimistic import _CAS_PREPARED
    from tests.test_audit_queue import _queue, _sequencer_busy

    led = accountant.ledger
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.1"))  # the locked path
    accountant.charge("d", ZCDP(rho="0.1"))  # optimistic, the plain append
    with _sequencer_busy(led):
        accountant.charge("d", ZCDP(rho="0.1"))  # queued
    assert len(_queue(led)) == 1 and led._drain_mode
    real = optimistic_sql.pg_append_draining
    monkeypatch.setattr(optimistic_sql, "pg_append_draining", lambda source: real(
        source.replace("FROM (SELECT NULLIF", "FROM pg_sleep(1), (SELECT NULLIF")))
    del led.hot_sql.cas_charge  # the statements are written and prepared again
    (held,) = led.held_connections()
    held.info.pop(_CAS_PREPARED)
    pid = held.connection.driver_connection.info.backend_pid
    other = Ledger(ledger_url)
    drained: list[Any] = []

    def drain_while_it_sleeps() -> None:
        with other.engine.connect() as watch:
            deadline = _time.monotonic() + 30
            while watch.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p AND "
                                     "wait_event = 'PgSleep'"), {"p": pid}).first() is None:
                assert _time.monotonic() < deadline
                _time.sleep(0.01)
                watch.rollback()
        drained.append(other.sequence_audit())

    t = threading.Thread(target=drain_while_it_sleeps)
    t.start()
    try:
        accountant.charge("d", ZCDP(rho="0.1"))  # sleeps, then is granted K
    finally:
        t.join(60)
        other.close()
    assert drained == [1]  # the reader chained the queued entry while the charge slept
    assert _queue(led) == []
    v = led.verify()  # each charge in the chain once, no gap
    assert (v.charges, v.queued) == (4, 0)
