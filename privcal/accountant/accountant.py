"""The Accountant: budgets per dataset and per subject, atomic charging, and the release path.

Every write is one database transaction (:meth:`privcal.storage.Ledger.write`):
lock the dataset row, check every scope the cost touches with the filters of
:mod:`privcal.accountant.privacy.filters`, write the charge and its audit entry,
commit — or raise :class:`~privcal.errors.BudgetRefused` having written
nothing. See DESIGN.md, "The flow of one calibration", for :meth:`Accountant.run`.

**Decisions** where the spec is silent:

- Amounts are exact decimals limited to 12 decimal places; a cost with more
  digits (e.g. an amplified ε computed in floating point) is rounded *up* to
  12 places before it is charged — charging slightly more is always safe. Caps
  with more than 12 places are rejected.
- ``charge_subjects``: the first occurrence of a subject in a batch is charged,
  later occurrences are rejected as duplicates. A batch in which no subject can
  be charged is refused (nothing written) unless ``refuse_if_none=False``.
  Subject ids are stored only as keyed pseudonyms (:mod:`privcal.storage.pseudonyms`);
  the pseudonyms a batch charged are kept (``charge_members``) and committed in
  its audit entry, so ``audit verify`` recomputes every per-subject spend.
- **Idempotency keys bind the whole request** (issue 16 item 1, issue 14 item 5).
  The first use of a key stores ``request_digest`` = SHA-256 of the canonical JSON
  of the request: its kind (``charge``, ``calibrate``, ``subjects``), dataset,
  method, every parameter, the cost, the public shape (n, k, group sizes — never
  the data) and, for a subject batch, a *keyed* digest of the ordered subject list
  (HMAC with the ledger secret, never a plain hash of ids). The same key with the
  same request replays the original result; any difference is
  :class:`~privcal.errors.InvalidInput` naming the key. Charges made before
  migration 0005 have no digest: their key is compared on kind and cost only.
- ``run`` checks everything that needs only the parameters and the public shape
  (``calibrator.guarantee``, e.g. an infeasible plan) before the charge, and — for
  local-DP methods — again inside the charge transaction for the subjects actually
  accepted, so a refusal there rolls the subject charges back (issue 16.2). Rows left
  out (a duplicate subject, a subject past its cap) are counted by reason in the
  release's ``diagnostics["dropped_rows"]`` (counts, never ids). A shuffled run is
  refused unless the dataset has an (ε, δ) cap that is charged the amplified cost
  (:func:`privcal.accountant.amplification.check_shuffled_dataset`, issue 14.5).
- ``run`` with an idempotency key holds a per-key lock (:meth:`Ledger.key_lock`)
  from the charge to the release, so concurrent retries wait for the first and
  return its release. If the charge has no release (the first crashed; its lock
  died with it), the calibration runs again under the same charge — only one
  output is ever released for it. A local-DP batch's accepted rows are recovered
  from its stored pseudonyms.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from types import SimpleNamespace
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from privcal import checks
from privcal.accountant import privacy as acc
from privcal.calibrators.base import (
    CalibrationInput,
    Calibrator,
    CoverageGuarantee,
    DataShape,
    default_rng,
)
from privcal.calibrators.validation import group_sizes, id_strings
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import AlreadyExists, BudgetRefused, InvalidInput, NotFound
from privcal.storage import Ledger
from privcal.storage.audit import (
    canonical,
    charge_doc,
    dataset_doc,
    now,
    release_doc,
    threshold_str,
)
from privcal.storage.models import (
    SUBJECT_UNIT,
    Charge,
    ChargeMembers,
    Dataset,
    ReleaseRow,
    SubjectSpend,
)
from privcal.storage.pseudonyms import (
    PSEUDONYM_BYTES,
    hex_of,
    key_id,
    members_digest,
    pseudonyms_raw,
    subjects_digest,
)
from privcal.storage.records import ReleaseRecord, UTCDateTime

__all__ = [
    "AMOUNT_PLACES",
    "Accountant",
    "BudgetReport",
    "ChargeReceipt",
    "DatasetInfo",
    "DryRun",
    "GuaranteeReport",
    "Release",
    "SubjectChargeResult",
    "SubjectSummary",
]

#: decimal places kept for every stored amount (see the module docstring)
AMOUNT_PLACES = 12
_QUANTUM = Decimal(1).scaleb(-AMOUNT_PLACES)
DEFAULT_REPORTING_DELTA = Decimal("1e-6")
CentralCost = PureDP | ZCDP | ApproxDP
AnyCost = PureDP | ZCDP | ApproxDP | LocalDP


# ----------------------------------------------------------------- records
class DatasetInfo(BaseModel):
    """A dataset and its budget policy."""

    model_config = ConfigDict(frozen=True)

    id: int
    name: str
    description: str
    notion: str
    cap: dict[str, Decimal]
    reporting_delta: Decimal
    subject_epsilon: Decimal | None
    allow_nonprivate: bool
    created_at: UTCDateTime
    policy: str
    #: the (ε, δ) cap's Rényi orders, fixed at creation (None for pure and zCDP caps)
    renyi_orders: list[Decimal] | None = None


class ChargeReceipt(BaseModel):
    """An accepted charge (``replayed``: returned for a repeated idempotency key)."""

    model_config = ConfigDict(frozen=True)

    charge_id: int
    dataset: str
    scope: str
    cost: dict[str, Any]
    purpose: str | None
    requester: str | None
    idempotency_key: str | None
    created_at: UTCDateTime
    remaining: dict[str, Decimal]
    replayed: bool = False


class SubjectChargeResult(BaseModel):
    """A local-DP batch: who was charged (``accepted_mask``, aligned with the input ids)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    charge_id: int
    dataset: str
    eps0: Decimal
    accepted: int
    rejected: int
    rejected_over_cap: int
    rejected_duplicate: int
    accepted_mask: np.ndarray | None = Field(default=None, exclude=True)
    central: ChargeReceipt | None = None
    replayed: bool = False
    reason: str = ""


class SpentReport(BaseModel):
    """The realized spend as (ε, δ) and the rule that gave it.

    Valid only had the charges been fixed in advance; under adaptive use it is an odometer
    reading, not a guarantee (``note`` says so; the guarantee is :class:`GuaranteeReport`).
    """

    model_config = ConfigDict(frozen=True)

    epsilon: Decimal
    delta: Decimal
    rule: str
    candidates: dict[str, str]
    note: str = acc.REALIZED_NOTE


class GuaranteeReport(BaseModel):
    """The dataset's guarantee: its cap's filter, valid however requests adapt."""

    model_config = ConfigDict(frozen=True)

    epsilon: Decimal
    delta: Decimal
    rule: str
    statement: str


class BudgetReport(BaseModel):
    """Cap, spent and remaining in the dataset's notion; the cap's guarantee; and the realized
    spend as (ε, δ) at the reporting δ (``spent_dp``, not a guarantee under adaptive use)."""

    model_config = ConfigDict(frozen=True)

    dataset: str
    notion: str
    policy: str
    cap: dict[str, Decimal]
    spent: dict[str, Decimal]
    remaining: dict[str, Decimal]
    reporting_delta: Decimal
    guarantee: GuaranteeReport
    spent_dp: SpentReport
    charges: int
    releases: int
    subject_epsilon: Decimal | None
    renyi_orders: list[Decimal] | None = None

    @property
    def summary(self) -> str:
        """One line: spent and left, the cap's guarantee, and the realized spend labelled so."""

        def fmt(d: dict[str, Decimal]) -> str:
            return ", ".join(f"{k}={v}" for k, v in d.items()) or "nothing"

        return (
            f"{self.dataset}: spent {fmt(self.spent)}, remaining {fmt(self.remaining)}; "
            f"guarantee ({self.guarantee.epsilon}, {self.guarantee.delta})-DP by the cap's "
            f"filter; spent so far as (ε, δ): ε={self.spent_dp.epsilon}, "
            f"δ={self.spent_dp.delta} [{self.spent_dp.rule}] (not a guarantee under adaptive use)"
        )


class SubjectSummary(BaseModel):
    """Summary of per-subject local-DP spends of one dataset."""

    model_config = ConfigDict(frozen=True)

    dataset: str
    subject_epsilon: Decimal | None
    subjects: int
    at_cap: int
    max: Decimal
    mean: float
    quantiles: dict[str, Decimal]


