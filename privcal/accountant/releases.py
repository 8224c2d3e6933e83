"""Releases: record one tied to the charges that paid for it, and read them back typed.

A release is appended in its own write transaction after its charges committed (a crash
in between leaves a charge without a release, never the reverse): lock the dataset row,
check that the charges pay for it — every one the dataset's, none already paying for
another release (``release_charges``, by primary key) nor made by an open collection
session (whose release will name it), and a private release paid for in full (at least one
charge, costing together at least its recorded cost, a local one charging at least as many
subjects as it used reports: :func:`privcal.storage.verify_releases.shortfall`, the rule
``audit verify`` applies) — check that it states what the installed code states (its
calibrator version the installed one, its guarantee sentences the ones
:func:`privcal.accountant.verification.recompute` gives: an older wording is not written
today, so ``audit verify``'s leniency for it covers only releases written before), insert
the row and its ``release_charges`` rows and queue its audit entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from privcal.accountant.amplification import check_shuffled_dataset
from privcal.accountant.normalize import json_safe, optional_text, plain_values
from privcal.accountant.policy import dataset_info
from privcal.accountant.record_compare import zcdp_parts
from privcal.accountant.results import Release
from privcal.accountant.verification import sentence_problems
from privcal.calibrators import registry
from privcal.calibrators.base import CoverageGuarantee
from privcal.errors import BudgetRefused, InvalidInput, PrivcalError, check_row_id, first_error
from privcal.storage import Ledger
from privcal.storage.audit import release_doc, threshold_str
from privcal.storage.verify_releases import is_nonprivate, reports_used, shortfall

__all__ = ["get_release", "list_releases", "nonprivate_replay", "record_release",
           "release_for_charge"]


def list_releases(ledger: Ledger, dataset: str | None = None, **page: Any) -> list[Release]:
    """Every release (optionally of one dataset), coverage typed; ``page``: ``after``,
    ``limit`` and ``among`` of :meth:`~privcal.storage.releases.ReleaseStore.releases`."""
    return [Release.model_validate(r.model_dump()) for r in ledger.releases(dataset, **page)]


def get_release(ledger: Ledger, release_id: int, *, checked: bool = False,
                visible: Callable[[str], bool] | None = None) -> Release:
    """One release by id; ``checked``: refused (AuditFailed) unless its row is what its audit
    entry recorded (a release loaded to predict with: red team 16, F5); ``visible``: NotFound
    unless it accepts the release's dataset name, before the check
    (:meth:`~privcal.storage.releases.ReleaseStore.release`)."""
    rec = ledger.release(release_id, checked=checked, visible=visible)
    return Release.model_validate(rec.model_dump())


def release_for_charge(ledger: Ledger, charge_id: int) -> Release | None:
    """The release made under ``charge_id``, if any (a replayed run returns it)."""
    with ledger.read() as s:
        rid = ledger.release_id_for_charge(s, charge_id)
    return get_release(ledger, rid) if rid is not None else None


def nonprivate_replay(ledger: Ledger, dataset: str, key: str, digest: str,
                      earlier: tuple[str, ...] = (),
                      requester: str | None = None) -> Release | None:
    """The release a non-private calibration of ``dataset`` made under idempotency ``key``
    for the request whose digest is ``digest`` (a retry: the same release) — or, by the same
    ``requester``, one of ``earlier``, the digests an older privcal gave the same request
    (:func:`~privcal.accountant.normalize.bound_digest`); None if the key is unused there;
    InvalidInput if it was used for another request — another non-private calibration, or a
    charge of the dataset (charged requests bind their key in their charge). Migration 0010:
    before it, such a key bound nothing."""
    with ledger.read() as s:
        ds = ledger.get_dataset(s, dataset)
        had = ledger.release_by_key(s, ds.id, key)
        old = ledger.charge_by_key(s.connection(), ds.id, key) if had is None else None
    if old is not None:
        from privcal.accountant.charges import check_replay

        check_replay(old, key, digest, scope="dataset", same_cost=False)
    if had is None:
        return None
    rel = get_release(ledger, had[1])
    if had[0] != digest and not (had[0] in earlier and rel.requester == requester):
        raise _reused(key, had[1])
    return rel


def _bound_release(ledger: Ledger, s: Any, dataset_id: int, key: str,
                   digest: str) -> int | None:
    """The id of the release bound to ``key`` (``release_keys``) if it was made for the
    request of digest ``digest``; None if none is; InvalidInput naming it if it was made
    for another request."""
    had = ledger.release_by_key(s, dataset_id, key)
    if had is None:
        return None
    if had[0] != digest:
        raise _reused(key, had[1])
    return had[1]


def _reused(key: str, release_id: int) -> InvalidInput:
    """The error of a key bound to non-private release ``release_id`` for another request."""
    return InvalidInput(
        f"idempotency key {key!r} was already used for a different request (release "
        f"{release_id}, a non-private calibration); a key binds the whole request — kind, "
        "dataset, method, every parameter, the cost and the data's public shape: use a new key")


def record_release(
    ledger: Ledger,
    dataset: str,
    *,
    method: str,
    calibrator_version: str,
    threshold: float,
    params: dict[str, Any],
    shape: dict[str, Any],
    coverage: CoverageGuarantee | dict[str, Any],
    privacy: dict[str, Any],
    diagnostics: dict[str, Any] | None = None,
    distribution: str = "privcal",
    distribution_version: str = "unknown",
    requester: str | None = None,
    charge_ids: Sequence[int] = (),
    _as_computed: bool = False,
    _key: tuple[str, str] | None = None,
    _calibrator: Any = None,
) -> Release:
    """:meth:`privcal.accountant.Accountant.record_release` (see the module docstring).

    ``_as_computed`` (not public): the caller computed coverage and privacy with the
    installed calibrator it names (``Accountant.run``), so they are not recomputed; tests
    also use it to write an older version's release as it was written then. ``_key`` (not
    public): (idempotency key, request digest) of a non-private run, bound to the release in
    its transaction (:func:`nonprivate_replay`); a release already bound to the key for the
    same request (a concurrent retry) is returned instead of a second. ``_calibrator`` (not
    public): the calibrator that computed it (``_as_computed``), which may not be registered
    — whose parts the run charged (:func:`~privcal.accountant.record_compare.zcdp_parts`)."""
    threshold = plain_values(threshold)  # one value: a subclass's own __float__ never asked
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise InvalidInput(f"threshold must be a number, got {threshold!r}")
    thr = threshold_str(float(threshold)) if not math.isnan(threshold) else None
    if thr is None:
        raise InvalidInput("threshold is NaN")
    cov = coverage if isinstance(coverage, CoverageGuarantee) else _coverage(coverage)
    if isinstance(charge_ids, str | bytes):
        raise InvalidInput("charge_ids must be a sequence of charge ids")
    ids = [check_row_id(i, "charge") for i in charge_ids]
    _check_sizes(shape)  # a size past 10⁹ said as such, before JSON is asked to hold it
    row_data = {
        "method": str(method), "calibrator_version": str(calibrator_version),
        "distribution": str(distribution), "distribution_version": str(distribution_version),
        "params": json_safe(params), "shape": json_safe(shape), "threshold": thr,
        "coverage": json_safe(cov), "privacy": json_safe(privacy),
        "diagnostics": json_safe(diagnostics or {}),
        "requester": optional_text(requester, "requester"),
    }

    if len(set(ids)) != len(ids):
        raise InvalidInput("charge_ids names a charge twice")

    _check_shape(row_data["shape"])
    rel = SimpleNamespace(method=row_data["method"], dataset=dataset,
                          calibrator_version=row_data["calibrator_version"],
                          params=row_data["params"], shape=row_data["shape"],
                          coverage=row_data["coverage"], privacy=row_data["privacy"])
    cal = None
    if not _as_computed:  # recomputed before the dataset's lock is taken (it may be slow)
        with ledger.read() as s:
            info = dataset_info(ledger.get_dataset(s, dataset))
        bad = sentence_problems(rel, info)
        if bad:
            raise InvalidInput(f"the release does not state what the installed code "
                               f"states: {bad[0]}")
        cal = registry.get(rel.method).calibrator
    made_by = cal if cal is not None else _calibrator

    def tx(s: Any) -> Release | int:
        ds = ledger.lock_dataset(s, dataset)
        if _key is not None:
            rid = _bound_release(ledger, s, ds.id, *_key)
            if rid is not None:
                return rid  # read after this transaction
        paid = ledger.charges_paid(s, ids)
        for cid in ids:
            if cid not in paid or paid[cid].dataset_id != ds.id:
                raise InvalidInput(f"charge {cid} is not a charge of dataset {dataset!r}")
        owners = ledger.charge_owners(s, ids)
        for cid in ids:
            if cid in owners:
                raise InvalidInput(f"charge {cid} already has a release ({owners[cid]}): a "
                                   "charge pays for one release")
        sessions = ledger.open_session_charges(s, ds.id) if ids else {}
        for cid in ids:
            if cid in sessions:
                raise InvalidInput(f"charge {cid} was made by collection session "
                                   f"{sessions[cid]} (open, or abandoned with its reports "
                                   "stored): a charge pays for one release")
        if is_nonprivate(row_data["privacy"]) and not ds.allow_nonprivate:
            # as a run refuses it (red team 23, ledger F8: recorded here, it made the
            # dataset's stated guarantee false and verified ok)
            raise BudgetRefused(
                f"non-private release refused: dataset {dataset!r} does not allow "
                "non-private releases (create it with --allow-nonprivate)",
                scope=f"dataset {dataset!r}", asked="non-private", remaining="")
        if _is_shuffled(row_data["privacy"]):
            # a shuffled release states an amplified central (ε, δ) that only an (ε, δ) cap
            # is charged: refused elsewhere as a run refuses it (red team 25, privacy F3)
            check_shuffled_dataset(ds)
        why = shortfall(row_data["privacy"], [paid[cid] for cid in ids], reports_used(
            row_data["shape"], session_total=None,
            federated=getattr(cal, "privacy_model", None) == "federated" if cal else None),
            zcdp_parts=_parts(made_by, rel, row_data["privacy"], ds.notion))
        if why is not None:
            raise InvalidInput(f"the release {why}: charge its cost first (Accountant.charge "
                               "or charge_subjects) and pass those charge_ids")
        row = ledger.insert_release(s, ds.id, row_data, ids, _key)
        ledger.append_audit(s, "release", release_doc(row, ds.name))
        return Release.model_validate(ledger.release_record(row, ds.name).model_dump())

    done = ledger.write(tx)
    return get_release(ledger, done) if isinstance(done, int) else done


def _parts(cal: Any, rel: Any, privacy: Any, notion: str) -> list[Any] | None:
    """:func:`~privcal.accountant.record_compare.zcdp_parts` of the release, by ``cal`` (else
    the registered calibrator of its method; an unknown one: its cost whole)."""
    if notion != "zcdp":
        return None
    if cal is None:
        try:
            cal = registry.get(rel.method).calibrator
        except PrivcalError:
            cal = None  # no wrapper privcal knows: its pure cost is one mechanism's
    return zcdp_parts(cal, rel, privacy, notion)


#: the most rows (or subjects) a recorded shape may name: more than any calibration runs
_MAX_N = 10**9


def _is_shuffled(privacy: Any) -> bool:
    """Whether a privacy record is a shuffled run's (its ``extra`` says ``shuffled``)."""
    extra = privacy.get("extra") if isinstance(privacy, dict) else None
    return isinstance(extra, dict) and bool(extra.get("shuffled"))


