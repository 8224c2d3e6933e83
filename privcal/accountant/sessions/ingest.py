"""Submitting a batch of reports to a session: one transaction that filters the rows, charges
each accepted subject, stores the reports, advances the protocol and, when the last round is
full, writes the release. The order of the filters is a decision of the protocol (see
:mod:`privcal.accountant.sessions`); the SQL is
:class:`privcal.storage.session_store.SessionStore`'s. The transaction is a Core one
(:meth:`~privcal.storage.Ledger.write_core`) whose statements run on the driver, so that a
small batch — what the service's group commit writes — costs its statements, not an ORM
unit of work; only the release of the last batch goes through the ORM.
"""

from __future__ import annotations

import hmac
import secrets
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from privcal.accountant.accountant import Accountant
from privcal.accountant.decimal_context import in_library_context
from privcal.accountant.normalize import idempotency_key as idempotency_key_text
from privcal.accountant.normalize import json_safe, request_digest
from privcal.accountant.sessions import parsing as P
from privcal.accountant.sessions import records as R
from privcal.accountant.sessions.records import SubmitResult, TokensNotInForce
from privcal.accountant.sessions.release import check_shuffle_record as _check_shuffle
from privcal.accountant.sessions.release import fed_release_args, ldp_release_args, release_in_tx
from privcal.accountant.sessions.state import (
    dump_protocol,
    fed_plan_of,
    info_of,
    protocol_of,
    session_key,
)
from privcal.accountant.sessions.status import session_status
from privcal.calibrators.ldp_score_protocol import LdpScoreProtocol
from privcal.calibrators.validation import id_strings, unmasked
from privcal.errors import InvalidInput
from privcal.storage.agent_slots import token_agents
from privcal.storage.audit import canonical, charge_doc, now
from privcal.storage.models import Dataset, cap_units, spend_units
from privcal.storage.pseudonyms import (
    key_id,
    keyed_state_digest,
    members_commitment,
    pseudonyms_raw,
    reports_digest_sorted,
    subjects_digest_raw,
)
from privcal.storage.sessions import CollectionSession
from privcal.storage.token_checks import tokens_not_in_force

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from privcal.storage import Ledger

__all__ = ["NO_ROUNDS", "submit_reports"]

#: the refusal of an ldp-score batch without rounds (one line, for the API, CLI and service)
NO_ROUNDS = ("session {sid} is ldp-score: every report must give the round whose query it "
             "answers (a round on every row); this batch gives none, nothing was recorded")


class _NothingAccepted(Exception):  # control flow only: never escapes this module
    """Raised inside the transaction so it rolls back; carries the counts to report."""

    def __init__(self, reasons: dict[str, int]) -> None:
        super().__init__("nothing accepted")
        self.reasons = reasons


