"""One index on ``charges.dataset_id``: drop ``ix_charges_dataset_id`` (issue 11).

``uq_charge_idem`` (dataset_id, idempotency_key) already serves every look-up by dataset
(its leading column). With the second, single-column index, a prepared statement's generic
plan — built on the statistics of a young or fast-growing table — could look a charge up
by idempotency key through ``ix_charges_dataset_id`` and filter the key, reading every
charge of the dataset: measured on PostgreSQL 15, 4 200 rows removed by the filter, 1.0 ms
per look-up, growing with the dataset's charges. With one index the look-up is an index-only
probe of ``uq_charge_idem`` whatever the plan, and every charge writes one index entry fewer
(both backends). No data changes; the audit chain is untouched.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_charges_dataset_id", table_name="charges")


def downgrade() -> None:
    op.create_index("ix_charges_dataset_id", "charges", ["dataset_id"])