def _coverage(coverage: Any) -> CoverageGuarantee:
    """``coverage`` as a CoverageGuarantee, or a one-line InvalidInput (red team 15: an
    unknown key gave pydantic's multi-line error)."""
    from pydantic import ValidationError

    try:
        return CoverageGuarantee.model_validate(coverage)
    except ValidationError as exc:
        where, msg, _ = first_error(exc)
        raise InvalidInput(f"coverage is not a coverage guarantee: {where or 'coverage'}: "
                           f"{msg}") from None


def _check_sizes(shape: Any) -> None:
    """A recorded shape's sizes are what a run records: ``n`` an integer in 1 … 10⁹ (and the
    other sizes integers; NumPy integers are integers here, the record's JSON makes them
    Python ones). ``60.0`` or ``"60"`` read as 60 when the guarantee is recomputed, but
    counted no reports when the payment was checked (red team 5); ``n = 10¹⁸`` kept the
    recomputation running for minutes."""
    import numpy as np

    if not isinstance(shape, dict):
        raise InvalidInput("shape must be an object with n (and k, group_sizes)")
    groups = shape.get("group_sizes")
    many = list(groups) if isinstance(groups, list | tuple | np.ndarray) else [groups]
    sizes = [shape.get("n"), shape.get("k"), *many]
    if any(v is not None and (isinstance(v, bool | np.bool_)
                              or not isinstance(v, int | np.integer) or v > _MAX_N)
           for v in sizes):
        raise InvalidInput(f"shape sizes must be integers of at most {_MAX_N:,} "
                           f"(n, k, group_sizes), got {shape!r:.120}")


def _check_shape(shape: Any) -> None:
    """A recorded shape, its sizes already checked (:func:`_check_sizes`), is a data shape."""
    from pydantic import ValidationError

    from privcal.calibrators.base import DataShape

    try:
        DataShape.model_validate(shape)
    except ValidationError as exc:
        where, msg, _ = first_error(exc)
        raise InvalidInput(f"shape is not a data shape: {where or 'shape'}: {msg}") from None
