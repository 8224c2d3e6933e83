"""Per-subject local-DP charges: ε0 charged to each listed subject against the dataset's
per-subject cap, in bulk, with an optional central cost charged in the same transaction.

A batch is one write transaction (:meth:`privcal.storage.Ledger.write_core`):

1. lock the dataset row; with an idempotency key, replay an earlier identical batch
   (its counts, and ``accepted_mask`` recovered from the stored pseudonyms);
2. charge every distinct subject that has room under its cap, in one set-based
   statement (:meth:`~privcal.storage.Ledger.bulk_charge_subjects`); a subject listed
   several times is charged once, for one of its rows chosen uniformly at random
   (:func:`one_row_per_subject`; with an idempotency key, the same rows on a replay), the
   others are duplicates; a batch
   in which no subject can be charged is refused, writing nothing, unless
   ``refuse_if_none=False``;
3. the central cost, possibly a function of who was accepted (the amplified ε of the
   reports actually shuffled), is checked and charged
   (:func:`~privcal.accountant.charges.charge_central`); a refusal there rolls the
   subject charges back;
4. the local-DP charge row, the sorted pseudonyms it charged (``charge_members``) and
   its audit entry, which commits to them by digest — never to the ids.

Subject ids are stored only as keyed pseudonyms (:mod:`privcal.storage.pseudonyms`), so
``audit verify`` recomputes every per-subject spend without ever seeing an id.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Sequence
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import numpy as np

from privcal.accountant import privacy as acc
from privcal.accountant.charges import charge_central, check_replay
from privcal.accountant.normalize import (
    CENTRAL_KEY_SUFFIX,
    CentralCost,
    bound_digest,
    cost_json,
    normalize_cost,
    optional_text,
    parse_amount,
)
from privcal.accountant.normalize import idempotency_key as idempotency_key_text
from privcal.accountant.policy import receipt_of
from privcal.accountant.results import SubjectChargeResult
from privcal.calibrators.validation import id_strings
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import BudgetRefused, InvalidInput
from privcal.storage import Ledger, pseudonyms
from privcal.storage.audit import charge_doc, now
from privcal.storage.models import cap_units, spend_units
from privcal.storage.pseudonyms import hex_of, key_id, pseudonyms_raw, subjects_digest

__all__ = ["charge_subjects", "one_row_per_subject"]


def _row_choice(skey: bytes, key: str | None, digest: str | None
                ) -> np.random.Generator | None:
    """The generator that chooses a repeated subject's row: for a request with an
    idempotency key, seeded by an HMAC (the ledger's secret key) of the key and the
    request's digest, so that a replay keeps the same rows — rows nobody without the ledger's
    secret can know before the first charge under that key (after it, a replay tells them:
    the choice is independent of the data, not secret from whoever holds the key); else
    None (the operating system's CSPRNG)."""
    if key is None or digest is None:
        return None
    msg = b"privcal row choice\x00" + key.encode("utf-8") + b"\x00" + digest.encode("ascii")
    mac = hmac.new(skey, msg, hashlib.sha256)
    return np.random.default_rng(int.from_bytes(mac.digest()[:16], "big"))


def one_row_per_subject(inverse: np.ndarray, subjects: int,
                        rng: np.random.Generator | None = None) -> np.ndarray:
    """The rows kept of a batch whose row i belongs to subject ``inverse[i]`` (of
    ``subjects``): one per subject, chosen uniformly at random among its rows by ``rng``
    (default: seeded from the operating system's CSPRNG).

    Not the first row in input order (red team 19, coverage F3): files are routinely
    sorted (by score, risk, label or time), and the first row of each subject in a file
    sorted by score is its smallest — a calibration on those rows recorded coverage ≥ 0.9
    that held at 0.78–0.85. A uniform choice made independently of the data and of their
    order keeps the kept rows i.i.d. whenever the subjects are, each kept row drawn from
    its subject's rows."""
    n = inverse.shape[0]
    keep = np.zeros(n, dtype=bool)
    if subjects == n:  # no subject repeated: every row
        keep[:] = True
        return keep
    if rng is None:
        rng = np.random.default_rng(secrets.randbits(128))
    order = rng.permutation(n)
    _, first = np.unique(inverse[order], return_index=True)
    keep[order[first]] = True
    return keep


def charge_subjects(
    ledger: Ledger,
    dataset: str,
    eps0: float | str | Decimal | LocalDP,
    subject_ids: Sequence[Any] | np.ndarray,
    *,
    central_cost: CentralCost | Callable[[np.ndarray], CentralCost | None] | None = None,
    purpose: str | None = None,
    requester: str | None = None,
    idempotency_key: str | None = None,
    refuse_if_none: bool = True,
    request: dict[str, Any] | None = None,
) -> SubjectChargeResult:
    """:meth:`privcal.accountant.Accountant.charge_subjects` (steps in the module docstring)."""
    cost0 = eps0 if isinstance(eps0, LocalDP) else LocalDP(eps0=parse_amount(eps0, "ε0"))
    cost0 = normalize_cost(cost0)  # type: ignore[assignment]
    assert isinstance(cost0, LocalDP)
    def central_of(accepted: np.ndarray) -> CentralCost | None:
        cc = central_cost(accepted) if callable(central_cost) else central_cost
        if cc is None:
            return None
        if not isinstance(cc, PureDP | ZCDP | ApproxDP):
            raise InvalidInput("central_cost must be a central cost (PureDP, ZCDP, ApproxDP)")
        return normalize_cost(cc)  # type: ignore[return-value]

    if not callable(central_cost):
        central_of(np.ones(0, dtype=bool))  # a bad central cost fails before any work
    if isinstance(subject_ids, str):
        raise InvalidInput("subject_ids must be a sequence of ids, not one string")
    sids = id_strings(subject_ids, "subject ids", people=True)  # one normalisation (14.4)
    if sids.size == 0:
        raise InvalidInput("subject_ids must be a non-empty 1-D sequence")
    uniq, inverse = np.unique(sids, return_inverse=True)
    n_dup = int(sids.shape[0] - uniq.shape[0])
    purpose = optional_text(purpose, "purpose", 10_000)
    requester = optional_text(requester, "requester")
    key = idempotency_key_text(idempotency_key)
    e_units = spend_units(cost0.eps0)
    skey = ledger.subject_key()
    kid = key_id(skey)
    # what the ledger stores, never the ids; staged in pseudonym order, so that the
    # primary-key B-tree is filled in key order (random order is ~4× slower on SQLite)
    raw = pseudonyms_raw(skey, uniq.tolist())
    by_key = np.argsort(raw)
    raw_sorted = raw[by_key]
    pseud, pseud_sorted = hex_of(raw), hex_of(raw_sorted)
    digest, earlier = None, ()
    if key is not None:
        req = request if request is not None else {
            "kind": "subjects", "purpose": purpose,
            "central_cost": ("computed from the accepted subjects" if callable(central_cost)
                             else cost_json(central_of(np.ones(0, dtype=bool)))
                             if central_cost is not None else None)}
        digest, earlier = bound_digest({**req, "dataset": dataset,
                                       "eps0": acc.dstr(cost0.eps0),
                                       "subjects": subjects_digest(skey, sids.tolist())},
                                      requester)
    kept = one_row_per_subject(inverse, uniq.shape[0], _row_choice(skey, key, digest))

    def tx(conn: Any) -> SubjectChargeResult:
        ds = ledger.dataset_row(conn, dataset)
        if key is not None:
            old = ledger.charge_by_key(conn, ds.id, key)
            if old is not None:
                check_replay(old, key, digest, scope="subjects",
                             same_cost=old.eps0 == cost0.eps0, legacy=earlier,
                             requester=requester)
                # the run's own central charge: under KEY#central *and* for this request
                # (both rows carry its digest; a caller cannot take the suffix, but a
                # ledger written before it was reserved may hold such a key). Both written
                # before migration 0005 (no digests): the run's, as they were then.
                central_old = ledger.charge_by_key(conn, ds.id, key + CENTRAL_KEY_SUFFIX)
                legacy = old.request_digest is None and central_old is not None and (
                    central_old.request_digest is None and central_old.scope == "dataset")
                if central_old is not None and not legacy and (  # (check_replay: old's
                        central_old.request_digest != old.request_digest):  # is this request's)
                    central_old = None
                members = (ledger.members_of(conn, old.id)
                           if old.members_digest is not None else None)
                if old.request_digest is None:
                    _check_legacy_replay(old, key, members, pseud, sids.shape[0])
                mask = None
                if members is not None:  # recover who was charged
                    mask = kept & np.isin(pseud, members)[inverse]
                return SubjectChargeResult(
                    charge_id=old.id, dataset=ds.name, eps0=cost0.eps0,
                    accepted=old.subjects_accepted or 0, rejected=old.subjects_rejected or 0,
                    rejected_over_cap=max(0, (old.subjects_rejected or 0) - n_dup),
                    rejected_duplicate=n_dup, accepted_mask=mask,
                    central=receipt_of(central_old, ds, replayed=True) if central_old else None,
                    replayed=True, reason="replayed",
                )
        if ds.subject_epsilon is None:
            raise BudgetRefused(
                f"budget refused on dataset {ds.name!r}: it has no per-subject ε cap for "
                "local-DP charges (create it with --subject-epsilon)",
                scope=f"dataset {ds.name!r} subjects", asked=cost0.describe(), remaining="",
            )
        cap_u = cap_units(ds.subject_epsilon)
        if e_units > cap_u:
            over_u = np.ones(uniq.shape[0], dtype=bool)
        else:
            over = ledger.bulk_charge_subjects(conn, ds.id, pseud_sorted, e_units, cap_u)
            over_u = np.isin(pseud, np.asarray(over, dtype="<U64"))
        n_over = int(over_u.sum())
        accepted_mask = kept & ~over_u[inverse]
        n_acc = int(accepted_mask.sum())
        n_rej = int(sids.shape[0] - n_acc)
        if n_acc == 0 and refuse_if_none:
            raise BudgetRefused(
                f"budget refused on the subjects of dataset {ds.name!r}: asked "
                f"{cost0.describe()}, no listed subject has that much left of its "
                f"ε cap {acc.dstr(ds.subject_epsilon)} ({n_over} over cap, "
                f"{n_dup} duplicates)",
                scope=f"dataset {ds.name!r} subjects", asked=cost0.describe(),
                remaining="0 for every listed subject",
            )
        # the central cost may depend on who was accepted (e.g. the amplified ε of the
        # reports actually shuffled); a refusal here rolls the subject charges back too
        cc = central_of(accepted_mask)
        central = None
        if cc is not None:
            central = charge_central(
                ledger, conn, ds, cc, purpose, requester,
                key + CENTRAL_KEY_SUFFIX if key is not None else None, digest,
            )
        blob, mdigest = pseudonyms.members_commitment(kid, raw_sorted[~over_u[by_key]],
                                                      presorted=True)
        values: dict[str, Any] = {
            "dataset_id": ds.id, "scope": "subjects", "notion": "local", "epsilon": None,
            "delta": None, "rho": None, "eps0": cost0.eps0, "subjects_accepted": n_acc,
            "subjects_rejected": n_rej, "purpose": purpose, "requester": requester,
            "idempotency_key": key, "created_at": now(), "request_digest": digest,
            "members_digest": mdigest,
        }
        c = SimpleNamespace(id=ledger.insert_charge(conn, values, members=blob), **values)
        ledger.append_audit(conn, "charge", charge_doc(c, ds.name))  # type: ignore[arg-type]
        reason = (f"{n_over} subject(s) over the per-subject cap "
                  f"{acc.dstr(ds.subject_epsilon)}, {n_dup} duplicate(s) in the batch")
        return SubjectChargeResult(
            charge_id=c.id, dataset=ds.name, eps0=cost0.eps0, accepted=n_acc,
            rejected=n_rej, rejected_over_cap=n_over, rejected_duplicate=n_dup,
            accepted_mask=accepted_mask,
            central=central,
            reason=reason,
        )

    return ledger.write_core(tx)


def _check_legacy_replay(old: Any, key: str, members: Any, pseud: np.ndarray,
                         n_ids: int) -> None:
    """InvalidInput unless a replay of ``old`` — a local-DP batch charged before migration
    0005, with no request digest, whose scope and ε0 match — can be told to be this very
    request (red team 9): who it charged must be known (its members, recorded since 0005)
    and all among this request's subjects, and it must have counted as many ids as this one
    gives. Otherwise its replay would answer "replayed, accepted 3" for ids it never
    charged, and their spend would not hold their cap; nothing is charged (a new key
    charges these subjects, counted again: never less than they spent)."""
    counted = (old.subjects_accepted or 0) + (old.subjects_rejected or 0)
    if members is None:
        raise InvalidInput(
            f"idempotency key {key!r} was used for a local-DP batch (charge {old.id}) charged "
            "before privcal recorded its request or who it charged (migration 0005): whether "
            "this is that request cannot be told; nothing was charged (a new key charges "
            "these subjects)")
    if counted != n_ids or not bool(np.isin(np.asarray(members), pseud).all()):
        raise InvalidInput(
            f"idempotency key {key!r} was already used for a different charge or request "
            f"(charge {old.id}: a local-DP batch of {counted} ids, charged before migration "
            "0005); use a new key")
