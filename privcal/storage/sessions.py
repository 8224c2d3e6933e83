"""Collection sessions: interactive (LDP-CP-S) and one-round federated (FedCP-QQ, FedCP²-QQ)
protocols whose whole state lives in the ledger, so a session survives process restarts.

``collection_sessions`` holds the public protocol parameters, the protocol state (a
JSON document rewritten after every accepted batch), the status and the release it
ended in. ``session_reports`` holds each accepted report — one per subject per
session (primary key), which is what makes a session ε-LDP per subject; its subject
is a keyed pseudonym (:mod:`privcal.storage.pseudonyms`), never the id. A report value
is a randomized bit (ldp-score) or a grid point (fedcp2-qq): a DP output. **Exception:**
a FedCP-QQ message is the agent's raw order statistic of its own scores — that protocol
is not private, the dataset must allow non-private releases, the release needs every
message, and its privacy record says each agent's order statistic is revealed.

Audit: every session write appends an entry (kinds :data:`SESSION_KINDS`) that names
the session and counts, never subject ids, plus the session's status and a digest of
its state — keyed with the ledger secret (:func:`privcal.storage.pseudonyms.keyed_state_digest`:
the state holds the open round's count of ones, which a plain hash would let an audit
reader recover); each batch's entry commits to a digest of the reports it stored (under its
``batch`` number) and to its ``session_batches`` row (idempotency key, request digest and
the result a retry replays); a ``session_close`` entry names the session's release (which
must be a release of the session's dataset). :func:`check_entry`, :func:`check_migration`
and :func:`check_sessions` are what :meth:`privcal.storage.Ledger.verify` runs on them.

The operations that read and write these tables (lock a session, probe the stored reports,
insert a batch, …) are :class:`privcal.storage.session_store.SessionStore`'s.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from privcal.errors import AuditFailed, InvalidInput, NotFound
from privcal.storage.audit import jsonable
from privcal.storage.models import Base, ReleaseRow, read_ledger_secret
from privcal.storage.pseudonyms import reports_digest_matches, state_digest_matches

__all__ = [
    "SESSION_KINDS",
    "CollectionSession",
    "SessionBatch",
    "SessionReport",
    "SessionTally",
    "check_entry",
    "check_migration",
    "check_session_open",
    "check_sessions",
    "lock_for_revocation",
    "refuse_unless_open",
]

#: audit entry kinds written by collection sessions
SESSION_KINDS = frozenset({"session_open", "session_batch", "session_close"})


class CollectionSession(Base):
    """One collection session: public parameters, protocol state, status, its release."""

    __tablename__ = "collection_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    method: Mapped[str] = mapped_column(String(100))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)  # public protocol parameters
    state: Mapped[dict[str, Any]] = mapped_column(JSON)  # protocol state / published plan
    status: Mapped[str] = mapped_column(String(16))  # open | released | closed
    shuffled: Mapped[bool] = mapped_column(Boolean, default=False)
    requester: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    release_id: Mapped[int | None] = mapped_column(ForeignKey("releases.id"), nullable=True)


class SessionReport(Base):
    """One accepted report; the primary key makes each subject answer once per session."""

    __tablename__ = "session_reports"

    # no FK on session_id: 10⁶ reports would fire 10⁶ FK checks; rows are written only by
    # privcal under the dataset lock, and `audit verify` checks the counts per session
    session_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    subject: Mapped[str] = mapped_column(String(200), primary_key=True)
    round: Mapped[int] = mapped_column(Integer)
    value: Mapped[str] = mapped_column(String(64))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # the session batch that stored it (0: stored before migration 0005, committed by its entry)
    batch: Mapped[int | None] = mapped_column(Integer, nullable=True)


class SessionBatch(Base):
    """One accepted batch of a session: its number, idempotency key, request digest and result.

    The batch's ``session_batch`` audit entry commits to the digest of the reports stored
    under this number (:func:`privcal.storage.pseudonyms.reports_digest`).
    """

    __tablename__ = "session_batches"
    __table_args__ = (UniqueConstraint("session_id", "idempotency_key",
                                       name="uq_session_batch_idem"),)

    session_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    batch: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def session_doc(row: CollectionSession, dataset_name: str) -> dict[str, Any]:
    """What the ``session_open`` entry records (and ``verify`` compares with the row)."""
    return jsonable({
        "session_id": row.id,
        "dataset": dataset_name,
        "method": row.method,
        "params": row.params,
        "shuffled": bool(row.shuffled),
        "requester": row.requester,
    })


@dataclass
class SessionTally:
    """What the log says about sessions, accumulated entry by entry for :func:`check_sessions`."""

    accepted: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    opened: set[int] = field(default_factory=set)
    #: (session, batch) → (seq of the entry, reports digest, accepted count)
    batches: dict[tuple[int, int], tuple[int, str, int]] = field(default_factory=dict)
    #: session → (seq of the last entry stating it, status, state digest)
    state: dict[int, tuple[int, str, str]] = field(default_factory=dict)
    #: session → (seq of the last entry stating it, its release id: None until one closes it)
    release: dict[int, tuple[int, Any]] = field(default_factory=dict)
    #: (session, batch) → (seq of the entry, its ``session_batches`` row as the entry says)
    batch_rows: dict[tuple[int, int], tuple[int, dict[str, Any]]] = field(
        default_factory=dict)


_STATE_KEYS = ("status", "state_digest")


def _note_state(seq: int, sid: int, data: dict[str, Any], tally: SessionTally) -> None:
    if "state_digest" in data:
        tally.state[sid] = (seq, str(data.get("status")), str(data["state_digest"]))


def _batch_row(sid: int, data: dict[str, Any]) -> dict[str, Any]:
    """The ``session_batches`` row a ``session_batch`` entry records (every column but its
    time): what ``submit_reports`` writes from the same values, and a retry replays."""
    return {"idempotency_key": data.get("idempotency_key"),
            "request_digest": data.get("request_digest"),
            "result": {"session_id": sid, "batch_round": data.get("round"),
                       "accepted": data.get("accepted"), "rejected": data.get("rejected"),
                       "reasons": data.get("reasons"), "charge_id": data.get("charge_id"),
                       "epsilon": data.get("eps0"), "advanced": data.get("advanced")}}


def check_entry(
    seq: int, kind: str, data: dict[str, Any], sessions: dict[int, CollectionSession],
    names: dict[int, str], tally: SessionTally,
) -> None:
    """Cross-check one session entry against the ``collection_sessions`` rows.

    Accumulates in ``tally`` the accepted counts, the reports digest of each batch and
    the last status and state digest of each session, for :func:`check_sessions`.
    """
    sid = data.get("session_id")
    row = sessions.get(sid) if isinstance(sid, int) else None
    if row is None or not isinstance(sid, int):
        raise AuditFailed(f"audit entry {seq}: session {sid} is missing from the ledger")
    if kind == "session_open":
        fixed = {k: v for k, v in data.items() if k not in _STATE_KEYS}
        if session_doc(row, names.get(row.dataset_id, "?")) != fixed:
            raise AuditFailed(f"audit entry {seq}: session {sid} differs from what the log "
                              "recorded (row edited)")
        if sid in tally.opened:
            raise AuditFailed(f"audit entry {seq}: session {sid} is opened twice")
        tally.opened.add(sid)
        tally.release[sid] = (seq, None)
    elif sid not in tally.opened:
        raise AuditFailed(f"audit entry {seq}: session {sid} has a {kind} before it was opened")
    if kind == "session_batch":
        acc = data.get("accepted")
        if not isinstance(acc, int) or acc < 0:
            raise AuditFailed(f"audit entry {seq}: session {sid}: malformed accepted count")
        tally.accepted[sid] += acc
        if "reports_digest" in data:
            tally.batches[(sid, int(data["batch"]))] = (seq, str(data["reports_digest"]), acc)
        if "batch" in data:  # written with its session_batches row (migration 0005 on)
            tally.batch_rows[(sid, int(data["batch"]))] = (seq, _batch_row(sid, data))
    if "release_id" in data:
        tally.release[sid] = (seq, data["release_id"])
    _note_state(seq, sid, data, tally)


def check_migration(seq: int, data: dict[str, Any], sessions: dict[int, CollectionSession],
                    tally: SessionTally) -> None:
    """The ``migration`` entry (0003) commits every session's state and its reports so far."""
    for key, doc in (data.get("sessions") or {}).items():
        sid = int(key)
        if sid not in sessions:
            raise AuditFailed(f"audit entry {seq}: session {sid} is missing from the ledger")
        tally.batches[(sid, 0)] = (seq, str(doc.get("reports_digest")), int(doc.get("reports", 0)))
        _note_state(seq, sid, doc, tally)