class _Spent:
    """The spend rows a batch's probe found: raw pseudonyms (``S32``, sorted), their units."""

    def __init__(self, raw: np.ndarray, units: np.ndarray) -> None:
        self.raw, self.units = raw, units

    def lookup(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(has a spend row, units spent — 0 where none) of each of ``raw``."""
        if self.raw.shape[0] == 0:
            return np.zeros(raw.shape[0], dtype=bool), np.zeros(raw.shape[0], dtype=np.int64)
        at = np.minimum(np.searchsorted(self.raw, raw), self.raw.shape[0] - 1)
        has = self.raw[at] == raw
        return has, np.where(has, self.units[at], 0)


def _refuse_malformed(values: np.ndarray, value_reason: str, rounds: np.ndarray,
                      current: tuple[int, int]) -> None:
    """InvalidInput naming the first malformed row of a strict batch (:func:`submit_reports`) —
    ``values`` and ``rounds`` mask the rows whose value or round is malformed — if any: the
    batch is refused whole, nothing written. A malformed round's message names the session's
    rounds (``current``: the open round, the number of rounds)."""
    either = values | rounds
    if either.any():
        first = int(np.flatnonzero(either)[0])
        reason = value_reason if values[first] else (
            f"{R.MALFORMED_ROUND} (the session's rounds are 0 to {current[1] - 1}; "
            f"round {current[0]} is open)")
        count = int(either.sum())
        raise InvalidInput(
            f"report {first + 1} of the batch (in file order) has a {reason}"
            + (f", and {count - 1} more row{'s' if count > 2 else ''} too" if count > 1 else "")
            + ": the whole batch is refused and nothing was written (fix or drop those rows)")


def _candidates(ledger: Ledger, conn: Connection, row: Any, plan: Any,
                current: tuple[int, int], praw: np.ndarray, values: Any, rounds: Any,
                dataset_id: int | None, why: Counter[str], strict: bool = False
                ) -> tuple[np.ndarray, np.ndarray | list[str], _Spent]:
    """The rows that may be accepted, in file order; every row's stored value (``S1`` bits,
    or the federated value strings); and the spend rows of the batch's subjects on
    ``dataset_id`` (when the session charges them). ``current``: (the open round, the
    session's number of rounds).

    Filters, each row counted once in ``why`` under its first problem: malformed value,
    wrong round, subject already reported in this session, duplicate within the batch (the
    first valid occurrence is kept). One statement probes both the reports and the spends
    of the batch's distinct pseudonyms (``praw``, raw ``S32``).
    """
    n = int(praw.shape[0])
    if row.method == "ldp-score":
        ok, stored = P.parse_bits(values)
        bad = R.MALFORMED_BIT
    else:
        ok, stored = P.parse_messages(  # masked = missing: refused, not read (red team 11)
            row.method, np.asarray(unmasked(values, "values"), dtype=object).ravel(), plan)
        bad = R.OFF_GRID if row.method == "fedcp2-qq" else R.MALFORMED_VALUE
    why[bad] += int((~ok).sum())
    valid = ok.copy()
    codes = P.round_codes(rounds, n, *current)
    if strict:
        _refuse_malformed(~ok, bad, np.zeros(n, dtype=bool) if codes is None
                          else codes == P.ROUND_REASONS.index(R.MALFORMED_ROUND), current)
    if codes is not None:
        late = ok & (codes != P.ROUND_OK)
        for code, count in zip(*np.unique(codes[late], return_counts=True), strict=True):
            why[P.ROUND_REASONS[int(code)]] += int(count)  # type: ignore[index]
        valid &= ~late
    reported, spent, units = ledger.probe_batch(conn, row.id, np.unique(praw[valid]),
                                                dataset_id)
    if reported.shape[0]:
        old = valid & np.isin(praw, reported)
        why[R.ALREADY] += int(old.sum())
        valid &= ~old
    idx = np.flatnonzero(valid)
    _, first = np.unique(praw[idx], return_index=True)
    keep = np.zeros(n, dtype=bool)
    keep[idx[first]] = True
    why[R.DUPLICATE] += int((valid & ~keep).sum())
    return np.flatnonzero(keep), stored, _Spent(spent, units)


def _sampler() -> np.random.Generator:
    """A generator seeded from the operating system's CSPRNG (which surplus rows of a batch
    are kept must not be predictable by whoever orders the batch)."""
    return np.random.default_rng(secrets.randbits(128))


def _invited_first(ledger: Ledger, conn: Connection, session_id: int, skey: bytes,
                   raw: np.ndarray, need: int, plan: Any) -> np.ndarray:
    """FedCP: which of a batch's candidate agents (pseudonyms ``raw``) may take one of the
    ``need`` free slots. The agents holding an agent token for the session — at most m
    (:mod:`privcal.storage.agent_slots`), invited before any data — keep a slot each until
    they answer; an agent without one (an ingestor's, a file's) takes only a slot no invited
    agent waits for, a uniformly random subset if fewer are left: a batch never displaces an
    invited agent, so it cannot choose the m agents used by arrival among more (red team 25,
    fedlocal2); of more than m (minted before that cap) the first m invited (red team 26, L2)."""
    keep = np.ones(raw.shape[0], dtype=bool)
    held = token_agents(conn, session_id, first=plan.m)
    if not held:
        return keep
    invited = np.unique(pseudonyms_raw(skey, held))
    answered, _, _ = ledger.probe_batch(conn, session_id, invited)
    waiting = np.setdiff1d(invited, answered)
    others = np.flatnonzero(~np.isin(raw, waiting))
    room = max(0, need - int(waiting.shape[0]))
    if others.size > room:
        keep[others] = False
        keep[others[_sampler().choice(others.size, size=room, replace=False)]] = True
    return keep


def _advance_round(st: dict[str, Any], proto: LdpScoreProtocol, ones: int,
                   n_acc: int) -> tuple[bool, dict[str, Any] | None]:
    """ldp-score: count the accepted reports (``ones`` of them 1) in the state ``st``; a full
    round answers its query and the protocol moves to the next round or finishes.
    (advanced, release args if done)."""
    st["round_count"] = int(st["round_count"]) + n_acc
    st["round_ones"] = int(st["round_ones"]) + ones
    if st["round_count"] < proto.group_size:
        return False, None
    proto = proto.advance(int(st["round_ones"]), int(st["round_count"]))
    st.update(protocol=dump_protocol(proto), round_count=0, round_ones=0)
    return True, ldp_release_args(proto) if proto.finished else None


def _batch_digest(skey: bytes, session_id: Any, praw: np.ndarray, vals: np.ndarray,
                  rounds: Any) -> str:
    """What an idempotency key binds: a keyed digest of the batch's ids (through their raw
    pseudonyms ``praw``), values and rounds."""
    rnd = None if rounds is None else np.asarray(rounds, dtype=object).ravel().tolist()
    body = canonical(json_safe([[str(v) for v in np.asarray(vals, dtype=object).tolist()],
                                rnd]))
    return request_digest({
        "kind": "session batch", "session_id": str(session_id),
        "subjects": subjects_digest_raw(skey, praw),
        "reports": hmac.new(skey, body.encode("utf-8", "surrogatepass"),
                            "sha256").hexdigest()})


@in_library_context  # its own decimal context (red team 6)
def submit_reports(
    accountant: Accountant,
    session_id: int,
    subjects: Sequence[Any] | np.ndarray,
    values: Sequence[Any] | np.ndarray,
    rounds: Sequence[Any] | np.ndarray | None = None,
    *,
    idempotency_key: str | None = None,
    strict: bool = False,
    tokens: Sequence[str] = (),
) -> SubmitResult:
    """Ingest one batch of reports (subject id + bit, or agent id + message) in one
    transaction; see :mod:`privcal.accountant.sessions` for the filters, charging and
    advancing.

    Raises on a malformed batch (lengths differ, empty, float or over-long ids) or an
    unknown session; otherwise returns the counts, writing nothing if none is accepted.
    ``rounds`` (one per row) says which round's query each report answers; an ldp-score
    batch without rounds is refused (InvalidInput, nothing written): counted toward
    whatever round is open when it is written, reports answering an earlier round's query
    would be taken for answers to another query, and the release would record a coverage
    guarantee it does not have. Federated sessions have one round and need none.
    ``idempotency_key`` (unique per session) binds the batch — a keyed digest of its
    subject ids, values and rounds: the same key and batch return the recorded result
    (``replayed=True``), a different batch is an error naming the key. ``strict`` (the CLI's
    file): a malformed value or round in any row refuses the whole batch (InvalidInput naming
    the first, nothing written) instead of being counted per row as a device's report is;
    the per-subject reasons (already reported, duplicate, over its cap, another round) stay
    counted per row. ``tokens`` (the service's report writer): the ids of the API tokens
    the batch's reports were sent under, checked in the transaction once it holds the
    session's lock — :class:`TokensNotInForce`, nothing written, if any is revoked, expired
    or not bound to this session by then (why that misses no revocation:
    :func:`~privcal.storage.token_checks.tokens_not_in_force`).
    """
    subjects, vals, rounds = P.batch_inputs(subjects, values, rounds)  # read once (api F6)
    # one normalisation of ids for the CLI, the API and sessions (issue 14.4)
    sids = id_strings(subjects, "subject ids", people=True)
    if sids.size == 0:
        raise InvalidInput("a batch needs a non-empty 1-D list of subject ids")
    if vals.shape[0] != sids.shape[0]:
        raise InvalidInput(f"the batch has {sids.shape[0]} subject ids but {vals.shape[0]} values")
    n = int(sids.shape[0])
    ledger = accountant.ledger
    key = idempotency_key_text(idempotency_key)
    skey = ledger.subject_key()
    # stored and looked up, never the ids: one HMAC per id, once per batch (raw S32 bytes)
    praw = pseudonyms_raw(skey, sids.tolist())
    digest = None if key is None else _batch_digest(skey, session_id, praw, vals, rounds)

    def tx(conn: Connection) -> SubmitResult:
        # on the driver (storage/statements.py): the fixed cost of a batch is its statements
        row, ds, last_batch = ledger.lock_batch_session(conn, session_key(session_id))
        if tokens:  # after the session's lock, which a revocation takes too (red team 21)
            gone = tokens_not_in_force(ledger, conn, row.id, tokens)
            if gone:
                raise TokensNotInForce(gone)
        if rounds is None and row.method == "ldp-score":  # before anything is written
            raise InvalidInput(NO_ROUNDS.format(sid=row.id))
        if key is not None:
            done = ledger.batch_by_key(conn, row.id, key)
            if done is not None:
                if done.request_digest != digest:
                    raise InvalidInput(
                        f"idempotency key {key!r} was already used for a different batch of "
                        f"session {row.id} (batch {done.batch}): use a new key")
                return SubmitResult(**done.result, replayed=True, batch=done.batch,
                                    session=info_of(ledger, conn, row, ds.name))
        why: Counter[str] = Counter()
        if row.status != "open":
            raise _NothingAccepted({R.LATE.format(status=row.status): n})
        _check_shuffle(row, ds)  # a claim the installed code makes, else nothing (red team 26)
        fed = row.method != "ldp-score"
        proto = None if fed else protocol_of(row)
        plan = fed_plan_of(row) if fed else None
        current = 0 if fed else proto.round  # type: ignore[union-attr]
        eps0 = row.state.get("eps0")
        charged = eps0 is not None
        count = 1 if fed else proto.rounds  # type: ignore[union-attr]
        cand, stored, spent = _candidates(ledger, conn, row, plan, (current, count), praw, vals,
                                          rounds, ds.id if charged else None, why, strict)
        if fed:
            need = plan.m - int(row.state.get("total", 0))  # type: ignore[union-attr]
        else:
            need = proto.group_size - int(row.state.get("round_count", 0))  # type: ignore
        has = np.zeros(cand.shape[0], dtype=bool)
        if charged:
            e_units = spend_units(Decimal(eps0))
            cap_u = cap_units(ds.subject_epsilon or Decimal(0))
            # budget before fullness: drop the over-cap first, so they do not take a slot
            has, units = spent.lookup(praw[cand])
            is_over = units > cap_u - e_units
            why[R.OVER_CAP] += int(is_over.sum())
            cand, has = cand[~is_over], has[~is_over]
        if fed:
            keep = _invited_first(ledger, conn, row.id, skey, praw[cand], need, plan)
            why[R.RESERVED] += int(cand.size - keep.sum())
            cand, has = cand[keep], has[keep]
        if cand.size > need:
            # a uniformly random subset, never the first rows: a batch's order may depend on
            # its values (a shuffler that outputs the sorted multiset, an export ORDER BY bit),
            # and LDP-CP-S / FedCP assume the round's group is a random sample (red team 6)
            pick = np.sort(_sampler().choice(cand.size, size=need, replace=False))
            chosen, has = cand[pick], has[pick]
        else:
            chosen = cand
        why[R.EXTRA_AGENT if fed else R.ROUND_FULL] += int(cand.size - chosen.size)
        reasons = {k: v for k, v in why.items() if v}
        if chosen.size == 0:
            raise _NothingAccepted(reasons)
        # from here on in pseudonym order: the primary keys fill in key order, the members
        # blob and the reports digest need that order, one sort serves them all
        order = np.argsort(praw[chosen])
        chosen, has = chosen[order], has[order]
        acc_raw = praw[chosen]
        n_acc = int(chosen.size)
        n_rej = n - n_acc
        charge_id: int | None = None
        if charged:
            ledger.charge_probed(conn, ds.id, acc_raw[~has], acc_raw[has], e_units, cap_u)
            # who was charged: stored with the charge, committed to by its audit entry
            blob, mdigest = members_commitment(key_id(skey), acc_raw, presorted=True)
            values: dict[str, Any] = {
                "dataset_id": ds.id, "scope": "subjects", "notion": "local", "epsilon": None,
                "delta": None, "rho": None, "eps0": Decimal(eps0), "subjects_accepted": n_acc,
                "subjects_rejected": n_rej,
                "purpose": f"session {row.id}: {row.method} round {current}",
                "requester": row.requester, "idempotency_key": None, "created_at": now(),
                "request_digest": None, "members_digest": mdigest}
            charge_id = ledger.insert_charge(conn, values, members=blob)
            ledger.append_audit(conn, "charge", charge_doc(  # type: ignore[arg-type]
                SimpleNamespace(id=charge_id, **values), ds.name))
        acc_vals: np.ndarray | list[str] = (
            stored[chosen] if isinstance(stored, np.ndarray)
            else [stored[i] for i in chosen.tolist()])
        batch = last_batch + 1
        ledger.insert_batch_reports(conn, row.id, current, acc_raw, acc_vals, batch)
        st = dict(row.state)
        st["total"] = int(st.get("total", 0)) + n_acc
        if charge_id is not None:
            st["charge_ids"] = [*st.get("charge_ids", []), charge_id]
        advanced, finish = False, None
        if proto is not None:
            ones = int(np.count_nonzero(np.asarray(acc_vals) == b"1"))
            advanced, finish = _advance_round(st, proto, ones, n_acc)
        elif st["total"] >= plan.m:  # type: ignore[union-attr]
            advanced = True
            finish = fed_release_args(accountant, conn, row, plan)  # type: ignore[arg-type]
        result = {"session_id": row.id, "batch_round": current, "accepted": n_acc,
                  "rejected": n_rej, "reasons": dict(sorted(reasons.items())),
                  "charge_id": charge_id, "epsilon": eps0, "advanced": advanced}
        row = row._replace(state=st, updated_at=now())
        ledger.record_batch(conn, row.id, st, row.updated_at, batch, key, digest, result)
        ledger.append_audit(conn, "session_batch", {
            "session_id": row.id, "round": current, "accepted": n_acc, "rejected": n_rej,
            "reasons": dict(sorted(reasons.items())), "charge_id": charge_id,
            "eps0": eps0, "advanced": advanced, "batch": batch,
            "idempotency_key": key, "request_digest": digest,
            "reports_digest": reports_digest_sorted(acc_raw, current, acc_vals),
            # keyed: st holds the open round's count of ones (red team 7, B-1)
            "status": row.status, "state_digest": keyed_state_digest(skey, st),
        })
        if finish is None:
            return SubmitResult(**result, batch=batch,
                                session=info_of(ledger, conn, row, ds.name))
        # the last batch: the release, through the ORM (once per session)
        with ledger.orm_in_core(conn) as s:
            row_o = s.get(CollectionSession, row.id)
            ds_o = s.get(Dataset, ds.id)
            release_in_tx(accountant, s, ds_o, row_o,  # type: ignore[arg-type]
                          state_key=skey, privacy_extra=st.get("privacy_extra"), **finish)
            return SubmitResult(**result, batch=batch, session=info_of(ledger, s, row_o, ds.name))

    try:
        return ledger.write_core(tx)
    except _NothingAccepted as nothing:
        info = session_status(accountant, session_id)
        return SubmitResult(
            session_id=info.id, batch_round=info.round, accepted=0, rejected=n,
            reasons=dict(sorted(nothing.reasons.items())), charge_id=None,
            epsilon=None, advanced=False, session=info)
