"""Audit coverage and pseudonymous subjects (issue 16 items 1, 3, 6).

- ``ledger_secret``: the per-ledger HMAC key of subject pseudonyms, made here;
- every id in ``subject_spend`` and ``session_reports`` is replaced by its pseudonym
  (:mod:`privcal.storage.pseudonyms`); nothing else changes in those rows;
- ``charges.request_digest`` (what an idempotency key was first used for) and
  ``charges.members_digest`` with ``charge_members`` (who a local-DP batch charged);
- ``session_batches`` (batch numbers, idempotency keys) and ``session_reports.batch``;
- ``subject_baseline``: per-subject spends as they stand now. If the log already has
  entries, one ``migration`` entry is appended committing to this baseline, to every
  session's status and state and to its stored reports (they become batch 0), so that
  ``audit verify`` can recompute all of them from the chain from now on.

Downgrade drops the new tables and columns, and so it is refused — nothing changed, one
line — on a ledger holding anything this migration keyed or introduced (per-subject
spends, session reports, request or member digests, batches, baselines): pseudonyms cannot
be turned back into ids, and an upgrade after it would key them again under a new secret
(every subject's spend restarting at 0) and find the charges' digests gone (``audit
verify`` failing). On a ledger without such rows the ``migration`` entry stays in the log
(privcal before 0005 will not verify it).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from privcal.storage import audit, pseudonyms

    op.create_table(
        "ledger_secret",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("secret", sa.String(64), nullable=False),
    )
    op.create_table(
        "charge_members",
        sa.Column("charge_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("members", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "subject_baseline",
        sa.Column("dataset_id", sa.Integer, primary_key=True),
        sa.Column("subject", sa.String(200), primary_key=True),
        sa.Column("spent_units", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "session_batches",
        sa.Column("session_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("batch", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("request_digest", sa.String(64), nullable=True),
        sa.Column("result", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("session_id", "idempotency_key", name="uq_session_batch_idem"),
    )
    with op.batch_alter_table("charges") as b:
        b.add_column(sa.Column("request_digest", sa.String(64), nullable=True))
        b.add_column(sa.Column("members_digest", sa.String(64), nullable=True))
    with op.batch_alter_table("session_reports") as b:
        b.add_column(sa.Column("batch", sa.Integer, nullable=True))

    conn = op.get_bind()
    secret = pseudonyms.new_secret()
    conn.execute(sa.text("INSERT INTO ledger_secret (id, secret) VALUES (1, :s)"), {"s": secret})
    key = bytes.fromhex(secret)

    # ---- ids → pseudonyms (set-based: one executemany per table)
    spends = conn.execute(sa.text(
        "SELECT dataset_id, subject, spent_units FROM subject_spend")).all()
    if spends:
        conn.execute(sa.text("UPDATE subject_spend SET subject = :new "
                             "WHERE dataset_id = :d AND subject = :old"),
                     [{"new": pseudonyms.pseudonym(key, s), "d": d, "old": s}
                      for d, s, _ in spends])
        conn.execute(sa.text("INSERT INTO subject_baseline (dataset_id, subject, spent_units) "
                             "SELECT dataset_id, subject, spent_units FROM subject_spend"))
    reports = conn.execute(sa.text("SELECT session_id, subject FROM session_reports")).all()
    if reports:
        conn.execute(sa.text("UPDATE session_reports SET subject = :new, batch = 0 "
                             "WHERE session_id = :sid AND subject = :old"),
                     [{"new": pseudonyms.pseudonym(key, s), "sid": sid, "old": s}
                      for sid, s in reports])

    # ---- commit the baseline to the chain (only a log that already has entries)
    head = conn.execute(sa.text("SELECT seq, entry_hash FROM audit_head WHERE id = 1")).first()
    if head is None or head[0] == 0:
        return
    by_ds: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for d, s, u in conn.execute(sa.text(
            "SELECT dataset_id, subject, spent_units FROM subject_baseline")).all():
        by_ds[int(d)].append((s, int(u)))
    rep: dict[int, list[tuple[str, int, str]]] = defaultdict(list)
    for sid, s, r, v in conn.execute(sa.text(
            "SELECT session_id, subject, round, value FROM session_reports")).all():
        rep[int(sid)].append((s, int(r), v))
    sessions: dict[str, Any] = {}
    for sid, status, state in conn.execute(sa.text(
            "SELECT id, status, state FROM collection_sessions")).all():
        st = state if isinstance(state, dict) else json.loads(state)
        # keyed and salted (red teams 7 and 10): a plain digest of an open round's state or
        # of one person's single report could be inverted or matched across sessions
        sessions[str(sid)] = {"status": status,
                              "state_digest": pseudonyms.keyed_state_digest(key, st),
                              "reports": len(rep[int(sid)]),
                              "reports_digest": pseudonyms.reports_digest(rep[int(sid)])}
    data = {
        "revision": revision,
        "subject_key": pseudonyms.key_id(key),
        "subject_spend": {str(d): {"subjects": len(rows), "digest": pseudonyms.spend_digest(rows)}
                          for d, rows in sorted(by_ds.items())},
        "sessions": sessions,
    }
    seq = int(head[0]) + 1
    payload = audit.entry_payload(seq, "migration", data)
    entry_hash = audit.chain_hash(head[1], payload)
    conn.execute(sa.text("INSERT INTO audit_log (seq, kind, payload, prev_hash, entry_hash) "
                         "VALUES (:seq, 'migration', :p, :prev, :h)"),
                 {"seq": seq, "p": payload, "prev": head[1], "h": entry_hash})
    conn.execute(sa.text("UPDATE audit_head SET seq = :seq, entry_hash = :h WHERE id = 1"),
                 {"seq": seq, "h": entry_hash})


#: what a downgrade would lose, and the statement that finds a row of it
_KEPT_SINCE_0005 = (
    ("per-subject spends", "SELECT 1 FROM subject_spend"),
    ("session reports", "SELECT 1 FROM session_reports"),
    ("request or member digests of charges",
     "SELECT 1 FROM charges WHERE request_digest IS NOT NULL OR members_digest IS NOT NULL"),
    ("local-DP batch members", "SELECT 1 FROM charge_members"),
    ("subject baselines", "SELECT 1 FROM subject_baseline"),
    ("session batches", "SELECT 1 FROM session_batches"),
)


def refuse_losing_data(conn: Any) -> None:
    """LedgerError, before anything is changed, if the ledger holds a row the downgrade
    would make unrecoverable (module docstring)."""
    from privcal.errors import LedgerError

    held = [what for what, sql in _KEPT_SINCE_0005
            if conn.execute(sa.text(sql + " LIMIT 1")).first() is not None]
    if held:
        raise LedgerError(
            f"cannot downgrade this ledger below 0005: it holds {', '.join(held)}, keyed by "
            "its subject secret or recorded only since 0005, which the downgrade would drop "
            "and no upgrade could restore (every subject's spend would restart at 0 and "
            "audit verify would fail); nothing was changed")


def downgrade() -> None:
    refuse_losing_data(op.get_bind())
    with op.batch_alter_table("session_reports") as b:
        b.drop_column("batch")
    with op.batch_alter_table("charges") as b:
        b.drop_column("members_digest")
        b.drop_column("request_digest")
    op.drop_table("session_batches")
    op.drop_table("subject_baseline")
    op.drop_table("charge_members")
    op.drop_table("ledger_secret")