class DryRun(BaseModel):
    """What a run would cost and leave, computed without writing anything."""

    model_config = ConfigDict(frozen=True)

    dataset: str
    cost: dict[str, Any] | None
    allowed: bool
    reason: str
    remaining_before: dict[str, Decimal]
    remaining_after: dict[str, Decimal] | None


class Release(ReleaseRecord):
    """A stored release, its coverage guarantee typed.

    ``model_dump_json()`` / :meth:`load` save and load it (±∞ kept), to serve a model without
    the ledger (:mod:`privcal.accountant.saved_release`).
    """

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    coverage: CoverageGuarantee  # type: ignore[assignment]

    @classmethod
    def load(cls, source: Any) -> Release:
        """A release saved by ``model_dump_json()``: the JSON itself, or a file's path."""
        from privcal.accountant.saved_release import load_release

        return load_release(cls, source)

    def predict_interval(self, preds: Any = None, *, lower_preds: Any = None,
                         upper_preds: Any = None, score_name: str | None = None,
                         alpha: float | None = None, groups: Any = None) -> np.ndarray:
        """Intervals [lower, upper] (n×2) of a regression release (``absolute``: ``preds``;
        ``cqr``: ``lower_preds`` and ``upper_preds``); (−inf, +inf) where the threshold is
        +inf. Several levels: choose ``alpha``; Mondrian groups: each row's ``groups``."""
        from privcal.calibrators.intervals import release_intervals

        return release_intervals(self, preds=preds, lower_preds=lower_preds,
                                 upper_preds=upper_preds, score_name=score_name, alpha=alpha,
                                 groups=groups)

    def evaluate_interval(self, targets: Any, preds: Any = None, *, lower_preds: Any = None,
                          upper_preds: Any = None, score_name: str | None = None,
                          alpha: float | None = None, groups: Any = None) -> Any:
        """Coverage and interval length on held-out targets (an ``IntervalEvaluation``)."""
        from privcal.calibrators.intervals import evaluate_intervals, release_lower

        iv = self.predict_interval(preds, lower_preds=lower_preds, upper_preds=upper_preds,
                                   score_name=score_name, alpha=alpha, groups=groups)
        return evaluate_intervals(iv, targets, release_lower(self, alpha=alpha))

    def predict_set(self, probs: Any, *, score_name: str | None = None,
                    rng: random.Random | None = None, alpha: float | None = None,
                    groups: Any = None) -> np.ndarray:
        """Prediction sets (boolean n×k) of this release for new class probabilities.

        A release with several levels takes the level ``alpha``; one with Mondrian groups
        from a column takes each row's group (``groups``); label groups need neither."""
        from privcal.calibrators.prediction_sets import release_sets

        return release_sets(self, probs, score_name=score_name, rng=rng, alpha=alpha,
                            groups=groups)

    def thresholds(self) -> list[dict[str, Any]]:
        """One row per group and level α: ``group``, ``n``, ``alpha``, ``threshold`` (+inf for
        a group too small for the method) and guaranteed ``lower`` bound; a release without
        groups or levels has one row."""
        from privcal.calibrators.group_sets import threshold_rows

        return threshold_rows(self)

    @property
    def classes(self) -> list[str] | None:
        """The class names, in probability-column order, when the release records them."""
        from privcal.calibrators.prediction_sets import release_classes

        return release_classes(self)

    def predict_labels(self, probs: Any, *, score_name: str | None = None,
                       rng: random.Random | None = None, alpha: float | None = None,
                       groups: Any = None) -> list[list[Any]]:
        """Prediction sets as lists of class names (of column indices when none recorded)."""
        from privcal.calibrators.prediction_sets import set_labels

        return set_labels(self.predict_set(probs, score_name=score_name, rng=rng, alpha=alpha,
                                           groups=groups), self.classes)

    def evaluate(self, probs: Any, labels: Any, *, score_name: str | None = None,
                 rng: random.Random | None = None, alpha: float | None = None,
                 groups: Any = None) -> Any:
        """Coverage, mean set size and singleton fraction on held-out data (an ``Evaluation``;
        for a Mondrian release also ``by_group``, each group against its own bound).

        ``labels`` are column indices, or class names when the release records them."""
        from privcal.calibrators.evaluation import evaluate_sets
        from privcal.calibrators.group_sets import evaluate_wrapped, is_wrapped

        sets = self.predict_set(probs, score_name=score_name, rng=rng, alpha=alpha,
                                groups=groups)
        if is_wrapped(self.method):
            return evaluate_wrapped(self, sets, labels, alpha=alpha, groups=groups,
                                    classes=self.classes)
        return evaluate_sets(sets, labels, self.coverage.lower, classes=self.classes)


#: keyword arguments of :meth:`Accountant.calibrate` that are data or options, not parameters
_CALIBRATE_OPTIONS = frozenset({
    "scores", "probs", "labels", "score", "score_options", "agents", "subjects", "classes",
    "preds", "lower_preds", "upper_preds", "targets", "score_range", "shuffled",
    "mondrian", "groups", "public_groups",
    "assume_unlinkable_features", "requester", "idempotency_key", "rng",
})


# ----------------------------------------------------------------- helpers
def _rows(data: CalibrationInput, mask: np.ndarray) -> CalibrationInput:
    """The calibration input restricted to the rows in ``mask``."""
    return dataclasses.replace(data, **{
        f: np.asarray(getattr(data, f))[mask]
        for f in ("scores", "probs", "labels", "agents", "subjects", "groups")
        if getattr(data, f) is not None
    })


def _copy_text(conn: Connection, copy_sql: str, values: list[str]) -> None:
    """COPY one text column from ``values`` (PostgreSQL) as one block of lines.

    COPY's text format gives ``\\``, tab, newline and carriage return a meaning; when no
    value holds one the block is the values joined by newlines (one C-level join instead
    of a Python call per row), else every row is escaped by psycopg's ``write_row``.
    """
    raw = conn.connection.driver_connection
    block = "\n".join(values)
    plain = (block.count("\n") == len(values) - 1
             and not any(c in block for c in ("\t", "\r", "\\")))
    with raw.cursor() as cur, cur.copy(copy_sql) as cp:
        if plain:
            cp.write(block + "\n")
        else:
            for v in values:
                cp.write_row((v,))


def _amount(
    value: object, what: str, *, allow_zero: bool = False, below_one: bool = False
) -> Decimal:
    """Parse and validate a user-supplied amount (a float is the decimal a person typed)."""
    if isinstance(value, bool):
        raise InvalidInput(f"{what} must be a number, got {value!r}")
    if isinstance(value, str) and "_" in value:  # Decimal("1_0") is 10: a typo, not a number
        raise InvalidInput(f"{what} must be a number, got {value!r}")
    try:
        d = Decimal(repr(value)) if isinstance(value, float) else Decimal(str(value).strip())
    except (InvalidOperation, ValueError) as exc:
        raise InvalidInput(f"{what} must be a number, got {value!r}") from exc
    if not d.is_finite():
        raise InvalidInput(f"{what} must be finite, got {value!r}")
    if d < 0 or (d == 0 and not allow_zero):
        raise InvalidInput(f"{what} must be {'≥' if allow_zero else '>'} 0, got {value}")
    if below_one and d >= 1:
        raise InvalidInput(f"{what} must be < 1, got {value}")
    if d >= Decimal("1e15"):
        raise InvalidInput(f"{what} is too large ({value})")
    if d != d.quantize(_QUANTUM, rounding=ROUND_CEILING):
        raise InvalidInput(f"{what} has more than {AMOUNT_PLACES} decimal places ({value})")
    return d


#: no amount at or above this is stored (a larger one is a typo, and 10¹⁵ with 12 decimal
#: places is the most a 28-digit decimal context holds exactly)
_MAX_AMOUNT = Decimal("1e15")


def _up(d: Decimal) -> Decimal:
    if not d.is_finite() or abs(d) >= _MAX_AMOUNT:
        raise InvalidInput(f"privacy amount {d} is too large (must be < {_MAX_AMOUNT:.0E})")
    return d.quantize(_QUANTUM, rounding=ROUND_CEILING).normalize()


def normalize_cost(cost: AnyCost) -> AnyCost:
    """The cost with every amount rounded *up* to 12 decimal places (what is stored)."""
    if isinstance(cost, PureDP):
        return PureDP(eps=_up(cost.eps))
    if isinstance(cost, ZCDP):
        return ZCDP(rho=_up(cost.rho))
    if isinstance(cost, ApproxDP):
        delta = _up(cost.delta)
        if delta >= 1:
            raise InvalidInput(f"δ must be < 1, got {cost.delta}")
        return ApproxDP(eps=_up(cost.eps), delta=delta)
    if isinstance(cost, LocalDP):
        return LocalDP(eps0=_up(cost.eps0))
    raise InvalidInput(f"not a privacy cost: {cost!r}")


