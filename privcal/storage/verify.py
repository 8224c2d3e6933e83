"""Verifying the ledger: the whole hash chain recomputed and every row checked against its entry.

:meth:`LedgerVerifier.verify` (``Ledger.verify``) names the first entry or row that does not
verify: a broken hash or link, a gap, a payload that is not canonical, an edited or
unlogged dataset/charge/release row, a release its charges do not pay for, running totals
or per-subject spends that the logged charges do not add up to, collection sessions (and
their batches and release) that differ from what their entries committed, a replaced
ledger secret, a truncated or rewritten log (``expect_head``, a signed head), an entry
the signed head does not cover (chained after it, or still queued). Per-subject spends
are recomputed by :mod:`privcal.storage.verify_subjects`, the payment of every release by
:mod:`privcal.storage.verify_releases`.
The recomputation of every release's *guarantees* with the installed calibrators is
:mod:`privcal.accountant.verification`, on top of this.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from privcal.errors import AuditFailed, InvalidInput, LedgerError
from privcal.storage import audit
from privcal.storage import sessions as _sessions
from privcal.storage.kept_heads import parse_head, several
from privcal.storage.logged_rows import ROW_KINDS, check_logged_row
from privcal.storage.models import (
    AuditEntry,
    AuditHead,
    AuditQueue,
    Base,
    Charge,
    Dataset,
    ReleaseRow,
    spend_units,
)
from privcal.storage.records import VerifyReport
from privcal.storage.unreadable import first_unreadable, unreadable
from privcal.storage.verify_caps import check_central_cap, grid_check
from privcal.storage.verify_releases import check_release_charges
from privcal.storage.verify_subjects import check_subject_spends, stored_units

#: wraps an iteration to report it: ``progress(items, description, total)`` yields the items
Progress = Callable[[Iterable[Any], str, int], Iterable[Any]]

__all__ = ["ENTRY_CHECKS", "LedgerVerifier"]


def _check_head_row(head_row: AuditHead | None, last: int, last_hash: str) -> None:
    """The ``audit_head`` row must name the last entry of the chain; say what differs."""
    if head_row is None:
        raise AuditFailed("audit head: the audit_head row is missing (deleted outside privcal)")
    if head_row.seq > last:
        raise AuditFailed(
            f"audit entry {last + 1}: the audit_head row says the log ends at entry "
            f"{head_row.seq} but it ends at {last}: entries were deleted from the end (log "
            "truncated) or the head row's seq was edited")
    if head_row.seq < last:
        raise AuditFailed(
            f"audit head: the audit_head row says the log ends at entry {head_row.seq} but "
            f"entries continue to {last}: the head row's seq was edited (or entries were "
            "appended outside privcal)")
    if head_row.entry_hash != last_hash:
        raise AuditFailed(
            f"audit head: the audit_head row's hash differs from entry {last}'s hash: the head "
            "row was edited")


def _check_queue(s: Session, backend: str, last: int,
                 check: Callable[[int, str, dict[str, Any]], None]) -> list[AuditQueue]:
    """Check the entries committed but not yet chained (``audit_queue``), in id order.

    Each is checked as the entry ``last + k`` it becomes when the next sequencer chains it
    (:mod:`privcal.storage.audit_queue`): canonical, of its kind, and equal to the row it
    records — so a queued entry that was edited, or deleted (its row then has no entry), or
    forged for no row, fails as a chained one would. SQLite ledgers never queue.
    """
    rows = list(s.scalars(select(AuditQueue).order_by(AuditQueue.id)))
    if rows and backend != "postgresql":
        raise AuditFailed(f"audit queue: {len(rows)} entries in audit_queue, but a SQLite "
                          "ledger never queues (rows inserted outside privcal)")
    for k, q in enumerate(rows, start=1):
        seq = last + k
        where = (f"queued audit entry (queue id {q.id}, committed {audit.iso(q.created_at)}, "
                 f"not yet chained; it would be entry {seq})")
        payload = audit.payload_at(q.prefix, seq)
        try:
            doc = json.loads(payload)
            canonical_ok = isinstance(doc, dict) and audit.canonical(doc) == payload
        except (ValueError, TypeError):
            canonical_ok, doc = False, {}
        if not canonical_ok:
            raise AuditFailed(f"{where}: payload is not canonical JSON (entry altered)")
        if doc.get("seq") != seq or doc.get("kind") != q.kind or q.kind == "migration":
            raise AuditFailed(f"{where}: payload records kind {doc.get('kind')!r}, the row "
                              f"kind {q.kind!r} (entry altered)")
        try:
            check(seq, q.kind, doc.get("data") or {})
        except AuditFailed as exc:
            raise AuditFailed(f"{where}: {exc}") from exc
    return rows


@dataclass
class _Tally:
    """What one pass over the log (chained entries, then queued ones) has seen so far."""

    rows: Mapping[str, Mapping[int, Any]]  # kind → id → row, for the ROW_KINDS
    names: dict[int, str]  # dataset id → name
    coll: dict[int, _sessions.CollectionSession]  # collection sessions by id
    sessions: _sessions.SessionTally = field(default_factory=_sessions.SessionTally)
    #: kind → row id → the entry that recorded it (per-subject spends need the charges')
    logged: dict[str, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    migration: tuple[int, dict[str, Any]] | None = None


def _check_row(kind: str) -> Callable[[_Tally, int, dict[str, Any]], None]:
    spec = ROW_KINDS[kind]

    def check(t: _Tally, seq: int, data: dict[str, Any]) -> None:
        rid = data.get(spec.id_key)
        row = t.rows[kind].get(rid) if isinstance(rid, int) else None
        if row is None:
            raise AuditFailed(f"audit entry {seq}: {kind} {rid} is missing from the ledger"
                              + spec.deleted)
        name = row.name if spec.named else t.names.get(row.dataset_id, "?")
        check_logged_row(kind, f"audit entry {seq}", rid, row, name, data)
        if rid in t.logged[kind]:
            raise AuditFailed(f"audit entry {seq}: {kind} {rid} is logged twice")
        t.logged[kind][rid] = seq
    return check


def _check_session(kind: str, t: _Tally, seq: int, data: dict[str, Any]) -> None:
    _sessions.check_entry(seq, kind, data, t.coll, t.names, t.sessions)


def _check_migration(t: _Tally, seq: int, data: dict[str, Any]) -> None:
    """The one ``migration`` entry (an upgrade from schema ≤ 0004): sessions and spends.

    The upgrade to 0005 writes it before any entry that only 0005 and later write — a
    local-DP charge naming its members, a session batch with its number — and a downgrade
    below 0005 is refused once such an entry exists; so one after them was appended by
    hand. Its baseline would re-commit per-subject spends (red team 13, F1: units moved
    from a subject at her cap to another, and the first charged again, verified ok)."""
    if t.migration is not None:
        raise AuditFailed(f"audit entry {seq}: a second migration entry")
    since = [t.logged["charge"][cid] for cid in t.logged["charge"]
             if getattr(t.rows["charge"][cid], "members_digest", None) is not None]
    since += [bseq for bseq, _row in t.sessions.batch_rows.values()]
    if since:
        raise AuditFailed(f"audit entry {seq}: a migration entry after entry {min(since)}, "
                          "which only privcal 0005 or later writes (the upgrade writes it "
                          "before any such entry): entry appended")
    t.migration = (seq, data)
    _sessions.check_migration(seq, data, t.coll, t.sessions)


#: one verifier per audit entry kind: ``check(tally, seq, data)`` raises AuditFailed naming the
#: entry if the rows it records differ from it. A kind without an entry here fails verification.
ENTRY_CHECKS: dict[str, Callable[[_Tally, int, dict[str, Any]], None]] = {
    **{kind: _check_row(kind) for kind in ROW_KINDS},
    **{kind: partial(_check_session, kind) for kind in sorted(_sessions.SESSION_KINDS)},
    "migration": _check_migration,
}


def _check_entry(t: _Tally, seq: int, kind: str, data: dict[str, Any]) -> None:
    """Cross-check one (chained or queued) entry with the rows it records."""
    verifier = ENTRY_CHECKS.get(kind)
    if verifier is None:
        raise AuditFailed(f"audit entry {seq}: unknown kind {kind!r} (no verifier for it)")
    verifier(t, seq, data)


class LedgerVerifier:
    """The audit verification of a :class:`~privcal.storage.ledger.Ledger`."""

    # ``read`` is the Ledger's

    def first_unreadable(self) -> str | None:
        """The first row (every table, in dependency order) privcal cannot load —
        ``"charges row 7"`` — or None (:func:`~privcal.storage.unreadable.first_unreadable`)."""
        by_table = {m.local_table: m.class_ for m in Base.registry.mappers}
        return first_unreadable(self.read, [by_table[t] for t in Base.metadata.sorted_tables  # type: ignore[attr-defined]
                                            if t in by_table])

    def verify(self, expect_head: str | Sequence[str] | None = None, *, signed_head: Any = None,
               trusted_key: Any = None, allow_unsigned_tail: bool = False,
               progress: Progress | None = None,
               cap_check: Callable[[Dataset, bool], None] | None = None) -> VerifyReport:
        """Recompute the whole chain and cross-check every row against its entry.

        Raises AuditFailed naming the first entry (or row) that does not verify:
        a broken hash or link, a gap in the sequence (a deleted entry), a payload
        that is not canonical, a dataset/charge/release row that differs from what
        its entry recorded (an edited threshold or amount) or has no entry, running
        totals that do not equal the sum of the charges, per-subject spends that the
        logged local-DP charges (and the 0005 baseline) do not add up to subject by
        subject, session status/state or reports that differ from what their entries
        committed, a replaced ledger secret, and — with ``expect_head="SEQ:HASH"`` — a log
        truncated before SEQ or rewritten up to it.

        ``expect_head`` proves the prefix up to SEQ only: the entries after it, chained or
        still queued, verify and are counted in ``after_expected``.
        ``signed_head`` (a :class:`~privcal.storage.signing.SignedHead`, its document or
        file) with ``trusted_key`` (an Ed25519 public key or its PEM file): the signature
        must verify, the log must contain the signed head, and every later entry — chained,
        or still in ``audit_queue`` (a read-only connection cannot chain it) — is one the
        key holder did not sign: a failure naming the first, unless ``allow_unsigned_tail``
        (then counted in ``unsigned_entries``).

        Several kept heads (a list of ``SEQ:HASH``, a list of signed heads) are each checked:
        the log must contain every one (heads kept on different days, or received from other
        auditors: a rollback to an older head, or a fork served to someone else, is detected
        only by a head that is not in it); the newest signed head decides the unsigned tail.
        Without any head, a log whose newest entries were removed (with their rows), or one
        rewritten with every hash recomputed, verifies too (``heads_checked`` is 0).

        ``progress(entries, description, total)``, if given, wraps the iteration over the
        log's entries to report it (the CLI's bar: :func:`privcal.cli.progress.iterate`).
        ``cap_check(dataset, under_grid)``: the (ε, δ) caps' check, here (verify_caps.grid_check).
        Without it (ε, δ) caps are not checked: counted in the report's ``caps_unchecked``;
        pure releases on ρ-zCDP caps the storage cannot decide: ``releases_unchecked``."""
        heads = several(expect_head)
        signed_docs = several(signed_head)
        signed_all: list[Any] = []
        if signed_docs or trusted_key is not None:
            from privcal.storage import signing

            if not signed_docs or trusted_key is None:
                raise InvalidInput("a signed head is verified with a trusted public key: give "
                                   "both (--signed-head FILE --trusted-key PUBFILE)")
            for doc in signed_docs:
                one = signing.read_signed_head(doc)
                signing.verify_signed_head(one, trusted_key)
                signed_all.append(one)
        # the newest signed head decides which entries are unsigned; every one must be in the log
        # of signed heads of one entry, the newest signing (ISO 8601 UTC sorts as text; red
        # team 21, readme F2: the summary showed the first given, a stale file's age)
        signed = max(signed_all, key=lambda h: (h.seq, h.time)) if signed_all else None
        wants: list[tuple[int, str, str]] = []
        for h in heads:
            wants.append((*parse_head(h), "expected head"))
        want = max(wants, key=lambda w: w[0])[:2] if wants else None
        # every committed entry into the chain first; a ledger that may only be read keeps
        # them queued, and they are checked and counted below
        try:
            self.sequence_audit(read_only_ok=True)  # type: ignore[attr-defined]
        except LedgerError:
            pass  # the head row is gone: the checks below say so (and check the queue)
        for one in signed_all:
            what = "signed head" if len(signed_all) == 1 else f"signed head of {one.time}"
            wants.append((one.seq, one.hash.lower(), what))
        # the rows are read from here on: a value of the wrong form is an edit (unreadable)
        with unreadable("the log or its rows", self.first_unreadable), self.read(long=True) as s:
            datasets = {d.id: d for d in s.scalars(select(Dataset))}
            charges = {c.id: c for c in s.scalars(select(Charge))}
            releases = {r.id: r for r in s.scalars(select(ReleaseRow))}
            tally = _Tally(
                rows={"dataset": datasets, "charge": charges, "release": releases},
                names={i: d.name for i, d in datasets.items()},
                coll={c.id: c for c in s.scalars(select(_sessions.CollectionSession))})
            prev, expected, count = audit.GENESIS, 1, 0
            head_row = s.get(AuditHead, 1)
            check = partial(_check_entry, tally)

            entries: Iterable[AuditEntry] = s.scalars(select(AuditEntry).order_by(AuditEntry.seq))
            if progress is not None:
                entries = progress(entries, "verifying the audit log",
                                   head_row.seq if head_row else 0)
            for e in entries:
                if e.seq < expected:  # before 1 (the chain has no such position): inserted
                    raise AuditFailed(f"audit entry {e.seq}: the log has no position {e.seq} "
                                      "(it starts at 1): a row inserted outside privcal")
                if e.seq != expected:
                    raise AuditFailed(
                        f"audit entry {expected} is missing (the log jumps from {expected - 1} "
                        f"to {e.seq}): a row was deleted")
                if e.prev_hash != prev:
                    raise AuditFailed(
                        f"audit entry {e.seq}: prev_hash does not link to entry {e.seq - 1}")
                try:
                    doc = json.loads(e.payload)
                    canonical_ok = audit.canonical(doc) == e.payload
                except (ValueError, TypeError, RecursionError):
                    canonical_ok, doc = False, {}
                if not canonical_ok:
                    raise AuditFailed(f"audit entry {e.seq}: payload is not canonical JSON")
                if audit.chain_hash(prev, e.payload) != e.entry_hash:
                    raise AuditFailed(f"audit entry {e.seq}: hash does not match its payload "
                                      "(entry altered)")
                if doc.get("seq") != e.seq or doc.get("kind") != e.kind:
                    raise AuditFailed(f"audit entry {e.seq}: payload records seq {doc.get('seq')} "
                                      f"kind {doc.get('kind')!r} (entries reordered)")
                with unreadable(f"audit entry {e.seq} or the {e.kind} row it logs"):
                    check(e.seq, e.kind, doc.get("data") or {})
                prev = e.entry_hash
                expected += 1
                count += 1
                for w_seq, w_hash, w_what in wants:
                    if e.seq == w_seq and e.entry_hash != w_hash:
                        raise AuditFailed(f"audit entry {e.seq}: hash differs from the {w_what} "
                                          "(log rewritten, or the head is another ledger's)")
            last = count
            with unreadable("the audit head row"):
                _check_head_row(head_row, last, prev)
            for w_seq, w_hash, w_what in wants:
                if w_seq > last:
                    raise AuditFailed(f"audit entry {last + 1}: missing; the {w_what} is "
                                      f"entry {w_seq} but the log ends at {last} (entries "
                                      "removed, or the log rewritten from an earlier entry: "
                                      "a kept head cannot tell which)")
                if w_seq == 0 and w_hash != audit.GENESIS:
                    raise AuditFailed(f"audit entry 0: the {w_what}'s hash is not the genesis "
                                      "hash")
            queued = _check_queue(s, self.backend, last, check)  # type: ignore[attr-defined]
            # a queued entry is after every head: a signed head does not cover it either
            unsigned = 0
            if signed is not None:
                unsigned = last - signed.seq + len(queued)
                if unsigned > 0 and not allow_unsigned_tail:
                    first = (f"audit entry {signed.seq + 1}" if last > signed.seq else
                             f"queued audit entry (queue id {queued[0].id}, not yet chained; "
                             f"it would be entry {last + 1})")
                    raise AuditFailed(
                        f"{first}: not signed by the trusted key (the signed head is entry "
                        f"{signed.seq}, signed {signed.time}; {unsigned} later "
                        "entr" + ("y is" if unsigned == 1 else "ies are") + " unsigned"
                        + (f", {len(queued)} of them still queued" if queued else "")
                        + ": appended since, or forged; --allow-unsigned-tail verifies them "
                        "as unsigned)")
            for kind, rows in (("dataset", datasets), ("charge", charges), ("release", releases)):
                missing = sorted(set(rows) - set(tally.logged[kind]))
                if missing:
                    raise AuditFailed(f"{kind} {missing[0]} has no audit entry (row inserted "
                                      "outside privcal, or its entry deleted)")
            undecided = check_release_charges(  # pure releases on ρ-zCDP caps: payrule F1
                releases, charges, tally.logged["release"], self.release_charge_links(s),  # type: ignore[attr-defined]
                tally.coll, tally.logged["charge"],
                {i: bool(d.allow_nonprivate) for i, d in datasets.items()}, datasets)
            _sessions.check_sessions(s, tally.coll, tally.sessions, releases)
            unchecked: list[int] = []  # (ε, δ) caps left unchecked, without cap_check
            self._check_totals(s, datasets, charges, grid_check(
                cap_check, charges, tally.logged["charge"], tally.migration, unchecked))
            check_subject_spends(s, datasets, charges, tally.logged["charge"],
                                 tally.migration)
            return VerifyReport(entries=count, head=f"{last}:{prev}", datasets=len(datasets),
                                charges=len(charges), releases=len(releases),
                                signed_through=signed.seq if signed is not None else None,
                                signed_at=signed.time if signed is not None else None,
                                heads_checked=len(wants),
                                queued=len(queued), caps_unchecked=len(unchecked),
                                releases_unchecked=len(undecided),
                                queued_since=queued[0].created_at if queued else None,
                                unsigned_entries=unsigned,
                                expected_through=want[0] if want is not None else None,
                                after_expected=(last - want[0] + len(queued)
                                                if want is not None else 0))

    @staticmethod
    def _check_totals(s: Session, datasets: dict[int, Dataset], charges: dict[int, Charge],
                      cap_check: Callable[[Dataset], None] | None = None) -> None:
        zero = Decimal(0)
        with localcontext() as ctx:
            ctx.prec = 80
            sums: dict[int, list[Decimal]] = defaultdict(lambda: [zero] * 5)
            counts: dict[int, int] = defaultdict(int)
            local_units: dict[int, Decimal] = defaultdict(lambda: zero)
            for c in charges.values():
                t = sums[c.dataset_id]
                counts[c.dataset_id] += 1
                if c.notion == "pure" and c.epsilon is not None:
                    t[0] += c.epsilon
                    t[1] += c.epsilon * c.epsilon / 2
                elif c.notion == "zcdp" and c.rho is not None:
                    t[2] += c.rho
                elif c.notion == "approx" and c.epsilon is not None and c.delta is not None:
                    t[3] += c.epsilon
                    t[4] += c.delta
                if c.eps0 is not None and c.subjects_accepted:
                    local_units[c.dataset_id] += spend_units(c.eps0) * c.subjects_accepted
            units = stored_units(s, datasets)
            for ds in datasets.values():
                got = [ds.spent_pure_eps, ds.spent_pure_rho, ds.spent_zcdp_rho,
                       ds.spent_approx_eps, ds.spent_approx_delta]
                if got != sums[ds.id] or ds.charge_count != counts[ds.id]:
                    raise AuditFailed(f"dataset {ds.id} ({ds.name!r}): spent totals do not equal "
                                      "the sum of its logged charges (row edited)")
                check_central_cap(ds, cap_check)  # within its logged cap (red team 24, 25)
                if Decimal(units.get(ds.id, 0)) != local_units[ds.id]:
                    raise AuditFailed(f"dataset {ds.id} ({ds.name!r}): per-subject spends do not "
                                      "add up to its logged local-DP charges (rows edited)")
