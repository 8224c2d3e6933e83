"""Keyed request fingerprints: ``idempotency_records.fingerprint`` becomes an HMAC.

Until now the service stored the SHA-256 of each request's canonical body; an ingestor's
batch body holds subject ids and their reports, so whoever read the table could test a
guess "subject X reported v" against it — what the keyed pseudonyms exist to prevent. Each
stored digest d becomes :func:`~privcal.storage.request_fingerprints.keyed_fingerprint` of
d, under the ledger's subject key (``ledger_secret``, made by 0005), which is what the
service now stores for a request, and no unkeyed digest is left. A retry that spans the
upgrade replays when the older privcal fingerprinted its request as this one does; where it
did not (a calibration's fingerprint gained fields since 0003; code between 0007 and 0008
stored keyed digests without their ``k:``, which this keys again), the retry is answered
409 ``idempotency-key-reused`` naming the recorded answer and carrying it
(:func:`privcal.service.common.refuse_reused_or_running`): nothing runs twice, and the
client learns its request was done (red team 9). The downgrade cannot recover the digests
(an HMAC is one-way): it leaves the keyed ones, which the older code compares with its
unkeyed digest and so answers a retry under an old key "Idempotency-Key reused" (409) — it
fails closed, nothing runs twice; they begin with ``k:``, so upgrading again keys only the
digests written in between.
No other table changes; the audit chain is untouched.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from privcal.storage.models import read_ledger_secret
from privcal.storage.request_fingerprints import KEYED, keyed_fingerprint

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    conn = op.get_bind()
    secret = read_ledger_secret(conn)  # on the driver: never in SQLAlchemy's row log
    rows = [r for r in conn.execute(sa.text(
        "SELECT principal, key, fingerprint FROM idempotency_records")).all()
        if not r[2].startswith(KEYED)]  # keyed by an earlier upgrade (then a downgrade)
    if not rows:
        return
    if secret is None:  # (0005 makes the secret: not reached on a migrated ledger)
        raise RuntimeError("idempotency records but no ledger_secret row: cannot key them")
    key = bytes.fromhex(secret)
    conn.execute(
        sa.text("UPDATE idempotency_records SET fingerprint = :f "
                "WHERE principal = :p AND key = :k"),
        [{"f": keyed_fingerprint(key, fp), "p": p, "k": k} for p, k, fp in rows])


def downgrade() -> None:
    pass  # one-way (module docstring)
