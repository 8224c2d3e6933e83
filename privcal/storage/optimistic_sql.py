"""The optimistic charge's SQL on PostgreSQL (issue 11): its statements — the charge with the
cap checked in its UPDATE; the audit append, plain or draining the audit queue — their
server-side prepared form, and the message that runs them. What they do and why they are
exact under concurrency: :mod:`privcal.storage.optimistic`, which sends them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Integer, Numeric, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from privcal.storage.audit_queue import CHARGE_ID_HEAD, pg_append_draining, pg_append_with
from privcal.storage.models import Charge, Dataset
from privcal.storage.statements import SPENT_COLUMNS, Codec

__all__ = ["cas_charge_sql", "cas_message", "policy_columns", "prepared"]

#: the transaction-local setting that carries the charge id from statement 1 to statement 2
_SETTING = "privcal.cas_charge"
#: the optimistic message's first statement: generic plans of its prepared statements, for
#: this implicit transaction only (a multi-statement message is one transaction block, where
#: SET LOCAL applies: :func:`cas_message`)
_GENERIC = "SET LOCAL plan_cache_mode = force_generic_plan"


def _pg_type(t: TypeEngine[Any], dialect: Dialect) -> str:
    """The PostgreSQL type a parameter for a column of type ``t`` is cast to (the statement
    goes by the simple protocol, where psycopg binds values as literals)."""
    if isinstance(t, TypeDecorator):
        t = t.load_dialect_impl(dialect)
    for cls, name in ((JSON, "jsonb"), (Boolean, "boolean"), (Integer, "bigint"),
                      (Numeric, "numeric"), (DateTime, "timestamptz"), (String, "text")):
        if isinstance(t, cls):
            return name
    raise TypeError(f"no PostgreSQL cast for {t!r}")  # pragma: no cover - a new column type


#: the dataset columns a charge writes: its running totals and its count; every other column
#: is the dataset's *policy* (name, notion, caps, Rényi orders …), compared with the snapshot
_WRITTEN = (*SPENT_COLUMNS, "charge_count")


def policy_columns(dataset: Codec) -> list[str]:
    """The dataset columns the optimistic charge compares with the snapshot: all but the id
    and :data:`_WRITTEN` (:attr:`Codec.names` order)."""
    return [n for n in dataset.names if n != "id" and n not in _WRITTEN]


def cas_charge_sql(dialect: Dialect, dataset: Codec, charge_cols: tuple[str, ...]) -> str:
    """The optimistic charge's statements (:mod:`privcal.storage.optimistic`): the charge,
    then two forms of its audit append, of which a message runs one (:func:`cas_message`).
    Parameters, in order: the cost's increments of the totals
    (:data:`~privcal.storage.statements.SPENT_COLUMNS` order) and its kind (``pure``,
    ``zcdp``, ``approx``); the dataset id; the snapshot's policy columns
    (:func:`policy_columns`) and then its totals; the idempotency key, the dataset id and the
    key again; the charge's columns (``charge_cols``); the entry's kind and its prefix after
    the charge id. Statement 1 returns the new dataset row and the charge id (no row:
    nothing written); the plain append (granted, chained, head rows moved, charge id); the
    draining one (the same, and the queued entries it chained).

    **The budget check is the UPDATE's own** (the filter of
    :func:`~privcal.accountant.privacy.filters.check_charge`, exact ``numeric`` arithmetic
    on the row as committed): under a pure-ε cap, a pure cost whose new Σε is ≤ the cap;
    under a ρ-zCDP cap, a pure or zCDP cost whose new Σε²/2 + Σρ is ≤ the cap. The totals
    are set to the row's own plus the increments, so a concurrent charge of the same
    dataset — which the snapshot has not seen — does not fail the statement: it waits for
    that charge's COMMIT and checks the cap against the totals it left (the EvalPlanQual
    re-check of the WHERE clause, and the SET computed from the newest row version). The
    stored totals are what the locked path's Python would store: the same exact sums (a
    cost has at most 12 decimal places, ε²/2 at most 25, the columns keep 30). Under an
    (ε, δ) cap, whose Rényi filter is not SQL, the statement is the compare-and-set of the
    totals themselves (the Python check ran against exactly those totals). The policy
    columns must equal the snapshot (the caller's check and increments were made under
    it) — so an administrator's UPDATE of the cap or the notion, or a renamed dataset, is
    never charged past.

    The key's look-up is gated by ``key IS NOT NULL`` — a one-time filter of the plan: a
    prepared statement may run a generic plan, and one built on stale statistics scanned
    every charge of the dataset by ``ix_charges_dataset_id`` to find no row for a NULL key,
    so an unkeyed charge cost O(charges of the dataset) (1.0 → 2.2 ms per charge over
    12 000 charges); keyed look-ups go by ``uq_charge_idem``, the only index on
    ``charges.dataset_id`` since migration 0007.

    Statement 1 also requires the audit head row (a charge is not recorded without it, as
    on the locked path, which then refuses it with a one-line error)."""
    dcols = {c.name: c for c in Dataset.__table__.c}
    ccols = {c.name: c for c in Charge.__table__.c}
    same = []
    for n in policy_columns(dataset):
        ty = _pg_type(dcols[n].type, dialect)
        # JSON: compared as jsonb, SQL NULL as JSON null (both load as None)
        col = f"coalesce({n}::jsonb, 'null'::jsonb)" if ty == "jsonb" else n
        same.append(f"{col} IS NOT DISTINCT FROM %s::{ty}")
    eps, prho, zrho = SPENT_COLUMNS[:3]
    incs = ", ".join(f"%s::numeric AS {c}" for c in SPENT_COLUMNS)
    sets = ", ".join(f"{c} = datasets.{c} + v.{c}" for c in SPENT_COLUMNS)
    unchanged = " AND ".join(f"datasets.{c} IS NOT DISTINCT FROM %s::numeric"
                             for c in SPENT_COLUMNS)
    # Policy and check_charge of privcal.accountant.privacy.filters, in SQL (docstring)
    fits = (
        "CASE datasets.notion "
        f"WHEN 'pure' THEN v.kind = 'pure' AND datasets.{eps} + v.{eps} <= datasets.cap_epsilon "
        f"WHEN 'zcdp' THEN v.kind IN ('pure', 'zcdp') AND datasets.{prho} + v.{prho} "
        f"+ datasets.{zrho} + v.{zrho} <= datasets.cap_rho "
        f"ELSE {unchanged} END")
    values = ", ".join(f"%s::{_pg_type(ccols[n].type, dialect)}" for n in charge_cols)
    upd_cols = ", ".join(f"upd.{n}" for n in dataset.names)
    ret_cols = ", ".join(f"datasets.{n}" for n in dataset.names)
    first = (
        f"WITH v AS (SELECT {incs}, %s::text AS kind), "
        f"upd AS (UPDATE datasets SET charge_count = datasets.charge_count + 1, {sets} "
        f"FROM v WHERE datasets.id = %s::bigint AND {' AND '.join(same)} AND ({fits}) "
        "AND NOT EXISTS (SELECT 1 FROM charges WHERE %s::text IS NOT NULL "
        "AND dataset_id = %s::bigint AND idempotency_key = %s::text) "
        "AND EXISTS (SELECT 1 FROM audit_head WHERE id = 1) "
        f"RETURNING {ret_cols}), "
        f"c AS (INSERT INTO charges ({', '.join(charge_cols)}) SELECT {values} FROM upd "
        "RETURNING id) "
        f"SELECT {upd_cols}, set_config('{_SETTING}', c.id::text, true) FROM upd, c")
    entry = (f"p AS (SELECT x.id, %s::text AS kind, '{CHARGE_ID_HEAD}' || x.id::text || "
             f"%s::text AS prefix FROM (SELECT NULLIF(current_setting('{_SETTING}', true), "
             "'')::bigint AS id) AS x WHERE x.id IS NOT NULL)")
    return "; ".join([first, pg_append_with(entry, commit_now=True), pg_append_draining(entry)])


def prepared(sql: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``sql`` (statements with ``%s`` parameters, ``"; "`` between them) as server-side
    prepared statements: ``(name, PREPARE statement)`` for each, sent once per connection
    (ahead of its first charge, in the same message), and the ``EXECUTE`` of each, for
    :func:`cas_message`. The server then parses and plans the charge once per connection,
    not once per charge (a simple-protocol message, which the one-round-trip transaction
    needs, cannot use the extended protocol's prepared statements). Names carry a digest of
    the text: another version's statements never collide."""
    digest = hashlib.sha256(sql.encode()).hexdigest()[:16]
    prepares, executes = [], []
    for i, stmt in enumerate(sql.split("; WITH "), 1):
        stmt = stmt if i == 1 else f"WITH {stmt}"
        parts = stmt.split("%s")
        body = parts[0] + "".join(f"${j}{part}" for j, part in enumerate(parts[1:], 1))
        name = f"privcal_cas_{digest}_{i}"
        prepares.append((name, f"PREPARE {name} AS {body}"))
        executes.append(f"EXECUTE {name}({', '.join(['%s'] * (len(parts) - 1))})")
    return prepares, executes


def cas_message(executes: list[str], drain: bool) -> str:
    """The optimistic charge's message: the charge, then the plain audit append or, with
    ``drain``, the draining one (``executes`` as :func:`prepared` gives them for
    :func:`cas_charge_sql`). The plain append costs the server less (≈ 0.08 ms of its CPU per
    charge, measured), the draining one empties a queue the plain one would only join
    (:mod:`privcal.storage.optimistic` chooses).

    The message first sets ``plan_cache_mode`` to ``force_generic_plan`` for its own
    transaction only (:data:`_GENERIC`): left to ``auto``, the server kept choosing a custom
    plan — planning the statements again at every charge, ≈ 0.3 ms of server time per
    charge, measured (1.24–1.33 → 0.89–0.93 ms per warm charge, one client). The generic
    plan reads no more than a custom one: every look-up is by primary key or by
    ``uq_charge_idem`` behind a ``key IS NOT NULL`` gate (tests/test_migration_0007.py
    checks the key look-up under a generic plan)."""
    return "; ".join([_GENERIC, executes[0], executes[2 if drain else 1]])
