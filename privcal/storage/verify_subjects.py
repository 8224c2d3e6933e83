"""Verifying per-subject spends: each recomputed from the audit chain (issue 16 item 3).

Part of :meth:`privcal.storage.verify.LedgerVerifier.verify`. Subjects are keyed
pseudonyms; the chain commits, per local-DP charge, a digest of the pseudonyms it charged
(``charge_members``) and, in the 0005 ``migration`` entry, the per-subject baseline. The
stored ``subject_spend`` rows must equal baseline + Σ ε0 of the charges whose members
include the subject, subject by subject, in exact integer units.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from privcal.errors import AuditFailed
from privcal.storage import pseudonyms
from privcal.storage.models import (
    Charge,
    ChargeMembers,
    Dataset,
    SubjectBaseline,
    SubjectSpend,
    cap_units,
    read_ledger_secret,
    spend_units,
    units_eps,
)

__all__ = ["check_subject_spends", "stored_units"]


def stored_units(s: Session, datasets: dict[int, Dataset]) -> dict[int, int]:
    """Per dataset id, the sum of its stored per-subject spends (exact units). An AuditFailed
    naming the dataset whose sum SQLite cannot hold (``integer overflow`` past 2⁶³ − 1: no
    ledger written by privcal comes near it, the rows were edited — red team 22, ledger F2:
    a traceback and exit 1, not exit 4); PostgreSQL's ``sum`` of a bigint is exact."""
    sums = select(SubjectSpend.dataset_id, func.sum(SubjectSpend.spent_units))
    try:
        return {int(k): int(v or 0) for k, v in s.execute(
            sums.group_by(SubjectSpend.dataset_id)).all()}
    except OperationalError as exc:
        if "integer overflow" not in str(exc):
            raise
    for ds in datasets.values():
        try:
            s.execute(sums.where(SubjectSpend.dataset_id == ds.id).group_by(
                SubjectSpend.dataset_id)).all()
        except OperationalError:
            raise AuditFailed(f"dataset {ds.id} ({ds.name!r}): per-subject spends add up to "
                              "more than 2**63 − 1 units (rows edited)") from None
    raise AuditFailed("per-subject spends add up to more than 2**63 − 1 units in a dataset "
                      "the ledger does not hold (rows edited)")


def _s32(hex_ids: list[str]) -> np.ndarray:
    """Hex pseudonyms as 32-byte NumPy strings; a stored subject that is not exactly a
    pseudonym's text — 64 lower-case hex digits — fails verification. privcal finds a
    subject by that exact text, while ``bytes.fromhex`` reads either case and skips spaces:
    an id upper-cased, or hex digits moved from one row to the next, read as the same bytes
    and verified, while the subjects' spends read as 0 to every charge after."""
    w = 2 * pseudonyms.PSEUDONYM_BYTES
    try:
        text = "".join(hex_ids)
        raw = bytes.fromhex(text)
    except (TypeError, ValueError) as exc:
        raise AuditFailed("a stored subject is not a pseudonym (row edited)") from exc
    # every id 64 characters, and the bytes read back as the very text (so 32 bytes each)
    if raw.hex() != text or any(len(h) != w for h in hex_ids):
        raise AuditFailed("a stored subject is not a pseudonym (row edited)")
    return np.frombuffer(raw, dtype="S32")


