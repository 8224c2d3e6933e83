"""Which release each charge paid for: the table ``release_charges`` (red team 5, F3).

``record_release`` checked that none of a new release's charges already paid for another
release by expanding the JSON ``charge_ids`` of every release of the dataset under the
dataset's lock: 200 ms per release at 300 000 releases. ``release_charges`` (charge_id
PRIMARY KEY, release_id indexed) holds one row per element of a release's ``charge_ids``;
every release insert writes its rows, so "a charge pays for one release" is enforced by the
primary key and looked up by index. The upgrade back-fills it from the existing releases, in
release order; a charge named by two releases of an old ledger keeps its first release (no
crash) and ``audit verify`` reports the second, as it did. ``releases.charge_ids`` stays the
hash-chained source: verify derives ownership from it and checks this table against it. The
downgrade drops the table (nothing else reads it). The audit chain is untouched.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: rows per INSERT of the back-fill
_BATCH = 5000


def upgrade() -> None:
    table = op.create_table(
        "release_charges",
        sa.Column("charge_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("release_id", sa.Integer, nullable=False),
    )
    op.create_index("ix_release_charges_release_id", "release_charges", ["release_id"])
    conn = op.get_bind()
    owner: dict[int, int] = {}
    for rid, ids in conn.execute(sa.text("SELECT id, charge_ids FROM releases ORDER BY id")):
        if isinstance(ids, str | bytes):
            try:
                ids = json.loads(ids)
            except ValueError:
                continue  # not a list: verify reports the release
        if not isinstance(ids, list):
            continue
        for cid in ids:
            if isinstance(cid, int) and not isinstance(cid, bool):
                owner.setdefault(cid, int(rid))  # a second owner: verify reports it
    rows = [{"charge_id": c, "release_id": r} for c, r in sorted(owner.items())]
    for k in range(0, len(rows), _BATCH):
        op.bulk_insert(table, rows[k:k + _BATCH])


def downgrade() -> None:
    op.drop_index("ix_release_charges_release_id", table_name="release_charges")
    op.drop_table("release_charges")
