"""The audit entry of a release found by an index (red team 17, R7): partial expression
indexes ``ix_audit_log_release_id`` and ``ix_audit_queue_release_id``.

A release about to be used (predict, evaluate, ``release show``, ``Accountant.release``,
``GET /v1/releases/{id}``) is compared with the entry that recorded it
(:func:`privcal.storage.logged_rows.check_release_logged`). That entry was found by
``kind = 'release' AND payload LIKE '%"release_id":N,%'``: a scan of the whole log (0.45 s
instead of 0.004 s with 10⁶ entries on SQLite), on every use of a release. Each index holds,
for the entries of kind ``release`` only (a partial index: a charge's entry writes nothing
more, so the charge path is unchanged), the ``data.release_id`` its payload records:

* SQLite: ``CASE WHEN json_valid(payload) THEN json_extract(payload, '$.data.release_id')
  END`` (deterministic functions; the guard keeps an entry whose payload is not JSON —
  written outside privcal — from failing the migration or an UPDATE: it has no id, as the
  check never found one in it);
* PostgreSQL: ``privcal_release_id(payload)``, an IMMUTABLE PL/pgSQL function created here:
  ``(doc::json -> 'data' ->> 'release_id')::bigint``, NULL for a text that is not JSON or an
  id that is not an integer (an index expression must be immutable and must not raise for
  an existing row; PostgreSQL 15 has no ``IS JSON`` to guard with).

``audit_queue`` (PostgreSQL's entries waiting for the sequencer; never used on SQLite, which
gets the same index for one schema) holds a prefix without the seq: its expression reads
``prefix || '0}'``, the payload with seq 0 (:func:`privcal.storage.audit.payload_at`). The
queue is usually small, but it grows while the sequencer is behind, and its index costs a
charge nothing either.

The queries (privcal/storage/logged_rows.py) must spell the same expressions and the
literal ``kind = 'release'`` for the planners to use these indexes: tests/
test_migration_0011.py checks both plans. No data changes; the downgrade drops the indexes
(and the function).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PG_FUNCTION = """
CREATE FUNCTION privcal_release_id(doc text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN (doc::json -> 'data' ->> 'release_id')::bigint;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$
"""


def _sqlite_id(col: str) -> str:
    return (f"CASE WHEN json_valid({col}) THEN json_extract({col}, '$.data.release_id') "
            "END")


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    if pg:
        op.execute(_PG_FUNCTION)
    for table, col in (("audit_log", "payload"), ("audit_queue", "prefix || '0}'")):
        expr = f"privcal_release_id({col})" if pg else _sqlite_id(col)
        op.execute(f"CREATE INDEX ix_{table}_release_id ON {table} (({expr})) "
                   "WHERE kind = 'release'")


def downgrade() -> None:
    op.execute("DROP INDEX ix_audit_queue_release_id")
    op.execute("DROP INDEX ix_audit_log_release_id")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION privcal_release_id(text)")