def _sum_by_key(keys: list[np.ndarray], units: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, summed units per key): exact int64 sums."""
    if not keys:
        return np.zeros(0, dtype="S32"), np.zeros(0, dtype=np.int64)
    k = np.concatenate(keys)
    u = np.concatenate(units)
    uniq, inv = np.unique(k, return_inverse=True)
    sums = np.zeros(uniq.shape[0], dtype=np.int64)
    np.add.at(sums, inv.ravel(), u)
    return uniq, sums


def _members_hex(s: Session, charge_id: int) -> set[str]:
    """The pseudonyms (hex) stored for one local-DP charge (only read to explain a failure)."""
    blob = s.scalar(select(ChargeMembers.members).where(ChargeMembers.charge_id == charge_id))
    h, w = bytes(blob or b"").hex(), 2 * pseudonyms.PSEUDONYM_BYTES
    return {h[i:i + w] for i in range(0, len(h), w)}


def _check_subject_cap(ds: Dataset | None, d: int, keys: np.ndarray,
                       units: np.ndarray) -> None:
    """Every subject's spend (as the log's charges add up) within the dataset's logged
    per-subject cap (none: no local-DP spend at all). Each charge privcal accepts keeps this
    true; a cap raised around a batch and put back, or a spend row deleted around one and
    restored, left rows equal to their entries and a subject past her cap (red team 23,
    ledger F7)."""
    if not units.size:
        return
    cap = cap_units(ds.subject_epsilon) if ds is not None and ds.subject_epsilon is not None \
        else 0
    over = units > cap
    if not over.any():
        return
    i = int(np.argmax(units))
    subj = bytes(keys[i]).ljust(pseudonyms.PSEUDONYM_BYTES, b"\x00").hex()
    name = ds.name if ds is not None else "?"
    what = (f"per-subject cap ε0 ≤ {units_eps(cap).normalize():f}" if cap else
            "per-subject cap (none: it takes no local-DP reports)")
    raise AuditFailed(
        f"dataset {d} ({name!r}): subject {subj[:16]}… has spent "
        f"ε0={units_eps(int(units[i])).normalize():f} ({int(over.sum())} subjects over), more "
        f"than its {what} allows: a cap or spend edited around a charge, or a charge "
        "accepted past its budget")


def check_subject_spends(s: Session, datasets: dict[int, Dataset],
                         charges: dict[int, Charge], charge_seq: dict[int, int],
                         migration: tuple[int, dict[str, Any]] | None) -> None:
    """Recompute every per-subject spend from the chain (issue 16 item 3).

    Expected units of (dataset, pseudonym) = its baseline (committed by the 0005
    ``migration`` entry) + ε0 of every local-DP charge whose committed members include
    it. Any difference from ``subject_spend`` — a renamed subject, moved, added or
    deleted units — fails naming the dataset and the pseudonym.
    """
    secret = read_ledger_secret(s)  # on the driver: never in SQLAlchemy's row log
    kid = pseudonyms.key_id(bytes.fromhex(secret)) if secret is not None else None
    keys: dict[int, list[np.ndarray]] = defaultdict(list)  # dataset → S32 pseudonyms
    weights: dict[int, list[np.ndarray]] = defaultdict(list)  # … and their units
    baseline: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for d, subj, units in s.execute(select(SubjectBaseline.dataset_id,
                                           SubjectBaseline.subject,
                                           SubjectBaseline.spent_units)):
        if int(units) < 0:  # what a subject spent before 0005: never below 0 (red team 13)
            raise AuditFailed(f"the per-subject baseline of dataset {d} holds negative "
                              "units (rows edited)")
        baseline[d].append((subj, int(units)))
    for d, rows in baseline.items():
        keys[d].append(_s32([r[0] for r in rows]))
        weights[d].append(np.asarray([r[1] for r in rows], dtype=np.int64))
    mdata = migration[1] if migration is not None else {}
    if migration is not None and mdata.get("subject_key") != kid:
        raise AuditFailed(f"audit entry {migration[0]}: the ledger secret of subject "
                          "pseudonyms is not the one the log recorded (secret replaced)")
    logged = mdata.get("subject_spend") or {}
    for d in sorted(set(baseline) | {int(k) for k in logged}):
        want = logged.get(str(d))
        if want is None or not pseudonyms.spend_digest_matches(baseline[d],
                                                               str(want.get("digest"))):
            where = f"audit entry {migration[0]}" if migration else "the audit log"
            raise AuditFailed(f"{where}: the per-subject baseline of dataset {d} differs "
                              "from what the log recorded (rows edited)")
    blobs = dict(s.execute(select(ChargeMembers.charge_id, ChargeMembers.members)).all())
    for cid, c in sorted(charges.items()):
        seq = charge_seq.get(cid, 0)
        if c.members_digest is None:
            if c.scope == "subjects" and c.subjects_accepted and (
                    migration is None or seq > migration[0]):
                raise AuditFailed(f"audit entry {seq}: charge {cid} does not record which "
                                  "subjects it charged")
            continue
        blob = blobs.pop(cid, None)
        if blob is None or kid is None or \
                not pseudonyms.members_digest_matches(kid, bytes(blob), c.members_digest):
            raise AuditFailed(f"audit entry {seq}: the subjects charged by charge {cid} "
                              "differ from what the log recorded (rows edited, or the "
                              "ledger secret replaced)")
        n = len(blob) // pseudonyms.PSEUDONYM_BYTES
        if n * pseudonyms.PSEUDONYM_BYTES != len(blob) or n != (c.subjects_accepted or 0):
            raise AuditFailed(f"audit entry {seq}: charge {cid} records "
                              f"{c.subjects_accepted} subjects but stores {n}")
        keys[c.dataset_id].append(np.frombuffer(bytes(blob), dtype="S32"))
        weights[c.dataset_id].append(np.full(
            n, spend_units(c.eps0 or Decimal(0)), dtype=np.int64))
    if blobs:
        raise AuditFailed(f"charge_members of charge {min(blobs)} has no logged charge "
                          "(row inserted)")
    stored: dict[int, tuple[list[str], list[int]]] = defaultdict(lambda: ([], []))
    # 10⁶ rows: the DB-API cursor directly, without ORM row objects
    for d, subj, u in s.connection().exec_driver_sql(
            "SELECT dataset_id, subject, spent_units FROM subject_spend"):
        stored[d][0].append(subj)
        stored[d][1].append(int(u))
    for d in sorted(set(keys) | set(stored)):
        want_k, want_u = _sum_by_key(keys.get(d, []), weights.get(d, []))
        got_k, got_u = _sum_by_key([_s32(stored[d][0])] if d in stored else [],
                                   [np.asarray(stored[d][1], dtype=np.int64)]
                                   if d in stored else [])
        if got_k.shape == want_k.shape and (got_k == want_k).all() and \
                (got_u == want_u).all() and len(stored[d][0]) == got_k.size:
            _check_subject_cap(datasets.get(d), d, got_k, got_u)
            continue
        exp = dict(zip(want_k.tolist(), want_u.tolist(), strict=True))
        act = dict(zip(got_k.tolist(), got_u.tolist(), strict=True))
        # a subject the log knows first: its entries are the ones to name
        bad = sorted((k for k in set(act) | set(exp) if act.get(k, 0) != exp.get(k, 0)),
                     key=lambda k: (exp.get(k, 0) == 0, k))
        if not bad:  # the same subject stored twice (cannot happen with the primary key)
            raise AuditFailed(f"dataset {d}: a subject has two spend rows (rows edited)")
        k = bad[0]
        subj = bytes(k).ljust(pseudonyms.PSEUDONYM_BYTES, b"\x00").hex()
        name = datasets[d].name if d in datasets else "?"
        seqs = [charge_seq.get(cid, 0) for cid, c in sorted(charges.items())
                if c.dataset_id == d and c.members_digest is not None
                and subj in _members_hex(s, cid)]
        raise AuditFailed(
            f"dataset {d} ({name!r}): subject {subj[:16]}… has spent "
            f"{act.get(k, 0)} units in subject_spend but the log's charges "
            f"(entries {seqs or 'none'}) add up to {exp.get(k, 0)} "
            f"({len(bad)} subject row(s) differ: renamed, moved or edited)")
