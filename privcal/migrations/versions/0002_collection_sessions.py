"""Collection sessions: collection_sessions and session_reports.

Hand-written and kept in step with privcal/storage/sessions.py; tests/test_ledger_schema.py
compares the two. Only new tables, so it is safe under SQLite batch mode.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "collection_sessions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column("method", sa.String(100), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("state", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("shuffled", sa.Boolean, nullable=False),
        sa.Column("requester", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("release_id", sa.Integer, sa.ForeignKey("releases.id"), nullable=True),
    )
    op.create_index("ix_collection_sessions_dataset_id", "collection_sessions", ["dataset_id"])
    op.create_table(
        "session_reports",
        # no FK on session_id, on purpose (see privcal/storage/sessions.py SessionReport)
        sa.Column("session_id", sa.Integer, primary_key=True),
        sa.Column("subject", sa.String(200), primary_key=True),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("value", sa.String(64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("session_reports")
    op.drop_index("ix_collection_sessions_dataset_id", table_name="collection_sessions")
    op.drop_table("collection_sessions")