def _check_releases(sessions: dict[int, CollectionSession], tally: SessionTally,
                    releases: Mapping[int, Any]) -> None:
    """Each session's release is the one its last entry named, and a release of its dataset."""
    for sid, row in sorted(sessions.items()):
        seq, logged = tally.release.get(sid, (0, None))
        if row.release_id != logged:
            raise AuditFailed(f"audit entry {seq}: session {sid}'s release is "
                              f"{row.release_id}, but the log records {logged} (row edited)")
        rel = releases.get(row.release_id) if row.release_id is not None else None
        if row.release_id is not None and (rel is None or rel.dataset_id != row.dataset_id):
            raise AuditFailed(f"audit entry {seq}: session {sid}'s release {row.release_id} "
                              "is not a release of the session's dataset")


def _check_batch_rows(s: Session, tally: SessionTally) -> None:
    """Each ``session_batches`` row is what its batch's entry recorded: its idempotency key,
    request digest and result (which a retry under the key replays)."""
    want = dict(tally.batch_rows)
    for b in s.scalars(select(SessionBatch).order_by(SessionBatch.session_id,
                                                     SessionBatch.batch)):
        logged = want.pop((b.session_id, b.batch), None)
        if logged is None:
            raise AuditFailed(f"session {b.session_id}: batch {b.batch} of session_batches "
                              "has no audit entry (row inserted or edited)")
        got = {"idempotency_key": b.idempotency_key, "request_digest": b.request_digest,
               "result": b.result}
        if got != logged[1]:
            raise AuditFailed(f"audit entry {logged[0]}: session {b.session_id}'s batch "
                              f"{b.batch} (its idempotency key, request digest or recorded "
                              "result) differs from what the log recorded (row edited)")
    if want:
        (sid, batch), (seq, _) = min(want.items())
        raise AuditFailed(f"audit entry {seq}: session {sid}'s batch {batch} is missing from "
                          "session_batches (row deleted)")