def _cost_json(cost: AnyCost) -> dict[str, Any]:
    return {k: acc.dstr(v) if isinstance(v, Decimal) else v
            for k, v in cost.model_dump(mode="python").items()}


def _orders(ds: Dataset) -> tuple[Decimal, ...] | None:
    """The (ε, δ) cap's Rényi grid: the row's, or the frozen grid of a migrated dataset."""
    if ds.notion != "approx":
        return None
    if ds.renyi_orders is None:
        return acc.MIGRATED_RENYI_ORDERS
    return tuple(Decimal(a) for a in ds.renyi_orders)


def _policy(ds: Dataset) -> acc.Policy:
    return acc.Policy(ds.notion, ds.cap_epsilon, ds.cap_rho, ds.cap_delta,  # type: ignore[arg-type]
                      _orders(ds))


def _guarantee(ds: Dataset) -> GuaranteeReport:
    g = acc.filter_guarantee(_policy(ds), ds.reporting_delta)
    return GuaranteeReport(epsilon=Decimal(acc.dstr(g.epsilon)), delta=Decimal(acc.dstr(g.delta)),
                           rule=g.rule, statement=g.statement)


def _spent(ds: Dataset) -> acc.Spent:
    return acc.Spent(ds.spent_pure_eps, ds.spent_pure_rho, ds.spent_zcdp_rho,
                     ds.spent_approx_eps, ds.spent_approx_delta)


def _cap(ds: Dataset) -> dict[str, Decimal]:
    if ds.notion == "pure":
        return {"epsilon": ds.cap_epsilon or Decimal(0)}
    if ds.notion == "zcdp":
        return {"rho": ds.cap_rho or Decimal(0)}
    return {"epsilon": ds.cap_epsilon or Decimal(0), "delta": ds.cap_delta or Decimal(0)}


def _norm(d: dict[str, Decimal]) -> dict[str, Decimal]:
    return {k: Decimal(acc.dstr(v)) for k, v in d.items()}


def _info(ds: Dataset) -> DatasetInfo:
    return DatasetInfo(
        id=ds.id, name=ds.name, description=ds.description, notion=ds.notion, cap=_norm(_cap(ds)),
        reporting_delta=Decimal(acc.dstr(ds.reporting_delta)),
        subject_epsilon=(Decimal(acc.dstr(ds.subject_epsilon))
                         if ds.subject_epsilon is not None else None),
        allow_nonprivate=bool(ds.allow_nonprivate), created_at=ds.created_at,
        policy=_policy(ds).describe(),
        renyi_orders=[Decimal(acc.dstr(a)) for a in o] if (o := _orders(ds)) else None,
    )


def _charge_cost(c: Charge) -> AnyCost:
    if c.notion == "pure":
        return PureDP(eps=c.epsilon)
    if c.notion == "zcdp":
        return ZCDP(rho=c.rho)
    if c.notion == "approx":
        return ApproxDP(eps=c.epsilon, delta=c.delta)
    return LocalDP(eps0=c.eps0)


def _receipt(c: Charge, ds: Dataset, *, replayed: bool) -> ChargeReceipt:
    return ChargeReceipt(
        charge_id=c.id, dataset=ds.name, scope=c.scope, cost=_cost_json(_charge_cost(c)),
        purpose=c.purpose, requester=c.requester, idempotency_key=c.idempotency_key,
        created_at=c.created_at, remaining=_norm(acc.remaining(_policy(ds), _spent(ds))),
        replayed=replayed,
    )


def _spent_columns(sp: acc.Spent) -> dict[str, Decimal]:
    """The dataset columns holding the running totals ``sp``."""
    return {"spent_pure_eps": sp.pure_eps, "spent_pure_rho": sp.pure_rho,
            "spent_zcdp_rho": sp.zcdp_rho, "spent_approx_eps": sp.approx_eps,
            "spent_approx_delta": sp.approx_delta}


def _set_spent(ds: Dataset, sp: acc.Spent) -> None:
    ds.spent_pure_eps = sp.pure_eps
    ds.spent_pure_rho = sp.pure_rho
    ds.spent_zcdp_rho = sp.zcdp_rho
    ds.spent_approx_eps = sp.approx_eps
    ds.spent_approx_delta = sp.approx_delta


