"""The audit queue: entries committed with their rows, numbered into the chain afterwards
(issue 11).

Hand-written and kept in step with privcal/storage/models.py (``AuditQueue``);
tests/test_ledger.py compares the two. One new table, ``audit_queue`` (id, kind, the
canonical prefix of :func:`privcal.storage.audit.entry_prefix`, created_at), on both
backends: PostgreSQL writers queue their entries there when the audit sequencer is busy
(:mod:`privcal.storage.audit_queue`); SQLite never queues (its writers hold the database
write lock from BEGIN IMMEDIATE anyway), but has the same table so that both backends
share one schema, one model, and ``audit verify`` checks the table on both (a row in it
on SQLite was inserted outside privcal). Nothing already in the chain changes.

Downgrade first numbers any queued entries into the chain (under the sequencer's lock on
PostgreSQL), so no entry is lost, then drops the table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_queue",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("prefix", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
    )


def downgrade() -> None:
    from privcal.storage import audit
    from privcal.storage.audit_queue import SEQUENCER_LOCK

    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"SELECT pg_advisory_xact_lock({SEQUENCER_LOCK})"))
    rows = conn.execute(sa.text("SELECT kind, prefix FROM audit_queue ORDER BY id")).all()
    if rows:
        seq, prev = conn.execute(sa.text(
            "SELECT seq, entry_hash FROM audit_head WHERE id = 1")).one()
        for kind, prefix in rows:
            seq += 1
            payload = audit.payload_at(prefix, seq)
            entry_hash = audit.chain_hash(prev, payload)
            conn.execute(sa.text("INSERT INTO audit_log (seq, kind, payload, prev_hash, "
                                 "entry_hash) VALUES (:s, :k, :p, :prev, :h)"),
                         {"s": seq, "k": kind, "p": payload, "prev": prev, "h": entry_hash})
            prev = entry_hash
        conn.execute(sa.text("UPDATE audit_head SET seq = :s, entry_hash = :h WHERE id = 1"),
                     {"s": seq, "h": prev})
    op.drop_table("audit_queue")
