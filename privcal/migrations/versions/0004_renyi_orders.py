"""The (ε, δ) filter's grid of Rényi orders: datasets.renyi_orders (issue 14).

Hand-written and kept in step with privcal/storage/models.py. One nullable JSON column,
added and dropped natively (no batch table copy).

Existing rows keep NULL. For an (ε, δ) dataset, NULL means the frozen grid
``privcal.accountant.privacy.filters.MIGRATED_RENYI_ORDERS`` (1.25, 1.5, 2, 3, 5, 9, …, 1025), so
its audit entry — written before the grid existed, without a ``renyi_orders`` key — still
verifies, and the rule it is charged under is re-derivable. The migration is conservative:
for the same totals the new ε term min_{a∈A} f_a(Σρ, D/(2|A|)) is ≥ the old CKS20(Σρ, D/2)
(δ/(2|A|) ≤ δ/2 and a minimum over A ⊂ (1, ∞) ≥ the infimum over all a > 1), and the δ rule
is unchanged, so nothing the old rule refused becomes allowed
(tests/test_adaptive_filter.py checks it with hypothesis). Charges recorded before the
upgrade were accepted under the old rule and stay recorded as they are.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # a nullable ADD COLUMN is native on both backends: no table copy (a batch copy of
    # `datasets` would trip the foreign keys of `charges` on SQLite)
    op.add_column("datasets", sa.Column("renyi_orders", sa.JSON, nullable=True))


def downgrade() -> None:
    # SQLite ≥ 3.35 drops a plain column natively; Alembic's batch mode would copy the table,
    # which fails while `charges` references it. Datasets created after 0004 lose their grid
    # (and their audit entries then no longer match the rows: do not downgrade a live ledger).
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE datasets DROP COLUMN renyi_orders")
    else:
        op.drop_column("datasets", "renyi_orders")