def check_sessions(s: Session, sessions: dict[int, CollectionSession],
                   tally: SessionTally, releases: Mapping[int, Any] | None = None) -> None:
    """Every session has an open entry; its status, state and release are those its last
    entries recorded (``releases``: release id → row, to check the release is of the
    session's dataset); its stored reports and batch rows are exactly the logged ones,
    batch by batch."""
    missing = sorted(set(sessions) - tally.opened)
    if missing:
        raise AuditFailed(f"session {missing[0]} has no audit entry (row inserted outside "
                          "privcal, or its entry deleted)")
    _check_releases(sessions, tally, releases if releases is not None else {
        r.id: r for r in s.scalars(select(ReleaseRow))})
    _check_batch_rows(s, tally)
    secret = read_ledger_secret(s)
    key = bytes.fromhex(secret) if secret is not None else None
    for sid, row in sorted(sessions.items()):
        last = tally.state.get(sid)
        if last is None:
            continue  # opened before 0005 on a ledger whose log was empty at migration: none
        seq, status, digest = last
        # keyed (tagged) since red team 7; an untagged digest is an older entry's SHA-256
        if row.status != status or not state_digest_matches(key, row.state, digest):
            raise AuditFailed(f"audit entry {seq}: session {sid}'s status or state differs from "
                              "what the log recorded (row edited, or the ledger secret "
                              "replaced)")
    rows: dict[tuple[int, int | None], list[tuple[str, int, str]]] = defaultdict(list)
    for sid, subj, rnd, val, batch in s.execute(select(
            SessionReport.session_id, SessionReport.subject, SessionReport.round,
            SessionReport.value, SessionReport.batch)):
        rows[(sid, batch)].append((subj, rnd, val))
    for (sid, batch), got in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        want = tally.batches.get((sid, batch)) if batch is not None else None
        if want is None:
            raise AuditFailed(f"session {sid}: {len(got)} stored report(s) of batch {batch} that "
                              "no audit entry records (rows inserted or edited)")
        if not reports_digest_matches(got, want[1]) or len(got) != want[2]:
            raise AuditFailed(f"audit entry {want[0]}: session {sid}'s reports of batch {batch} "
                              "differ from what the log recorded (subject or value edited)")
    for (sid, batch), (seq, _, count) in sorted(tally.batches.items()):
        if count and (sid, batch) not in rows:
            raise AuditFailed(f"audit entry {seq}: session {sid}'s reports of batch {batch} are "
                              "missing (rows deleted)")
    stored: dict[int, int] = defaultdict(int)
    stored.update(s.execute(select(SessionReport.session_id, func.count())
                            .group_by(SessionReport.session_id)).all())
    for sid in set(stored) | set(tally.accepted):
        if stored.get(sid, 0) != tally.accepted.get(sid, 0):
            raise AuditFailed(f"session {sid}: {stored.get(sid, 0)} stored reports but the log "
                              f"records {tally.accepted.get(sid, 0)} accepted (rows edited)")


def check_session_open(s: Session, session: int) -> None:
    """In the token's own transaction: session ``session`` is still open (NotFound, or
    InvalidInput naming its state). The caller's earlier check (the service's, the CLI's)
    ran in another transaction; a session closed or abandoned between the two would get a
    token that could never report. On PostgreSQL the row is read ``FOR SHARE``: a close
    committed first is seen, and a close after waits for the token's commit; SQLite's
    writes are serial."""
    row = s.execute(select(CollectionSession.status, CollectionSession.release_id)
                    .where(CollectionSession.id == session)
                    .with_for_update(read=True)).first()
    if row is None:
        raise NotFound(f"unknown session {session}")
    refuse_unless_open(session, row.status, row.release_id)


def lock_for_revocation(s: Session, session: int | None) -> None:
    """In a revocation's transaction: lock the row of the session its token is bound to, if
    any (PostgreSQL ``FOR UPDATE``; SQLite's writes are serial), before ``revoked_at`` is
    set. A batch of that session re-checks its tokens after locking the same row, so the two
    are ordered (:func:`~privcal.storage.token_checks.tokens_not_in_force`; red team 21,
    flows M2)."""
    if session is None:
        return
    s.execute(select(CollectionSession.id).where(CollectionSession.id == session)
              .with_for_update())


def refuse_unless_open(session: int, status: str, release_id: int | None) -> None:
    """InvalidInput naming the state of a session that is not open (a closed one without a
    release: abandoned) — a token for it could never report."""
    if status != "open":
        state = "abandoned" if status == "closed" and release_id is None else status
        raise InvalidInput(f"session {session} is {state}: a token for it could never report")
