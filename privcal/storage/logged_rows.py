"""A ledger row against the audit entry that recorded it: the comparison ``audit verify``
makes for every dataset, charge and release row (:mod:`privcal.storage.verify`), and the
same comparison for one release before it is used for prediction (red team 16, F5).

A release row edited in the database (its threshold, say) is what ``predict`` and
``evaluate`` would use; ``audit verify`` catches it by comparing the row with the document
its log entry recorded. :func:`check_release_logged` makes that comparison for the one
release about to be used — its entry found among the log's release entries (chained, or
still queued on PostgreSQL), the entry's own hash recomputed — without verifying the whole
chain: an entry rewritten together with its hash and everything after it is left to
``audit verify`` (with ``--expect-head`` or a signed head).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from privcal.errors import AuditFailed
from privcal.storage import audit
from privcal.storage.models import ReleaseRow, release_id_sql

__all__ = ["ROW_KINDS", "RowKind", "check_logged_row", "check_release_logged"]


@dataclass(frozen=True)
class RowKind:
    """How an entry that records one ledger row (a dataset, a charge, a release) is checked:
    the row it names must exist and be exactly what the entry recorded, once."""

    id_key: str  # the entry's key naming the row
    doc: Callable[[Any, str], dict[str, Any]]  # the row's audit document (row, dataset name)
    deleted: str  # appended to "… is missing from the ledger"
    edited: str  # appended to "… differs from what the log recorded"
    named: bool = False  # the row is a dataset: its own name, also in the messages


ROW_KINDS: dict[str, RowKind] = {
    "dataset": RowKind("dataset_id", lambda row, _name: audit.dataset_doc(row), "",
                       " (row edited)", named=True),
    "charge": RowKind("charge_id", audit.charge_doc, " (row deleted)", " (row edited)"),
    "release": RowKind("release_id", audit.release_doc, " (row deleted)",
                       " (threshold or another field edited)"),
}


def check_logged_row(kind: str, where: str, rid: int, row: Any, name: str,
                     data: dict[str, Any]) -> None:
    """AuditFailed ``"{where}: {kind} {rid} differs from what the log recorded …"`` unless
    ``row`` (of dataset ``name``) is exactly the document ``data`` its entry recorded."""
    spec = ROW_KINDS[kind]
    what = f"{kind} {rid}" + (f" ({name!r})" if spec.named else "")
    if spec.doc(row, name) != data:
        raise AuditFailed(f"{where}: {what} differs from what the log recorded" + spec.edited)


def _data(payload: str, release_id: int) -> dict[str, Any] | None:
    """The data of a release entry's payload if it records release ``release_id``."""
    try:
        doc = json.loads(payload)
    except (ValueError, TypeError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or data.get("release_id") != release_id:
        return None
    return data


def _queries(dialect: str) -> tuple[Any, Any]:
    """The look-ups of a release's entries in ``audit_log`` and in ``audit_queue``: index
    probes (migration 0011: the expression spelt as indexed, :func:`release_id_sql`, and the
    literal ``kind = 'release'`` — a partial index is not used under a bound parameter),
    then the text test the check always made."""
    log = text("SELECT seq, payload, prev_hash, entry_hash FROM audit_log "
               f"WHERE kind = 'release' AND {release_id_sql(dialect, 'audit_log')} = :rid "
               "AND payload LIKE :pattern ORDER BY seq")
    queue = text("SELECT id, prefix FROM audit_queue "
                 f"WHERE kind = 'release' AND {release_id_sql(dialect, 'audit_queue')} = :rid "
                 "AND prefix LIKE :pattern ORDER BY id")
    return log, queue


_QUERIES = {d: _queries(d) for d in ("sqlite", "postgresql")}


def _release_entry(s: Session, release_id: int) -> tuple[str, dict[str, Any], Any] | None:
    """(where, data, chained entry or None) of the log entry recording ``release_id``; None if
    it has none; AuditFailed if two record it. Both tables are searched among entries of
    kind ``release`` whose payload's ``data.release_id`` is the id — an index look-up
    (migration 0011), not a scan — and whose text names it (an RFC 8785 payload writes
    ``"release_id":N`` followed by ``,``: the key ``requester`` follows), as before."""
    rid = int(release_id)
    params = {"rid": rid, "pattern": f'%"release_id":{rid},%'}
    log, queue = _QUERIES[s.get_bind().dialect.name]
    found: list[tuple[str, dict[str, Any], Any]] = []
    for e in s.execute(log, params):
        data = _data(e.payload, release_id)
        if data is not None:
            found.append((f"audit entry {e.seq}", data, e))
    for q in s.execute(queue, params):
        data = _data(audit.payload_at(q.prefix, 0), release_id)
        if data is not None:
            found.append((f"queued audit entry (queue id {q.id})", data, None))
    if len(found) > 1:
        raise AuditFailed(f"{found[1][0]}: release {release_id} is logged twice")
    return found[0] if found else None


def check_release_logged(s: Session, row: ReleaseRow, dataset_name: str) -> None:
    """Release ``row`` exactly as its audit entry recorded it (:func:`check_logged_row`, as
    ``audit verify`` compares it), and that entry's hash its payload's; else a one-line
    AuditFailed naming the release and saying to run ``privcal audit verify``. One index
    look-up per table (migration 0011), whatever the log's length; not the whole chain
    (module docstring)."""
    try:
        found = _release_entry(s, row.id)
        if found is None:
            raise AuditFailed(f"release {row.id} has no audit entry (row inserted outside "
                              "privcal, or its entry deleted)")
        where, data, entry = found
        if entry is not None and audit.chain_hash(entry.prev_hash,
                                                  entry.payload) != entry.entry_hash:
            raise AuditFailed(f"{where}: hash does not match its payload (entry altered)")
        check_logged_row("release", where, row.id, row, dataset_name, data)
    except AuditFailed as exc:
        raise AuditFailed(f"release {row.id} refused: {exc}; run `privcal audit verify`"
                          ) from exc
