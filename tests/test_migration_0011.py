"""Migration 0011 (red team 17, R7): the audit entry of a release about to be used is found
by an index, not a scan of the log (``kind = 'release' AND payload LIKE …`` read every entry:
0.45 s with 10⁶ entries on SQLite, on every use of a release).

The plans checked are those of the statements the check itself runs (captured while
``Accountant.release`` runs), so a query whose expression drifts from the index's fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, text

from privcal import Accountant, Ledger
from privcal.costs import PureDP
from privcal.errors import AuditFailed, SchemaOutOfDate
from privcal.storage.models import release_id_sql

S = np.random.default_rng(0).random(300)
INDEXES = {"ix_audit_log_release_id", "ix_audit_queue_release_id"}


def _indexes(ledger: Ledger) -> set[str]:
    """The names of the indexes of the ledger (SQLAlchemy does not reflect SQLite's
    expression indexes)."""
    q = ("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
         if ledger.backend == "postgresql" else
         "SELECT name FROM sqlite_master WHERE type = 'index'")
    with ledger.engine.connect() as conn:
        return set(conn.execute(text(q)).scalars())


def _made(ledger: Ledger) -> tuple[Accountant, list[int]]:
    acct = Accountant(ledger)
    acct.create_dataset("d", epsilon=100, allow_nonprivate=True)
    ids = []
    for i in range(3):
        acct.charge("d", PureDP(eps=0.1))  # entries of another kind between the releases
        ids.append(acct.calibrate("split", dataset="d", scores=S[: 100 + i],
                                  alpha=0.1).id)
    return acct, ids


@contextmanager
def _entry_queries(ledger: Ledger) -> Iterator[list[tuple[str, Any]]]:
    """The statements (and parameters) reading audit_log or audit_queue while inside."""
    seen: list[tuple[str, Any]] = []

    def hook(_conn: Any, _cur: Any, stmt: str, params: Any, *_: Any) -> None:
        if re.search(r"FROM audit_(log|queue)\b", stmt):
            seen.append((stmt, params))

    event.listen(ledger.engine, "before_cursor_execute", hook)
    try:
        yield seen
    finally:
        event.remove(ledger.engine, "before_cursor_execute", hook)


def _plan(ledger: Ledger, stmt: str, params: Any) -> str:
    """The plan of one captured statement: SQLite's EXPLAIN QUERY PLAN; PostgreSQL's EXPLAIN
    of it prepared under a generic plan (what psycopg's server-side preparation may run),
    with sequential scans priced out so that a usable index is the one chosen."""
    drv = ledger.engine.raw_connection()
    try:
        cur = drv.cursor()
        if ledger.backend == "sqlite":
            cur.execute(f"EXPLAIN QUERY PLAN {stmt}", params)
            return "\n".join(str(r[-1]) for r in cur.fetchall())
        names = list(params)
        sql = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", stmt)
        cur.execute("SET enable_seqscan = off")
        cur.execute("SET plan_cache_mode = force_generic_plan")
        cur.execute(f"PREPARE q AS {sql}")
        cur.execute("EXPLAIN EXECUTE q(" + ", ".join(["NULL"] * len(names)) + ")")
        return "\n".join(r[0] for r in cur.fetchall())
    finally:
        drv.rollback()
        drv.close()


def test_the_check_finds_the_entry_through_the_indexes(ledger: Any) -> None:
    acct, ids = _made(ledger)
    with _entry_queries(ledger) as seen:
        assert acct.release(ids[1]).id == ids[1]
    plans = [_plan(ledger, stmt, params) for stmt, params in seen]
    assert len(plans) == 2, seen  # one look-up per table
    for table, plan in zip(("audit_log", "audit_queue"), plans, strict=True):
        if ledger.backend == "sqlite":
            assert f"SEARCH {table} USING INDEX ix_{table}_release_id" in plan, plan
        else:
            assert f"Index Scan using ix_{table}_release_id on {table}" in plan, plan
            assert "Seq Scan" not in plan, plan


def test_upgrade_from_0010_adds_the_indexes_and_downgrade_drops_them(
        ledger_url: str) -> None:
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    assert INDEXES <= _indexes(ledger)
    acct, ids = _made(ledger)
    ledger.downgrade("0010")
    assert not INDEXES & _indexes(ledger)
    # a ledger at 0010 is refused until upgraded, naming the upgrade
    with pytest.raises(SchemaOutOfDate, match=r"at revision 0010, this privcal needs "
                                              r"revision 0011: run `privcal db upgrade`"):
        Accountant(Ledger(ledger_url)).release(ids[0])
    assert ledger.upgrade() == ledger.head_revision() == "0011"
    assert INDEXES <= _indexes(ledger)
    # the releases made before are found through the new indexes; the log still verifies
    assert [acct.release(i).id for i in ids] == ids
    assert acct.verify().releases == 3
    ledger.close()


def test_a_tampered_payload_that_is_not_json_upgrades_and_is_reported(
        ledger_url: str) -> None:
    """An entry edited outside privcal into text that is not JSON: the index expression
    gives it no id (it neither fails the migration nor the edit), the release it recorded is
    refused as having no entry, and ``audit verify`` reports the entry in one line."""
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct, ids = _made(ledger)
    ledger.downgrade("0010")
    with ledger.engine.begin() as conn:
        seq = conn.execute(text(
            "SELECT seq FROM audit_log WHERE kind = 'release' ORDER BY seq")).scalars().all()[1]
        conn.execute(text("UPDATE audit_log SET payload = 'not json {' WHERE seq = :s"),
                     {"s": seq})
    assert ledger.upgrade() == "0011" and INDEXES <= _indexes(ledger)
    with ledger.engine.begin() as conn:  # and after the migration, another entry likewise
        first = conn.execute(text("SELECT min(seq) FROM audit_log WHERE kind = 'release'"))
        conn.execute(text("UPDATE audit_log SET payload = '{\"data\": [' WHERE seq = :s"),
                     {"s": first.scalar_one()})
    for rid in ids[:2]:
        with pytest.raises(AuditFailed, match=rf"^release {rid} refused: release {rid} has "
                                              r"no audit entry .*; run `privcal audit verify`$"):
            acct.release(rid)
    assert acct.release(ids[2]).id == ids[2]
    with pytest.raises(AuditFailed) as err:
        acct.verify()
    assert "\n" not in str(err.value) and "audit entry" in str(err.value)
    ledger.close()



@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_a_release_whose_entry_is_still_queued_is_found_through_the_queue_index(
        ledger_url: str) -> None:
    """PostgreSQL's queue holds an entry's prefix without its seq; its index reads the
    release id of ``prefix || '0}'``. A release recorded while the sequencer is busy, read
    through a ledger that may not chain the queue, is found there (and refused once its
    row is edited, naming the queued entry)."""
    from urllib.parse import quote

    from privcal.storage.audit_queue import SEQUENCER_LOCK

    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct, _ = _made(ledger)
    with ledger.engine.connect() as busy:
        busy.execute(text(f"SELECT pg_advisory_lock({SEQUENCER_LOCK})"))
        busy.commit()
        try:
            queued = acct.calibrate("split", dataset="d", scores=S, alpha=0.2).id
        finally:
            busy.execute(text(f"SELECT pg_advisory_unlock({SEQUENCER_LOCK})"))
            busy.commit()
    with ledger.engine.connect() as conn:
        found = conn.execute(text(
            "SELECT id FROM audit_queue WHERE kind = 'release' "
            f"AND {release_id_sql('postgresql', 'audit_queue')} = :r"),
            {"r": queued}).scalars().all()
    assert len(found) == 1
    ro = Ledger(ledger_url + quote(" -cdefault_transaction_read_only=on"))
    try:
        reader = Accountant(ro)
        assert reader.release(queued).id == queued
        with ledger.engine.begin() as conn:
            conn.execute(text("UPDATE releases SET threshold = '0.5' WHERE id = :i"),
                         {"i": queued})
        with pytest.raises(AuditFailed, match=rf"^release {queued} refused: queued audit "
                                              rf"entry \(queue id {found[0]}\): release "
                                              rf"{queued} differs"):
            reader.release(queued)
    finally:
        ro.close()
    ledger.close()


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_a_parallel_index_build_and_parallel_plans_work(ledger_url: str) -> None:
    """Review of red team 17, F1: the first version indexed a PL/pgSQL function with an
    exception handler, declared PARALLEL SAFE; PostgreSQL builds the index of a table over
    ``min_parallel_table_scan_size`` (8 MB) in parallel workers, which may not open the
    handler's subtransaction — the upgrade of every real-sized ledger failed, and could not
    be retried. Here parallelism is forced on a small ledger: the upgrade from 0010, a
    REINDEX and the check's reads all succeed."""
    from urllib.parse import quote

    forced = quote(" -cmax_parallel_maintenance_workers=2 -cmin_parallel_table_scan_size=0"
                   " -cparallel_setup_cost=0 -cparallel_tuple_cost=0"
                   " -cmin_parallel_index_scan_size=0")
    ledger = Ledger(ledger_url + forced)
    ledger.upgrade()
    acct, ids = _made(ledger)
    with ledger.engine.begin() as conn:  # enough rows that a parallel build is planned
        conn.execute(text("INSERT INTO audit_log (seq, kind, payload, prev_hash, entry_hash) "
                          "SELECT 100000 + g, 'release', payload, prev_hash, entry_hash "
                          "FROM audit_log, generate_series(1, 2000) g "
                          "WHERE kind = 'release' AND seq = (SELECT max(seq) FROM audit_log "
                          "WHERE kind = 'release')"))
    ledger.downgrade("0010")
    assert ledger.upgrade() == "0011" and INDEXES <= _indexes(ledger)
    with ledger.engine.begin() as conn:
        conn.execute(text("REINDEX INDEX ix_audit_log_release_id"))
        conn.execute(text("DROP INDEX ix_audit_log_release_id"))  # reads without it: scans
    assert acct.release(ids[0]).id == ids[0]
    ledger.close()


def test_a_new_sqlite_ledger_has_the_indexes_from_its_first_use(tmp_path: Any) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'new.sqlite'}")
    Accountant(ledger).create_dataset("d", epsilon=1)  # first use: created and migrated
    assert INDEXES <= _indexes(ledger)
    ledger.close()
