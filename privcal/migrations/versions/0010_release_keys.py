"""The idempotency key of a non-private calibration: the table ``release_keys``.

A key binds a request through the charge that carries it; a non-private release (split on an
``--allow-nonprivate`` dataset) charges nothing, so its key bound nothing: in the library and
the CLI a retry recorded a second release and another request under the same key was run
without a word; the HTTP service bound it only in its own record, written after the release
(red team 12, r12crash F5: a server that died in between let a retry calibrate again).
``release_keys`` (dataset_id, idempotency_key) PRIMARY KEY, with the request's digest and the
release it made, is written in the release's own transaction: the same key and request
return that release, another request under the key is refused. Not in the audit chain (like
the service's idempotency records: README, "what a database administrator can do"). No
existing row changes; the downgrade drops the table (older code never reads it).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "release_keys",
        sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), primary_key=True,
                  autoincrement=False),
        sa.Column("idempotency_key", sa.String(200), primary_key=True),
        sa.Column("request_digest", sa.String(64), nullable=False),
        sa.Column("release_id", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("release_keys")
