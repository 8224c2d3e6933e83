"""Migration 0007: one index on ``charges.dataset_id`` (issue 11), and look-ups by
idempotency key that never read every charge of a dataset, whatever plan the server picks.

On PostgreSQL 15, a prepared statement's *generic* plan built on a young table's statistics
looked a key up through the single-column ``ix_charges_dataset_id`` and filtered the key,
reading every charge of the dataset; the optimistic charge (storage/optimistic.py) did so for
every *unkeyed* charge too (a NULL key), so a charge grew slower with each charge of its
dataset (1.0 → 2.2 ms over 12 000 charges). The PostgreSQL test below fails on the code
before this migration and the NULL-key gate (checked by reverting both).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import inspect, text

from privcal.accountant import Accountant
from privcal.costs import ZCDP
from privcal.storage import Ledger
from privcal.storage.optimistic_sql import cas_charge_sql


def _charge_indexes(ledger: Ledger) -> set[str]:
    with ledger.engine.connect() as conn:
        return {i["name"] for i in inspect(conn).get_indexes("charges")}


def test_upgrade_drops_the_single_column_index_and_downgrade_restores_it(
        ledger_url: str) -> None:
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct = Accountant(ledger)
    acct.create_dataset("d", rho=1)
    acct.charge("d", ZCDP(rho="0.1"), idempotency_key="k")
    assert "ix_charges_dataset_id" not in _charge_indexes(ledger)

    ledger.downgrade("0006")
    assert "ix_charges_dataset_id" in _charge_indexes(ledger)
    assert ledger.upgrade("0007") == "0007"
    assert "ix_charges_dataset_id" not in _charge_indexes(ledger)
    assert ledger.upgrade() == ledger.head_revision()
    # the data is untouched: the key still replays, new charges chain, the log verifies
    assert acct.charge("d", ZCDP(rho="0.1"), idempotency_key="k").replayed
    acct.charge("d", ZCDP(rho="0.2"))
    rep = acct.verify()
    assert rep.charges == 2
    ledger.close()


def _charges_rows_read(plan: Any) -> int:
    """Rows of ``charges`` a plan (EXPLAIN ANALYZE, JSON) read: returned plus filtered out."""
    n = 0
    if isinstance(plan, dict):
        if plan.get("Relation Name") == "charges":
            loops = plan.get("Actual Loops", 1)
            n += loops * (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0))
        for v in plan.values():
            n += _charges_rows_read(v)
    elif isinstance(plan, list):
        n += sum(_charges_rows_read(v) for v in plan)
    return n


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_key_look_ups_read_no_other_charge_under_a_generic_plan(ledger_url: str) -> None:
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct = Accountant(ledger)
    acct.create_dataset("d", rho=10**6)
    for i in range(300):  # no ANALYZE: the planner's statistics are those of a young table
        acct.charge("d", ZCDP(rho="0.001"), idempotency_key="k0" if i == 0 else None)
    with ledger.engine.connect() as conn:
        ds_id = conn.execute(text("SELECT id FROM datasets WHERE name = 'd'")).scalar_one()
    q = ledger.hot_sql
    first = cas_charge_sql(ledger.engine.dialect, q.dataset, q.charge_cols).split("; WITH ")[0]
    key_check = first[first.index("NOT EXISTS (") + len("NOT EXISTS "):]
    key_check = key_check[:key_check.index(") AND EXISTS") + 1]
    drv = ledger.engine.raw_connection()
    try:
        from psycopg import ClientCursor

        cur = ClientCursor(drv.driver_connection)  # EXECUTE's arguments bound as literals
        cur.execute("SET plan_cache_mode = force_generic_plan")
        # the locked path's look-up (psycopg prepares it server-side after a few runs)
        by_key = q.by_key.replace("%s", "$1", 1).replace("%s", "$2", 1)
        cur.execute(f"PREPARE by_key(bigint, text) AS {by_key}")
        # the optimistic charge's gate and look-up (its own parameters: key, id, key)
        gate = key_check.replace("%s::text", "$1::text", 1).replace(
            "%s::bigint", "$2::bigint", 1).replace("%s::text", "$1::text", 1)
        cur.execute(f"PREPARE cas_key(text, bigint) AS SELECT EXISTS {gate}")
        for stmt, params, found in (("by_key", (ds_id, "k0"), 1), ("by_key", (ds_id, "kx"), 0),
                                    ("cas_key", (None, ds_id), 0),
                                    ("cas_key", ("k0", ds_id), 1),
                                    ("cas_key", ("kx", ds_id), 0)):
            cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {stmt}(%s, %s)", params)
            plan = cur.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            assert _charges_rows_read(plan) == found, (stmt, params, plan)
    finally:
        drv.rollback()
        drv.close()
        ledger.close()

