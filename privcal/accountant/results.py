"""What the accountant returns: datasets, charge receipts, budget reports, dry runs, releases.

Frozen pydantic models, independent of any database session; amounts are exact decimals.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, computed_field

from privcal.accountant import privacy as acc
from privcal.accountant.privacy.guarantees import NOT_ESTABLISHED_SHORT, short_guarantee
from privcal.calibrators.base import CoverageGuarantee
from privcal.storage.records import ReleaseRecord, UTCDateTime

__all__ = [
    "BudgetReport",
    "ChargeReceipt",
    "DatasetInfo",
    "DryRun",
    "GuaranteeReport",
    "Release",
    "SpentReport",
    "SubjectChargeResult",
    "SubjectSummary",
    "construct_trusted",
]

_object_setattr = object.__setattr__
#: model class → its field names in order, if :func:`construct_trusted` may build it
#: directly (else None: pydantic's ``model_construct`` does)
_PLAIN_FIELDS: dict[type[BaseModel], tuple[str, ...] | None] = {}


def _plain_fields(cls: type[BaseModel]) -> tuple[str, ...] | None:
    """The field names of ``cls`` if ``model_construct`` of every field does no more than
    set them: no alias, no post-init hook, no extra fields kept, not a root model."""
    fields = cls.__pydantic_fields__
    plain = (not cls.__pydantic_post_init__ and not cls.__pydantic_root_model__
             and cls.model_config.get("extra") != "allow"
             and all(f.alias is None and f.validation_alias is None for f in fields.values()))
    return tuple(fields) if plain else None


def construct_trusted(cls: type[Any], values: dict[str, Any]) -> Any:
    """``cls.model_construct(**values)`` for values already of their types (no validation):
    the same instance — ``__dict__`` in field order, every field set — without its per-field
    alias and default look-ups when ``values`` has every field in order (a charge's receipt,
    issue 11; tests/test_hot_path.py checks it equals the validated model); else
    ``model_construct`` itself. ``values`` becomes the instance's ``__dict__``: pass a dict
    of its own."""
    try:
        fields = _PLAIN_FIELDS[cls]
    except KeyError:
        fields = _PLAIN_FIELDS[cls] = _plain_fields(cls)
    if fields is None or tuple(values) != fields:
        return cls.model_construct(**values)
    m = cls.__new__(cls)
    _object_setattr(m, "__dict__", values)
    _object_setattr(m, "__pydantic_fields_set__", set(fields))
    _object_setattr(m, "__pydantic_extra__", None)
    _object_setattr(m, "__pydantic_private__", None)
    return m


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
    #: the central charges' ε alone, when ``epsilon`` also includes local-DP reports
    #: (None: the dataset takes none)
    central_epsilon: Decimal | None = None
    #: the largest per-subject Σε0 of local-DP reports, included in ``epsilon`` (None: the
    #: dataset takes none)
    subject_max: Decimal | None = None


class GuaranteeReport(BaseModel):
    """The dataset's guarantee: its cap's filter, valid however requests adapt."""

    model_config = ConfigDict(frozen=True)

    #: +∞ when no guarantee is established (``established``)
    epsilon: Decimal = Field(allow_inf_nan=True)
    delta: Decimal
    rule: str
    statement: str
    #: False when the charges so far do not pass the cap's filter (an (ε, δ) dataset charged
    #: past its cap before migration 0004): no guarantee is established, ε is +∞, δ is 1
    established: bool = True
    #: whether the dataset allows non-private releases (outside the guarantee); None when the
    #: report was built without it — then :attr:`short` is the full :attr:`statement`, which
    #: always says so. Not in the JSON: there the statement says it.
    nonprivate: bool | None = Field(default=None, exclude=True)

    @property
    def short(self) -> str:
        """The guarantee in one line, with every qualification of :attr:`statement` (however
        requests adapt; the neighbouring relation; non-private releases excluded):
        :func:`~privcal.accountant.privacy.guarantees.short_guarantee`. Without
        ``nonprivate`` known it is the statement itself: a bare "(ε, δ)-DP" must not be
        read as covering a non-private release (red team 7, F-1)."""
        if not self.established:
            return NOT_ESTABLISHED_SHORT
        if self.nonprivate is None:
            return self.statement
        return short_guarantee(self.epsilon, self.delta, nonprivate=self.nonprivate)


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

        # amounts as every other output spells them (0.0000001, not str(Decimal)'s 1E-7:
        # red team 24, privacy F2)
        def fmt(d: dict[str, Decimal]) -> str:
            return ", ".join(f"{k}={acc.dstr(v)}" for k, v in d.items()) or "nothing"

        return (
            f"{self.dataset}: spent {fmt(self.spent)}, remaining {fmt(self.remaining)}; "
            f"guarantee {self.guarantee.short} (the cap's filter); "
            f"spent so far as (ε, δ): ε={acc.dstr(self.spent_dp.epsilon)}, "
            f"δ={acc.dstr(self.spent_dp.delta)} [{self.spent_dp.rule}] (not a guarantee "
            "under adaptive use)"
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
    #: the coverage guarantee the run would record, from the shape alone
    guarantee: str | None = None
    #: the run can only release +∞ (the trivial set or interval), whatever the data: too few
    #: rows for this level and budget (``privcal advise`` says how many are needed)
    trivial: bool = False


class Release(ReleaseRecord):
    """A stored release, its coverage guarantee typed.

    ``model_dump_json()`` / :meth:`load` save and load it (±∞ kept), to serve a model without
    the ledger (:mod:`privcal.accountant.saved_release`).
    """

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    coverage: CoverageGuarantee  # type: ignore[assignment]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def assumes(self) -> str | None:
        """What the coverage guarantee assumes of the data, which privcal cannot check
        (exchangeable or i.i.d. draws; per group for Mondrian): the installed method's
        wording (:func:`~privcal.calibrators.assumptions.method_assumption`), not stored;
        None for a method this installation does not know; a local-DP run that left out
        users past their cap says so (:func:`~privcal.calibrators.assumptions.
        release_assumption`). In every JSON of a release (``--json``, the HTTP API, a saved
        release; ignored when one is loaded back)."""
        from privcal.calibrators.assumptions import release_assumption

        return release_assumption(self.method, self.diagnostics)

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
        """Coverage and interval length on held-out targets (an ``IntervalEvaluation``; for a
        Mondrian release also ``by_group``, each group against its own bound)."""
        from privcal.calibrators.evaluation import is_marginal
        from privcal.calibrators.group_sets import release_groups
        from privcal.calibrators.intervals import evaluate_intervals, release_lower
        from privcal.calibrators.shortfall import with_shortfall

        iv = self.predict_interval(preds, lower_preds=lower_preds, upper_preds=upper_preds,
                                   score_name=score_name, alpha=alpha, groups=groups)
        by = release_groups(self, groups, int(iv.shape[0]), alpha=alpha)
        return with_shortfall(evaluate_intervals(iv, targets, release_lower(self, alpha=alpha),
                                                 is_marginal(self.coverage), groups=by), self)

    def predict_set(self, probs: Any, *, score_name: str | None = None,
                    rng: random.Random | None = None, alpha: float | None = None,
                    groups: Any = None) -> np.ndarray:
        """Prediction sets (boolean n×k) of this release for new class probabilities.

        A release with several levels takes the level ``alpha``; one with Mondrian groups
        from a column takes each row's group (``groups``); label groups need neither. For
        scores privcal did not compute the sets are a superset of {y : S ≤ t}
        (``outside_threshold``): ``coverage.upper`` bounds the latter only. A label is also
        in when its score is ≤ t in the other reading of float32 probabilities (widened
        array or its CSV decimals: :mod:`~privcal.calibrators.readings`)."""
        from privcal.accountant.calibration_request import check_rng
        from privcal.calibrators.group_sets import release_sets

        check_rng(rng)  # a random.Random or None (rng=42: one line, not an AttributeError)
        return release_sets(self, probs, score_name=score_name, rng=rng, alpha=alpha,
                            groups=groups)

    def level_sets(self, probs: Any, *, score_name: str | None = None,
                   rng: random.Random | None = None,
                   groups: Any = None) -> list[tuple[float, np.ndarray]]:
        """The sets at every level of a several-level release, ``[(α, n×k sets), …]``,
        nested (smaller α, larger set): one draw of the randomized scores serves every
        level (separate :meth:`predict_set` calls draw separately, and need not nest)."""
        from privcal.accountant.calibration_request import check_rng
        from privcal.calibrators.group_sets import level_sets

        check_rng(rng)
        return level_sets(self, probs, score_name=score_name, rng=rng, groups=groups)

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
        from privcal.calibrators.evaluation import (
            evaluate_sets,
            is_marginal,
            labels_as_calibrated,
        )
        from privcal.calibrators.group_sets import evaluate_wrapped, is_wrapped

        sets = self.predict_set(probs, score_name=score_name, rng=rng, alpha=alpha,
                                groups=groups)
        labels = labels_as_calibrated(labels, self.classes,
                                      (self.diagnostics or {}).get("label_names") is True)
        from privcal.calibrators.shortfall import with_shortfall

        if is_wrapped(self.method):
            return with_shortfall(evaluate_wrapped(self, sets, labels, alpha=alpha,
                                                   groups=groups, classes=self.classes), self)
        return with_shortfall(evaluate_sets(sets, labels, self.coverage.lower,
                                            classes=self.classes,
                                            marginal=is_marginal(self.coverage)), self)