def json_safe(obj: Any) -> Any:
    """A value storable in a JSON column: numpy → Python, ±inf/NaN → strings, Decimal → string."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str | int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else threshold_str(obj) if not math.isnan(obj) else "NaN"
    if isinstance(obj, Decimal):
        return acc.dstr(obj)
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "model_dump"):
        return json_safe(obj.model_dump(mode="python"))
    if hasattr(obj, "tolist"):
        return json_safe(obj.tolist())
    raise InvalidInput(f"cannot store a {type(obj).__name__} in a release")


def request_digest(request: dict[str, Any]) -> str:
    """SHA-256 (hex) of the RFC 8785 canonical JSON of an idempotent request (issue 16.1)."""
    return hashlib.sha256(canonical(json_safe(request)).encode("utf-8")).hexdigest()


def _check_replay(old: Charge, key: str, digest: str | None, *, scope: str,
                  same_cost: bool) -> None:
    """InvalidInput naming ``key`` unless ``old`` was charged for this very request."""
    if old.request_digest is not None:
        same = old.request_digest == digest
    else:  # a charge from before migration 0005: only its scope and cost are known
        same = old.scope == scope and same_cost
    if not same:
        what = (f"a local-DP batch (ε0 {acc.dstr(old.eps0)})" if old.scope == "subjects"
                else f"{(old.purpose or 'a charge')!r}")
        raise InvalidInput(
            f"idempotency key {key!r} was already used for a different charge or request (charge "
            f"{old.id}: {what}); a key binds the whole request — kind, dataset, method, every "
            "parameter, the cost and the data's public shape: use a new key")


def members_of(s: Session | Connection, charge_id: int) -> np.ndarray:
    """The pseudonyms (hex) a local-DP charge charged, from ``charge_members``."""
    blob = s.scalar(select(ChargeMembers.members).where(ChargeMembers.charge_id == charge_id))
    if blob is None:
        return np.zeros(0, dtype="<U64")
    h = bytes(blob).hex()
    w = 2 * PSEUDONYM_BYTES
    return np.asarray([h[i:i + w] for i in range(0, len(h), w)], dtype="<U64")


def members_commitment(key_id: str, accepted: np.ndarray, *,
                       presorted: bool = False) -> tuple[bytes, str]:
    """(blob, members_digest) of the distinct pseudonyms a charge charged: the blob is what
    ``charge_members`` stores (sorted, 32 raw bytes each), the digest what its entry commits."""
    if accepted.dtype.kind == "S":  # raw 32-byte pseudonyms
        acc = accepted if presorted else np.sort(accepted)
        blob = np.ascontiguousarray(acc).tobytes()
    else:  # hex; lowercase hex sorts as the bytes it encodes
        acc_hex = np.asarray(accepted, dtype="<U64")
        if not presorted:
            acc_hex = np.sort(acc_hex)
        blob = bytes.fromhex("".join(acc_hex.tolist()))
    return blob, members_digest(key_id, blob)


def record_members(s: Session, key_id: str, charge: Charge, accepted: np.ndarray, *,
                   presorted: bool = False) -> None:
    """Store the (distinct) pseudonyms ``charge`` (an ORM row) charged and commit to them in
    its row. Call before the charge's audit entry is queued: ``members_digest`` is part of it.
    """
    blob, charge.members_digest = members_commitment(key_id, accepted, presorted=presorted)
    s.flush()
    s.add(ChargeMembers(charge_id=charge.id, members=blob))


def _text(value: str | None, what: str, limit: int = 200) -> str | None:
    if value is None:
        return None
    return checks.text(value, what, limit=limit, allow_empty=True)


# ----------------------------------------------------------------- the accountant
class Accountant:
    """Gatekeeper of every privacy charge and release on one :class:`~privcal.storage.Ledger`."""

    def __init__(self, ledger: Ledger | str | None = None) -> None:
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)

    # ------------------------------------------------------------ datasets
    def create_dataset(
        self,
        name: str,
        *,
        epsilon: float | str | Decimal | None = None,
        rho: float | str | Decimal | None = None,
        approx_epsilon: float | str | Decimal | None = None,
        approx_delta: float | str | Decimal | None = None,
        delta: float | str | Decimal | None = None,
        subject_epsilon: float | str | Decimal | None = None,
        allow_nonprivate: bool = False,
        description: str = "",
        renyi_orders: Sequence[float | str | Decimal] | str | None = None,
    ) -> DatasetInfo:
        """Create a dataset with exactly one cap: pure ``epsilon``, zCDP ``rho``, or
        ``approx_epsilon`` + ``approx_delta``.

        ``delta`` is the δ at which spent budgets are reported (default 1e−6, or
        ``approx_delta`` for an (ε, δ) cap); ``subject_epsilon`` caps each subject's
        local-DP spend. ``renyi_orders`` (an (ε, δ) cap only) fixes the grid of Rényi
        orders over which its zCDP charges are converted (default
        :data:`~privcal.accountant.privacy.filters.DEFAULT_RENYI_ORDERS`; see the filter in
        :mod:`privcal.accountant.privacy.filters`); it is stored and logged, and never changes.
        AlreadyExists if the name is taken.
        """
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise InvalidInput("dataset name must be 1 to 200 characters")
        checks.text(name, "dataset name")
        if not isinstance(allow_nonprivate, bool | np.bool_):  # 'no' is not False
            raise InvalidInput(f"allow_nonprivate must be True or False, got {allow_nonprivate!r}")
        if name != name.strip():
            raise InvalidInput(f"dataset name {name!r} has leading or trailing spaces")
        given = [epsilon is not None, rho is not None,
                 approx_epsilon is not None or approx_delta is not None]
        if sum(given) != 1:
            raise InvalidInput("give exactly one budget: epsilon, rho, or approx_epsilon with "
                               "approx_delta")
        cap_e = cap_r = cap_d = None
        if epsilon is not None:
            notion, cap_e = "pure", _amount(epsilon, "ε")
        elif rho is not None:
            notion, cap_r = "zcdp", _amount(rho, "ρ")
        else:
            if approx_epsilon is None or approx_delta is None:
                raise InvalidInput("an (ε, δ) budget needs both approx_epsilon and approx_delta")
            notion = "approx"
            cap_e = _amount(approx_epsilon, "ε")
            cap_d = _amount(approx_delta, "δ", below_one=True)
        if renyi_orders is not None and notion != "approx":
            raise InvalidInput("Rényi orders apply only to an (ε, δ) budget "
                               "(approx_epsilon with approx_delta)")
        grid = (None if notion != "approx" else
                [acc.dstr(a) for a in (acc.renyi_orders(renyi_orders) if renyi_orders is not None
                                       else acc.DEFAULT_RENYI_ORDERS)])
        if delta is not None:
            rep = _amount(delta, "reporting δ", below_one=True)
        else:
            rep = cap_d if cap_d is not None else DEFAULT_REPORTING_DELTA
        subj = _amount(subject_epsilon, "subject ε") if subject_epsilon is not None else None
        desc = _text(description or "", "description", 10_000) or ""

        def tx(s: Session) -> DatasetInfo:
            if s.scalars(select(Dataset.id).where(Dataset.name == name)).first() is not None:
                raise AlreadyExists(f"dataset {name!r} already exists")
            zero = Decimal(0)
            ds = Dataset(
                name=name, description=desc, notion=notion, cap_epsilon=cap_e, cap_rho=cap_r,
                cap_delta=cap_d, reporting_delta=rep, subject_epsilon=subj,
                allow_nonprivate=bool(allow_nonprivate), created_at=now(), renyi_orders=grid,
                spent_pure_eps=zero, spent_pure_rho=zero, spent_zcdp_rho=zero,
                spent_approx_eps=zero, spent_approx_delta=zero, charge_count=0,
            )
            s.add(ds)
            s.flush()
            self.ledger.append_audit(s, "dataset", dataset_doc(ds))
            return _info(ds)

        try:
            return self.ledger.write(tx)
        except IntegrityError as exc:  # a concurrent create of the same name won the race
            raise AlreadyExists(f"dataset {name!r} already exists") from exc

    def datasets(self) -> list[DatasetInfo]:
        """Every dataset, by name."""
        with self.ledger.read() as s:
            return [_info(d) for d in s.scalars(select(Dataset).order_by(Dataset.name))]

    def dataset(self, name: str) -> DatasetInfo:
        """One dataset (NotFound if it does not exist)."""
        with self.ledger.read() as s:
            return _info(self._get(s, name))

    @staticmethod
    def _get(s: Session, name: str) -> Dataset:
        checks.text(name, "dataset name")
        ds = s.scalars(select(Dataset).where(Dataset.name == name)).one_or_none()
        if ds is None:
            raise NotFound(f"unknown dataset {name!r}")
        return ds

    # ------------------------------------------------------------ charging
    def charge(
        self,
        dataset: str,
        cost: CentralCost,
        *,
        purpose: str | None = None,
        requester: str | None = None,
        idempotency_key: str | None = None,
        request: dict[str, Any] | None = None,
    ) -> ChargeReceipt:
        """Charge a central cost to ``dataset`` atomically, or raise BudgetRefused writing nothing.

        A repeated ``idempotency_key`` with the same request (cost, purpose, dataset) returns
        the original receipt (``replayed=True``) and records nothing; reusing a key for any
        other request is an error naming the key (see the module docstring). ``request`` is
        internal: :meth:`run` passes the whole calibration request the key binds.
        """
        if isinstance(cost, LocalDP):
            raise InvalidInput("a local-DP cost is charged per subject: use charge_subjects")
        if not isinstance(cost, PureDP | ZCDP | ApproxDP):
            raise InvalidInput(f"not a privacy cost: {cost!r}")
        cost = normalize_cost(cost)  # type: ignore[assignment]
        purpose = _text(purpose, "purpose", 10_000)
        requester = _text(requester, "requester")
        key = _text(idempotency_key, "idempotency key")
        digest = None
        if key is not None:
            req = request if request is not None else {"kind": "charge", "purpose": purpose}
            digest = request_digest({**req, "dataset": dataset, "cost": _cost_json(cost)})

        def tx(conn: Connection) -> ChargeReceipt:
            ds = self.ledger.dataset_row(conn, dataset)
            if key is not None:
                old = self.ledger.charge_by_key(conn, ds.id, key)
                if old is not None:
                    _check_replay(old, key, digest, scope="dataset",
                                  same_cost=_cost_json(_charge_cost(old)) == _cost_json(cost))
                    return _receipt(old, ds, replayed=True)
            return self._charge_central_core(conn, ds, cost, purpose, requester, key, digest)

        return self.ledger.write_core(tx)

    def _charge_central_core(self, conn: Connection, ds: Any, cost: CentralCost,
                             purpose: str | None, requester: str | None,
                             key: str | None, digest: str | None = None) -> ChargeReceipt:
        """:meth:`_charge_central` on a Core connection (``ds``: the locked dataset row).

        Hot path: the budget check and the audit document are built in Python between the
        dataset lock and the audit append; one INSERT (with the totals UPDATE) writes it.
        """
        pol = _policy(ds)
        after = acc.check_charge(pol, _spent(ds), cost, scope=f"dataset {ds.name!r}")
        values: dict[str, Any] = {
            "dataset_id": ds.id, "scope": "dataset", "notion": cost.kind,
            "epsilon": getattr(cost, "eps", None), "delta": getattr(cost, "delta", None),
            "rho": getattr(cost, "rho", None), "eps0": None, "subjects_accepted": None,
            "subjects_rejected": None, "purpose": purpose, "requester": requester,
            "idempotency_key": key, "created_at": now(),
            "request_digest": digest if key is not None else None, "members_digest": None,
        }
        cid = self.ledger.insert_charge(conn, values, _spent_columns(after))
        c = SimpleNamespace(id=cid, **values)
        self.ledger.append_audit(conn, "charge", charge_doc(c, ds.name))  # type: ignore[arg-type]
        return ChargeReceipt(
            charge_id=cid, dataset=ds.name, scope="dataset", cost=_cost_json(cost),
            purpose=purpose, requester=requester, idempotency_key=key,
            created_at=values["created_at"], remaining=_norm(acc.remaining(pol, after)),
            replayed=False,
        )

    @staticmethod
    def _by_key(s: Session, ds: Dataset, key: str) -> Charge | None:
        return s.scalars(select(Charge).where(Charge.dataset_id == ds.id,
                                              Charge.idempotency_key == key)).first()

    def _charge_central(self, s: Session, ds: Dataset, cost: CentralCost, purpose: str | None,
                        requester: str | None, key: str | None,
                        digest: str | None = None) -> Charge:
        after = acc.check_charge(_policy(ds), _spent(ds), cost, scope=f"dataset {ds.name!r}")
        c = Charge(
            dataset_id=ds.id, scope="dataset", notion=cost.kind,
            epsilon=getattr(cost, "eps", None), delta=getattr(cost, "delta", None),
            rho=getattr(cost, "rho", None), purpose=purpose, requester=requester,
            idempotency_key=key, created_at=now(), request_digest=digest if key else None,
        )
        s.add(c)
        _set_spent(ds, after)
        ds.charge_count += 1
        s.flush()
        self.ledger.append_audit(s, "charge", charge_doc(c, ds.name))
        return c

    def charge_subjects(
        self,
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
        """Charge ε0 (local DP) to each listed subject against the dataset's per-subject cap.

        Subjects whose cap would be exceeded, and repeated ids within the batch, are not
        charged: ``accepted_mask`` says who was. ``central_cost`` (e.g. the amplified
        (ε, δ) of a shuffled protocol) is charged to the dataset in the same transaction; it
        may be a function of ``accepted_mask``, evaluated once the accepted subjects are known.
        One audit entry records the counts, ε0 and a digest of the charged pseudonyms, never
        the ids. Bulk: one temporary table and two set-based statements, so 10⁶ subjects take
        seconds. An ``idempotency_key`` binds ε0, the purpose, the central cost and a keyed
        digest of the ordered subject list (module docstring); a replay returns the recorded
        counts and, recovered from the stored pseudonyms, ``accepted_mask``.
        """
        cost0 = eps0 if isinstance(eps0, LocalDP) else LocalDP(eps0=_amount(eps0, "ε0"))
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
        sids = id_strings(subject_ids, "subject ids")  # one normalisation everywhere (14.4)
        if sids.size == 0:
            raise InvalidInput("subject_ids must be a non-empty 1-D sequence")
        uniq, first, inverse = np.unique(sids, return_index=True, return_inverse=True)
        is_first = np.zeros(sids.shape[0], dtype=bool)
        is_first[first] = True
        n_dup = int(sids.shape[0] - uniq.shape[0])
        purpose = _text(purpose, "purpose", 10_000)
        requester = _text(requester, "requester")
        key = _text(idempotency_key, "idempotency key")
        e_units = int(cost0.eps0 / SUBJECT_UNIT)
        skey = self.ledger.subject_key()
        kid = key_id(skey)
        # what the ledger stores, never the ids; staged in pseudonym order, so that the
        # primary-key B-tree is filled in key order (random order is ~4× slower on SQLite)
        raw = pseudonyms_raw(skey, uniq.tolist())
        by_key = np.argsort(raw)
        raw_sorted = raw[by_key]
        pseud, pseud_sorted = hex_of(raw), hex_of(raw_sorted)
        digest = None
        if key is not None:
            req = request if request is not None else {
                "kind": "subjects", "purpose": purpose,
                "central_cost": ("computed from the accepted subjects" if callable(central_cost)
                                 else _cost_json(central_of(np.ones(0, dtype=bool)))
                                 if central_cost is not None else None)}
            digest = request_digest({**req, "dataset": dataset, "eps0": acc.dstr(cost0.eps0),
                                     "subjects": subjects_digest(skey, sids.tolist())})

        def tx(conn: Connection) -> SubjectChargeResult:
            ds = self.ledger.dataset_row(conn, dataset)
            if key is not None:
                old = self.ledger.charge_by_key(conn, ds.id, key)
                if old is not None:
                    _check_replay(old, key, digest, scope="subjects",
                                  same_cost=old.eps0 == cost0.eps0)
                    central_old = self.ledger.charge_by_key(conn, ds.id, f"{key}#central")
                    mask = None
                    if old.members_digest is not None:  # recover who was charged
                        mask = is_first & np.isin(pseud, members_of(conn, old.id))[inverse]
                    return SubjectChargeResult(
                        charge_id=old.id, dataset=ds.name, eps0=cost0.eps0,
                        accepted=old.subjects_accepted or 0, rejected=old.subjects_rejected or 0,
                        rejected_over_cap=(old.subjects_rejected or 0) - n_dup,
                        rejected_duplicate=n_dup, accepted_mask=mask,
                        central=_receipt(central_old, ds, replayed=True) if central_old else None,
                        replayed=True, reason="replayed",
                    )
            if ds.subject_epsilon is None:
                raise BudgetRefused(
                    f"budget refused on dataset {ds.name!r}: it has no per-subject ε cap for "
                    "local-DP charges (create it with --subject-epsilon)",
                    scope=f"dataset {ds.name!r} subjects", asked=cost0.describe(), remaining="",
                )
            cap_units = int(ds.subject_epsilon / SUBJECT_UNIT)
            if e_units > cap_units:
                over_u = np.ones(uniq.shape[0], dtype=bool)
            else:
                over = self._bulk_subjects(conn, ds.id, pseud_sorted, e_units, cap_units)
                over_u = np.isin(pseud, np.asarray(over, dtype="<U64"))
            n_over = int(over_u.sum())
            accepted_mask = is_first & ~over_u[inverse]
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
                central = self._charge_central_core(
                    conn, ds, cc, purpose, requester, f"{key}#central" if key is not None else None,
                    digest,
                )
            blob, mdigest = members_commitment(kid, raw_sorted[~over_u[by_key]], presorted=True)
            values: dict[str, Any] = {
                "dataset_id": ds.id, "scope": "subjects", "notion": "local", "epsilon": None,
                "delta": None, "rho": None, "eps0": cost0.eps0, "subjects_accepted": n_acc,
                "subjects_rejected": n_rej, "purpose": purpose, "requester": requester,
                "idempotency_key": key, "created_at": now(), "request_digest": digest,
                "members_digest": mdigest,
            }
            c = SimpleNamespace(id=self.ledger.insert_charge(conn, values), **values)
            self.ledger.insert_members(conn, c.id, blob)
            self.ledger.append_audit(conn, "charge", charge_doc(c, ds.name))  # type: ignore[arg-type]
            reason = (f"{n_over} subject(s) over the per-subject cap "
                      f"{acc.dstr(ds.subject_epsilon)}, {n_dup} duplicate(s) in the batch")
            return SubjectChargeResult(
                charge_id=c.id, dataset=ds.name, eps0=cost0.eps0, accepted=n_acc,
                rejected=n_rej, rejected_over_cap=n_over, rejected_duplicate=n_dup,
                accepted_mask=accepted_mask,
                central=central,
                reason=reason,
            )

        return self.ledger.write_core(tx)

    def _bulk_subjects(self, s: Session | Connection, dataset_id: int, uniq: np.ndarray,
                       e_units: int, cap_units: int) -> list[str]:
        """Charge ``e_units`` to each (distinct) subject that has room; return those that had not.

        ``uniq`` holds *pseudonyms* (:meth:`privcal.storage.Ledger.pseudonyms`), already
        distinct, so the staging table needs no index: the join probes
        subject_spend's primary key.
        """
        conn = s.connection() if isinstance(s, Session) else s
        pg = self.ledger.backend == "postgresql"
        if pg:
            conn.exec_driver_sql(
                "CREATE TEMP TABLE privcal_batch (sid text) ON COMMIT DROP")
            _copy_text(conn, "COPY privcal_batch (sid) FROM STDIN", uniq.tolist())
        else:
            conn.exec_driver_sql(
                "CREATE TEMP TABLE IF NOT EXISTS privcal_batch (sid TEXT)")
            conn.exec_driver_sql("DELETE FROM privcal_batch")
            # one JSON array parsed in C by json_each is ~4× faster than executemany
            conn.exec_driver_sql("INSERT INTO privcal_batch (sid) SELECT value FROM json_each(?)",
                                 (json.dumps(uniq.tolist()),))
        params = {"d": dataset_id, "e": e_units, "cap": cap_units}
        over = [r[0] for r in conn.execute(text(
            "SELECT b.sid FROM privcal_batch b JOIN subject_spend s "
            "ON s.dataset_id = :d AND s.subject = b.sid WHERE s.spent_units > :cap - :e"
        ), params)]
        if pg:
            conn.exec_driver_sql("ANALYZE privcal_batch")
            # UPDATE … FROM then INSERT … NOT EXISTS: set-based, and on PostgreSQL ~3× faster
            # than INSERT … ON CONFLICT, which pays a speculative insertion per row
            conn.execute(text(
                "UPDATE subject_spend s SET spent_units = s.spent_units + :e FROM privcal_batch b "
                "WHERE s.dataset_id = :d AND s.subject = b.sid AND s.spent_units <= :cap - :e"
            ), params)
            conn.execute(text(
                "INSERT INTO subject_spend (dataset_id, subject, spent_units) "
                "SELECT :d, b.sid, :e FROM privcal_batch b WHERE NOT EXISTS (SELECT 1 FROM "
                "subject_spend s WHERE s.dataset_id = :d AND s.subject = b.sid)"
            ), params)
        else:
            # the DO UPDATE … WHERE skips exactly the rows selected above (same locked transaction)
            conn.execute(text(
                "INSERT INTO subject_spend (dataset_id, subject, spent_units) "
                "SELECT :d, sid, :e FROM privcal_batch WHERE true "
                "ON CONFLICT (dataset_id, subject) DO UPDATE "
                "SET spent_units = subject_spend.spent_units + excluded.spent_units "
                "WHERE subject_spend.spent_units + excluded.spent_units <= :cap"
            ), params)
        if not pg:
            conn.exec_driver_sql("DELETE FROM privcal_batch")
        return over

    # ------------------------------------------------------------ reports
    def budget(self, name: str) -> BudgetReport:
        """Cap, spent, remaining (dataset's notion), the cap's guarantee (valid however the
        requests adapt) and the realized spend as (ε, δ) (labelled: not a guarantee)."""
        with self.ledger.read() as s:
            ds = self._get(s, name)
            n_rel = s.scalar(select(func.count()).select_from(ReleaseRow)
                             .where(ReleaseRow.dataset_id == ds.id)) or 0
            pol, sp = _policy(ds), _spent(ds)
            se = acc.spent_epsilon(pol, sp, ds.reporting_delta)
            return BudgetReport(
                dataset=ds.name, notion=ds.notion, policy=pol.describe(), cap=_norm(_cap(ds)),
                spent=_norm(acc.used(pol, sp)), remaining=_norm(acc.remaining(pol, sp)),
                reporting_delta=Decimal(acc.dstr(ds.reporting_delta)),
                guarantee=_guarantee(ds),
                spent_dp=SpentReport(epsilon=Decimal(acc.dstr(se.epsilon)),
                                     delta=Decimal(acc.dstr(se.delta)),
                                     rule=se.rule, candidates=se.candidates, note=se.note),
                renyi_orders=[Decimal(acc.dstr(a)) for a in o] if (o := _orders(ds)) else None,
                charges=ds.charge_count, releases=int(n_rel),
                subject_epsilon=(Decimal(acc.dstr(ds.subject_epsilon))
                                 if ds.subject_epsilon is not None else None),
            )

    def subject_spend(self, name: str, subject_id: Any) -> Decimal:
        """ε0 spent so far by one subject of ``name`` (0 if never charged); looked up by its
        pseudonym."""
        sid = str(id_strings([subject_id], "subject id")[0])  # the one id normalisation
        with self.ledger.read() as s:
            ds = self._get(s, name)
            units = s.scalar(select(SubjectSpend.spent_units).where(
                SubjectSpend.dataset_id == ds.id,
                SubjectSpend.subject == self.ledger.pseudonyms([sid])[0]))
            return Decimal(acc.dstr(Decimal(int(units or 0)) * SUBJECT_UNIT))

    def subject_summary(self, name: str) -> SubjectSummary:
        """Count, maximum, mean and quantiles of per-subject spends, and how many are at the cap."""
        with self.ledger.read() as s:
            ds = self._get(s, name)
            units = np.fromiter(
                s.scalars(select(SubjectSpend.spent_units).where(SubjectSpend.dataset_id == ds.id)),
                dtype=np.int64,
            )
            cap = ds.subject_epsilon
        def eps(u: float | int) -> Decimal:
            return Decimal(acc.dstr(Decimal(int(u)) * SUBJECT_UNIT))
        if units.size == 0:
            return SubjectSummary(dataset=name, subject_epsilon=cap, subjects=0, at_cap=0,
                                  max=Decimal(0), mean=0.0, quantiles={})
        cap_units = int(cap / SUBJECT_UNIT) if cap is not None else None
        qs = {f"{q:g}": eps(np.quantile(units, q, method="higher")) for q in (0.5, 0.9, 0.99)}
        return SubjectSummary(
            dataset=name, subject_epsilon=Decimal(acc.dstr(cap)) if cap is not None else None,
            subjects=int(units.size),
            at_cap=int((units >= cap_units).sum()) if cap_units is not None else 0,
            max=eps(units.max()), mean=float(units.mean()) * float(SUBJECT_UNIT), quantiles=qs,
        )

    # ------------------------------------------------------------ releases
    def releases(self, dataset: str | None = None) -> list[Release]:
        """Every release (optionally of one dataset), coverage typed."""
        return [Release.model_validate(r.model_dump()) for r in self.ledger.releases(dataset)]

    def release(self, release_id: int) -> Release:
        """One release by id."""
        return Release.model_validate(self.ledger.release(release_id).model_dump())

    def record_release(
        self,
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
        distribution_version: str = "",
        requester: str | None = None,
        charge_ids: Sequence[int] = (),
    ) -> Release:
        """Append a release tied to charges already made (by ``run`` or a collection session).

        The charges must belong to ``dataset``; the first is the release's ``charge_id``
        and may carry only one release.
        """
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise InvalidInput(f"threshold must be a number, got {threshold!r}")
        thr = threshold_str(float(threshold)) if not math.isnan(threshold) else None
        if thr is None:
            raise InvalidInput("threshold is NaN")
        cov = coverage if isinstance(coverage, CoverageGuarantee) else \
            CoverageGuarantee.model_validate(coverage)
        if isinstance(charge_ids, str | bytes):
            raise InvalidInput("charge_ids must be a sequence of charge ids")
        ids = [checks.row_id(i, "charge") for i in charge_ids]
        row_data = {
            "method": str(method), "calibrator_version": str(calibrator_version),
            "distribution": str(distribution), "distribution_version": str(distribution_version),
            "params": json_safe(params), "shape": json_safe(shape), "threshold": thr,
            "coverage": json_safe(cov), "privacy": json_safe(privacy),
            "diagnostics": json_safe(diagnostics or {}), "requester": _text(requester, "requester"),
        }

        def tx(s: Session) -> Release:
            ds = self.ledger.lock_dataset(s, dataset)
            for cid in ids:
                c = s.get(Charge, cid)
                if c is None or c.dataset_id != ds.id:
                    raise InvalidInput(f"charge {cid} is not a charge of dataset {dataset!r}")
            if ids and s.scalars(select(ReleaseRow.id)
                                 .where(ReleaseRow.charge_id == ids[0])).first() is not None:
                raise InvalidInput(f"charge {ids[0]} already has a release")
            row = ReleaseRow(dataset_id=ds.id, created_at=now(),
                             charge_id=ids[0] if ids else None, charge_ids=ids, **row_data)
            s.add(row)
            s.flush()
            self.ledger.append_audit(s, "release", release_doc(row, ds.name))
            return Release.model_validate(
                self.ledger._release_record(row, ds.name).model_dump())

        return self.ledger.write(tx)

    def _release_for_charge(self, charge_id: int) -> Release | None:
        with self.ledger.read() as s:
            rid = s.scalars(select(ReleaseRow.id).where(ReleaseRow.charge_id == charge_id)).first()
        return self.release(rid) if rid is not None else None

    @staticmethod
    def _shape(data: CalibrationInput, n: int | None = None, k: int | None = None) -> DataShape:
        if data.probs is not None and np.ndim(data.probs) == 2:
            k = int(np.shape(data.probs)[1])
        groups = group_sizes(data.agents) if data.agents is not None else None
        if data.groups is not None:  # Mondrian groups (ints in [0, group_count)), in order
            groups = tuple(int(c) for c in np.bincount(np.asarray(data.groups, dtype=np.int64),
                                                      minlength=data.group_count or 0))
        try:
            return DataShape(n=data.n if n is None else n, k=k, group_sizes=groups)
        except (ValidationError, ValueError) as exc:
            raise InvalidInput(f"unusable calibration data: {exc}") from exc

    @staticmethod
    def _params(calibrator: Calibrator, params: Any) -> Any:
        if isinstance(params, calibrator.Params):
            return params
        if isinstance(params, dict):
            try:
                return calibrator.Params.model_validate(params)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(x) for x in first.get("loc", ()))
                raise InvalidInput(f"invalid {calibrator.name} parameter {where}: "
                                   f"{first.get('msg')}") from exc
        raise InvalidInput(f"params must be a {calibrator.Params.__name__} or a dict")

    @staticmethod
    def _check_data(calibrator: Calibrator, data: CalibrationInput) -> None:
        """Generic checks before anything is charged (calibrators check the rest themselves)."""
        for field in calibrator.inputs:
            arr = getattr(data, field, None)
            if arr is None:
                raise InvalidInput(f"{calibrator.name} needs {field!r} data")
            arr = np.asarray(arr)
            if arr.shape[0] == 0:
                raise InvalidInput(f"{field} is empty")
            if arr.dtype.kind == "f" and np.isnan(arr).any():
                raise InvalidInput(f"{field} contains NaN")
        lengths = {f: int(np.asarray(getattr(data, f)).shape[0])
                   for f in ("scores", "probs", "labels", "agents", "subjects")
                   if getattr(data, f) is not None}
        if len(set(lengths.values())) > 1:
            raise InvalidInput(f"calibration arrays differ in length: {lengths}")

    def _privacy(self, cost: AnyCost | None, ds: DatasetInfo, extra: dict[str, Any] | None,
                 calibrator: Any = None) -> dict[str, Any]:
        """The privacy record of a release; a non-private calibrator may say what it reveals
        (its ``privacy_statement``, e.g. FedCP-QQ's one order statistic per agent)."""
        out: dict[str, Any] = {"cost": _cost_json(cost) if cost is not None else None}
        rd = ds.reporting_delta
        if cost is None:
            what = getattr(calibrator, "privacy_statement", None) or "non-private release"
            out.update(model="none",
                       statement=f"{what} (allowed by the dataset policy)")
        elif isinstance(cost, PureDP):
            e = acc.dstr(cost.eps)
            out.update(model="central", epsilon=e, delta="0", rule="pure ε-DP",
                       statement=f"{e}-DP (pure, central)")
        elif isinstance(cost, ZCDP):
            e = acc.dstr(acc.round_up(acc.cks20_epsilon(float(cost.rho), float(rd))))
            out.update(model="central", epsilon=e, delta=acc.dstr(rd),
                       rule="CKS20 conversion of ρ at the dataset's reporting δ",
                       statement=f"{acc.dstr(cost.rho)}-zCDP (central), hence "
                                 f"({e}, {acc.dstr(rd)})-DP by CKS20")
        elif isinstance(cost, ApproxDP):
            e, d = acc.dstr(cost.eps), acc.dstr(cost.delta)
            out.update(model="central", epsilon=e, delta=d, rule="(ε, δ)-DP as charged",
                       statement=f"({e}, {d})-DP (central)")
        else:
            e = acc.dstr(cost.eps0)
            out.update(model="local", epsilon=e, delta="0",
                       rule="ε0-local DP for each participating subject",
                       statement=f"{e}-local DP for each participating subject")
        # the neighbouring relation the claim is about (issue 14.7): the calibrator's own
        # statement, else the one its cost type implies
        if cost is not None:
            out["neighbouring"] = getattr(calibrator, "neighbouring", None) or (
                "any two inputs of one subject (local DP)" if isinstance(cost, LocalDP)
                else "substitution of one record; n is public")
        if extra:
            out["extra"] = json_safe(extra)
            amp = extra.get("amplification") if extra.get("shuffled") else None
            if amp is not None:
                if amp.get("amplified"):
                    out["statement"] += (
                        f"; shuffled: ({amp['eps']}, {amp['delta']})-DP for the aggregator "
                        f"{extra.get('scope', '')} by the {amp['bound']} bound (the paper's "
                        f"ε0/√n = {amp['heuristic_eps0_over_sqrt_n']:.4g} is a heuristic, "
                        "not a guarantee)")
                else:
                    out["statement"] += ("; shuffled, but no amplification bound applies at "
                                         "this n and δ: the central guarantee stays ε0")
        return out

    def run(
        self,
        calibrator: Calibrator,
        params: Any,
        data: CalibrationInput,
        *,
        dataset: str,
        requester: str | None = None,
        idempotency_key: str | None = None,
        rng: random.Random | None = None,
        registered: Any = None,
        privacy_extra: dict[str, Any] | None = None,
        central_cost: CentralCost | None = None,
        extra_diagnostics: dict[str, Any] | None = None,
        shuffle: Callable[[DataShape], tuple[ApproxDP | None, dict[str, Any]]] | None = None,
        classes: int | None = None,
    ) -> Release:
        """Charge, calibrate, release (DESIGN.md, "The flow of one calibration").

        1. validate ``params`` and the data's basic shape; 2. ``cost(params, shape)``;
        3. charge it and COMMIT (non-private: only if the dataset allows it; local DP: per
        subject, rows of refused subjects are dropped and n becomes the accepted count);
        4. ``calibrate``; 5. append the release and its audit entry and commit. A crash
        between 3 and 5 leaves a charge without a release, never the reverse.
        ``registered`` (a :class:`privcal.calibrators.registry.Registered`) supplies the
        distribution name and version recorded with the release. ``central_cost`` (local-DP
        methods only, e.g. the amplified (ε, δ) of a shuffled run) is charged to the dataset
        in the same transaction as the subjects; ``extra_diagnostics`` are public facts
        (e.g. the score name) stored with the calibrator's diagnostics. ``shuffle`` (local DP,
        reports sent through a shuffler) maps the shape of the rows actually accepted to the
        amplified (ε, δ) and its record: it is evaluated inside the charge transaction, once
        refused subjects are known, because fewer shuffled reports amplify less. ``classes``
        is the number of classes k of the probabilities that precomputed scores came from:
        it is recorded in the release's shape, and ``predict_set`` refuses another k.

        With an ``idempotency_key`` the key binds the whole request (method, params, cost,
        public shape, subjects) and the run holds the key's lock (:meth:`Ledger.key_lock`)
        from charge to release: a concurrent retry waits and returns the one release.
        """
        if idempotency_key is None:
            return self._run(calibrator, params, data, dataset=dataset, requester=requester,
                             idempotency_key=None, rng=rng, registered=registered,
                             privacy_extra=privacy_extra, central_cost=central_cost,
                             extra_diagnostics=extra_diagnostics, shuffle=shuffle,
                             classes=classes)
        key = _text(idempotency_key, "idempotency key")
        assert key is not None
        with self.ledger.key_lock(dataset, key):
            return self._run(calibrator, params, data, dataset=dataset, requester=requester,
                             idempotency_key=key, rng=rng, registered=registered,
                             privacy_extra=privacy_extra, central_cost=central_cost,
                             extra_diagnostics=extra_diagnostics, shuffle=shuffle,
                             classes=classes)

    def _run(
        self,
        calibrator: Calibrator,
        params: Any,
        data: CalibrationInput,
        *,
        dataset: str,
        requester: str | None,
        idempotency_key: str | None,
        rng: random.Random | None,
        registered: Any,
        privacy_extra: dict[str, Any] | None,
        central_cost: CentralCost | None,
        extra_diagnostics: dict[str, Any] | None,
        shuffle: Callable[[DataShape], tuple[ApproxDP | None, dict[str, Any]]] | None,
        classes: int | None,
    ) -> Release:
        if not isinstance(calibrator, Calibrator):
            raise InvalidInput(f"not a calibrator: {calibrator!r:.60}")
        if not isinstance(data, CalibrationInput):
            raise InvalidInput("data must be a CalibrationInput")
        p = self._params(calibrator, params)
        self._check_data(calibrator, data)
        if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int)
                                    or classes < 2):
            raise InvalidInput(f"classes must be an integer ≥ 2, got {classes!r}")
        shape = self._shape(data, k=classes)
        cost = calibrator.cost(p, shape)
        request = {"kind": "calibrate", "method": calibrator.name,
                   "params": p.model_dump(mode="python"), "shape": shape.model_dump(mode="python"),
                   "shuffled": shuffle is not None or central_cost is not None}
        if (central_cost is not None or shuffle is not None) and not isinstance(cost, LocalDP):
            raise InvalidInput("central_cost applies only to local-DP methods (e.g. a shuffled "
                               "run); a central method's cost is charged as declared")
        ds = self.dataset(dataset)
        if shuffle is not None:
            from privcal.accountant.amplification import check_shuffled_dataset

            check_shuffled_dataset(ds)  # what is recorded must be what is charged (14.5)
        # every check that needs only the parameters and the public shape runs before the
        # charge (issue 16.2); the local-DP branch repeats it for the rows actually accepted
        calibrator.guarantee(p, shape)
        rng = rng if rng is not None else default_rng()
        charge_ids: list[int] = []
        shuffled: dict[str, Any] = {}
        central_receipt: ChargeReceipt | None = None
        dropped: dict[str, int] | None = None
        purpose = f"release: {calibrator.name}"
        if cost is None:
            if not ds.allow_nonprivate:
                raise BudgetRefused(
                    f"non-private release refused: {calibrator.name} is not differentially "
                    f"private and dataset {dataset!r} does not allow non-private releases "
                    "(create it with --allow-nonprivate)",
                    scope=f"dataset {dataset!r}", asked="non-private", remaining="",
                )
        elif isinstance(cost, LocalDP):
            if data.subjects is None:
                raise InvalidInput(
                    f"{calibrator.name} is local DP: give the subject id of each row")
            # a federated agent holds many rows but is one subject, charged once
            per_agent = calibrator.privacy_model == "federated"
            sids = id_strings(data.subjects, "subject ids")
            charged, row_of = (np.unique(sids, return_inverse=True) if per_agent
                               else (sids, None))

            def central(accepted: np.ndarray) -> CentralCost | None:
                # runs inside the charge transaction, once refused subjects are known: a
                # request infeasible for the accepted rows (e.g. ldp-score with most subjects
                # at their cap) raises here and rolls every subject charge back (16.2)
                row_mask = accepted[row_of].reshape(-1) if row_of is not None else accepted
                kept = shape
                if not row_mask.all():  # the full shape was checked before the charge
                    kept = self._shape(_rows(data, row_mask), k=classes)
                    calibrator.guarantee(p, kept)
                if shuffle is None:
                    return central_cost
                amplified, record = shuffle(kept)
                shuffled.clear()
                shuffled.update(record)
                return amplified

            res = self.charge_subjects(dataset, cost, charged, central_cost=central,
                                       purpose=purpose, requester=requester,
                                       idempotency_key=idempotency_key, request=request)
            if res.replayed:
                done = self._release_for_charge(res.charge_id)
                if done is not None:
                    return done
                if res.accepted_mask is None:
                    raise InvalidInput(
                        f"idempotency key {idempotency_key!r}: the local-DP batch was charged "
                        "before privcal recorded who it charged, and was not released; its "
                        "accepted rows are unknown")
                if shuffle is not None:  # the record of the crashed run, for the same rows
                    m = res.accepted_mask
                    shuffled.update(shuffle(self._shape(_rows(
                        data, m[row_of] if row_of is not None else m)))[1])
            charge_ids.append(res.charge_id)
            if res.central is not None:
                charge_ids.append(res.central.charge_id)
                central_receipt = res.central
            mask = res.accepted_mask
            assert mask is not None
            if row_of is not None:
                mask = mask[row_of].reshape(-1)
                dropped = {"duplicate_subject": 0, "subject_over_cap": int((~mask).sum())}
            else:
                dropped = {"duplicate_subject": res.rejected_duplicate,
                           "subject_over_cap": res.rejected - res.rejected_duplicate}
            if not mask.all():
                data = _rows(data, mask)
                shape = self._shape(data, k=classes)
        else:
            receipt = self.charge(dataset, cost, purpose=purpose, requester=requester,
                                  idempotency_key=idempotency_key, request=request)
            if receipt.replayed:
                done = self._release_for_charge(receipt.charge_id)
                if done is not None:
                    return done
            charge_ids.append(receipt.charge_id)
        # ---- the charge is committed; from here on the data is touched
        result = calibrator.calibrate(data, p, rng)
        guarantee = calibrator.guarantee(p, shape)
        privacy = self._privacy(cost, ds, {**(privacy_extra or {}), **shuffled} or None,
                                calibrator)
        if central_receipt is not None:
            privacy["central_cost"] = central_receipt.cost
        return self.record_release(
            dataset, method=calibrator.name, calibrator_version=calibrator.version,
            threshold=float(result.threshold), params=p.model_dump(mode="python"),
            shape=shape.model_dump(mode="python"), coverage=guarantee,
            privacy=privacy, diagnostics={
                **result.diagnostics, **(extra_diagnostics or {}),
                # rows left out of the calibration, by reason: counts only, never ids (14.4)
                **({"dropped_rows": dropped} if dropped is not None else {}),
            },
            distribution=getattr(registered, "distribution", "privcal"),
            distribution_version=getattr(registered, "distribution_version", ""),
            requester=requester, charge_ids=charge_ids,
        )

    def calibrate(self, method: str | Calibrator, params: dict[str, Any] | None = None, /, *,
                  dataset: str, **kwargs: Any) -> Release:
        """Calibrate by method name with arrays, e.g.
        ``acct.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=0.1)``.

        Regression: ``acct.calibrate("pcoqs", dataset="d", preds=f, targets=y,
        score="absolute", score_range=(0, 5), alpha=0.1, rho=0.1)`` (``cqr``: ``lower_preds``
        and ``upper_preds``); the release's :meth:`Release.predict_interval` gives intervals.

        Data and options (``scores``, ``probs``, ``labels``, ``preds``, ``targets``,
        ``score``, ``score_range``, ``subjects``,
        ``shuffled``, ``requester``, ``idempotency_key``, ``rng``, …) are passed on; every
        other keyword is a calibrator parameter. Validation and data preparation are
        :func:`privcal.accountant.calibration.calibrate`; the charge and release are :meth:`run`.
        """
        from privcal.accountant.calibration import calibrate as _calibrate

        if params is not None and not isinstance(params, dict):
            raise InvalidInput(f"params must be a dict, got {type(params).__name__}")
        opts = {k: kwargs.pop(k) for k in list(kwargs) if k in _CALIBRATE_OPTIONS}
        return _calibrate(self, method, {**(params or {}), **kwargs}, dataset=dataset, **opts)

    def verify(self, expect_head: str | None = None, *, signed_head: Any = None,
               trusted_key: Any = None, allow_unsigned_tail: bool = False) -> Any:
        """Verify the audit log and recompute every release's guarantees with the installed code.

        Returns an :class:`~privcal.accountant.verification.AuditReport`; raises
        :class:`~privcal.errors.AuditFailed` naming the first entry or release that does not
        verify. ``signed_head`` + ``trusted_key``: see :meth:`privcal.storage.Ledger.verify`
        and :mod:`privcal.storage.signing`.
        """
        from privcal.accountant.verification import verify

        return verify(self, expect_head=expect_head, signed_head=signed_head,
                      trusted_key=trusted_key, allow_unsigned_tail=allow_unsigned_tail)

    def dry_run(self, calibrator: Calibrator, params: Any, shape: DataShape,
                dataset: str) -> DryRun:
        """The cost of a run and what would remain after it; writes nothing."""
        p = self._params(calibrator, params)
        cost = calibrator.cost(p, shape)
        with self.ledger.read() as s:
            ds = self._get(s, dataset)
            pol, sp = _policy(ds), _spent(ds)
            before = _norm(acc.remaining(pol, sp))
            if cost is None:
                ok = bool(ds.allow_nonprivate)
                return DryRun(dataset=dataset, cost=None, allowed=ok,
                              reason="non-private; " + ("allowed" if ok else
                                                        "the dataset does not allow it"),
                              remaining_before=before, remaining_after=before if ok else None)
            cost = normalize_cost(cost)
            if isinstance(cost, LocalDP):
                ok = ds.subject_epsilon is not None and cost.eps0 <= ds.subject_epsilon
                return DryRun(dataset=dataset, cost=_cost_json(cost), allowed=ok,
                              reason=("charged per subject against the per-subject cap"
                                      if ok else "ε0 exceeds the per-subject cap (or none set)"),
                              remaining_before=before, remaining_after=before)
            try:
                after = acc.check_charge(pol, sp, cost, scope=f"dataset {dataset!r}")
            except BudgetRefused as exc:
                return DryRun(dataset=dataset, cost=_cost_json(cost), allowed=False,
                              reason=str(exc), remaining_before=before, remaining_after=None)
            return DryRun(dataset=dataset, cost=_cost_json(cost), allowed=True, reason="fits",
                          remaining_before=before,
                          remaining_after=_norm(acc.remaining(pol, after)))
