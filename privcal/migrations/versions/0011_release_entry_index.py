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
* PostgreSQL: ``("substring"(payload, '"release_id":([0-9]{1,18})'::text))::bigint``, the digits
  after the text's first ``"release_id":`` (NULL where there is none) — built-in, immutable,
  never raising, parallel safe, and needing no function of privcal's: a PL/pgSQL function
  parsing the JSON with an exception handler (the first version of this migration, never
  released) broke every parallel index build (``cannot start subtransactions during a
  parallel operation``: any audit_log over 8 MB), a REINDEX, a restore, and a role without
  EXECUTE on it (review of red team 17, F1/F2). The first occurrence is the entry's own id:
  a release document's nested objects (params, coverage, privacy, diagnostics) record no
  ``release_id``, and text a caller gave (a purpose, a requester) cannot produce one — its
  quotes are escaped. Where some nested key did, the look-up would miss and the release be
  refused (fail-closed): the check compares the parsed document with the row either way.

``audit_queue`` (PostgreSQL's entries waiting for the sequencer; never used on SQLite, which
gets the same index for one schema) holds a prefix without the seq, but with the release id:
its expression reads ``prefix`` (SQLite: ``prefix || '0}'``, the payload with seq 0,
:func:`privcal.storage.audit.payload_at`, which JSON parses). The queue is usually small, but
it grows while the sequencer is behind, and its index costs a charge nothing either.

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

#: the release id of an entry's text on PostgreSQL (the module docstring)
_PG_ID = "(\"substring\"({col}, '\"release_id\":([0-9]{{1,18}})'::text))::bigint"


def _sqlite_id(col: str) -> str:
    return (f"CASE WHEN json_valid({col}) THEN json_extract({col}, '$.data.release_id') "
            "END")


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    for table, col in (("audit_log", "payload"), ("audit_queue", "prefix")):
        if pg:
            expr = _PG_ID.format(col=col)
        else:
            expr = _sqlite_id(col if table == "audit_log" else "prefix || '0}'")
        op.execute(f"CREATE INDEX ix_{table}_release_id ON {table} (({expr})) "
                   "WHERE kind = 'release'")


def downgrade() -> None:
    op.execute("DROP INDEX ix_audit_queue_release_id")
    op.execute("DROP INDEX ix_audit_log_release_id")
