"""The Accountant: budgets per dataset and per subject, atomic charging, and the release path.

:class:`Accountant` is the one object callers use (the CLI, the service, the Python API);
each of its methods is one call into the module of its concern, which is the policy, and
which composes named operations of :class:`privcal.storage.Ledger` (where all SQL is;
the accountant imports no SQLAlchemy, ``tests/test_sql_in_storage.py``):

===============================================  ==============================================
:mod:`privcal.accountant.calibration_request`    the inputs of one request, listed and checked
:mod:`privcal.accountant.calibration`            one request by method name: prepare, then run
:mod:`privcal.accountant.prepare`                parameters, data → scores, the public shape
:mod:`privcal.accountant.calibration_run`        the run: charge → calibrate → record; dry run
:mod:`privcal.accountant.charges`                central charges (the hot path), key replays
:mod:`privcal.accountant.subject_charges`        per-subject local-DP charges in bulk
:mod:`privcal.accountant.releases`               record a release tied to its charges; read them
:mod:`privcal.accountant.release_privacy`        the privacy record of a release
:mod:`privcal.accountant.datasets`               create a dataset; budget report; subject spends
:mod:`privcal.accountant.policy`                 ledger rows read as policy and as results
:mod:`privcal.accountant.normalize`              amounts, costs, text and JSON as stored
:mod:`privcal.accountant.results`                the models returned (``Release``, …)
:mod:`privcal.accountant.sessions`               collection sessions (reports arriving over time)
:mod:`privcal.accountant.verification`           every release's guarantees recomputed
:mod:`privcal.accountant.report`                 ``privcal audit report``
:mod:`privcal.accountant.privacy`                the pure mathematics (no database)
===============================================  ==============================================

**One calibration, call by call** — ``privcal calibrate pcoqs --dataset d --scores s.npy
--alpha 0.1 --rho 0.1``:

1. *CLI* (:mod:`privcal.cli.calibrate_cmds`): parse the options, read the arrays
   (:func:`privcal.data.files.load_array`), call
   :func:`privcal.accountant.calibration.calibrate` — the function
   :meth:`Accountant.calibrate` and the service's calibration route call too.
2. *Prepare* (:func:`privcal.accountant.prepare.prepare`): the calibrator from the
   registry, its parameters validated, scores computed, the public shape (n, k, groups);
   nothing is charged. Then :meth:`Accountant.run` → :func:`.calibration_run.run`.
3. *Charge* (:func:`.calibration_run.run`): ``cost = calibrator.cost(params, shape)``, then
   :func:`.charges.charge` — one transaction, :meth:`Ledger.write_core
   <privcal.storage.transactions.LedgerTransactions.write_core>`: ``dataset_row`` (the
   locked row), :func:`~privcal.accountant.privacy.filters.check_charge` (the cap's filter),
   ``insert_charge`` (with the new totals), ``append_audit``; the audit entry appended last
   (on PostgreSQL by the audit sequencer, :mod:`privcal.storage.audit_queue`); COMMIT.
4. *Calibrate*: ``calibrator.calibrate(data, params, rng)``
   (:mod:`privcal.calibrators.pcoqs`) — the only step that reads the data; then
   ``calibrator.guarantee(params, shape)``, the coverage it proves.
5. *Record*: :func:`.release_privacy.privacy_record` and :func:`.releases.record_release`
   — one transaction, :meth:`Ledger.write
   <privcal.storage.transactions.LedgerTransactions.write>`: ``lock_dataset``,
   ``charge_dataset_ids`` (the charges are the dataset's), ``insert_release``,
   ``append_audit``; COMMIT. The :class:`~privcal.accountant.results.Release` returns up
   the same path, and the CLI prints it with :meth:`Accountant.budget`.

A crash between 3 and 5 leaves a charge without a release, never the reverse. Refused at
3 (:class:`~privcal.errors.BudgetRefused`), nothing is written.

**Decisions** where the spec is silent:

- Amounts are exact decimals limited to 12 decimal places; a cost with more
  digits (e.g. an amplified ε computed in floating point) is rounded *up* to
  12 places before it is charged — charging slightly more is always safe. Caps
  with more than 12 places are rejected.
- ``charge_subjects``: a subject listed several times in a batch is charged once,
  for one of its rows chosen uniformly at random (never by position: a sorted file
  would choose by the data), the others rejected as duplicates. A batch in which no subject can
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
  migration 0005 have no digest: their key is compared on kind and cost only. A
  non-private run charges nothing: its key and digest go to ``release_keys`` (0010).
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

import random
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from privcal.accountant import calibration_run, charges, datasets, releases, subject_charges
from privcal.accountant.calibration_request import INPUTS
from privcal.accountant.decimal_context import library_context_methods
from privcal.accountant.normalize import AMOUNT_PLACES, CentralCost
from privcal.accountant.results import (
    BudgetReport,
    ChargeReceipt,
    DatasetInfo,
    DryRun,
    GuaranteeReport,
    Release,
    SpentReport,
    SubjectChargeResult,
    SubjectSummary,
)
from privcal.calibrators.base import CalibrationInput, Calibrator, CoverageGuarantee, DataShape
from privcal.costs import ApproxDP, LocalDP
from privcal.errors import InvalidInput
from privcal.storage import Ledger

__all__ = ["AMOUNT_PLACES", "CALIBRATE_OPTIONS", "Accountant", "BudgetReport", "ChargeReceipt",
           "DatasetInfo", "DryRun", "GuaranteeReport", "Release", "SpentReport",
           "SubjectChargeResult", "SubjectSummary"]

#: keyword arguments of :meth:`Accountant.calibrate` that are data or options, not parameters:
#: the inputs of a :class:`~privcal.accountant.calibration_request.CalibrationRequest`, and
#: who asks, the retry key and the random source of the run
CALIBRATE_OPTIONS = frozenset({*INPUTS, "requester", "idempotency_key", "rng"})


@library_context_methods  # its own decimal context, whatever the caller's (red team 6)
class Accountant:
    """Gatekeeper of every privacy charge and release on one :class:`~privcal.storage.Ledger`."""

    def __init__(self, ledger: Ledger | str | None = None) -> None:
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)

    def close(self) -> None:
        """Close the ledger's connections (:meth:`Ledger.close`): ``with Accountant(…) as a``."""
        self.ledger.close()

    def __enter__(self) -> Accountant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        return datasets.create_dataset(
            self.ledger, name, epsilon=epsilon, rho=rho, approx_epsilon=approx_epsilon,
            approx_delta=approx_delta, delta=delta, subject_epsilon=subject_epsilon,
            allow_nonprivate=allow_nonprivate, description=description, renyi_orders=renyi_orders,
        )

    def datasets(self) -> list[DatasetInfo]:
        """Every dataset, by name."""
        return datasets.list_datasets(self.ledger)

    def dataset(self, name: str) -> DatasetInfo:
        """One dataset (NotFound if it does not exist)."""
        return datasets.get_dataset(self.ledger, name)

    def budget(self, name: str) -> BudgetReport:
        """Cap, spent, remaining (dataset's notion), the cap's guarantee (valid however the
        requests adapt) and the realized spend as (ε, δ) (labelled: not a guarantee)."""
        return datasets.budget_report(self.ledger, name)

    def subject_spend(self, name: str, subject_id: Any) -> Decimal:
        """ε0 spent so far by one subject of ``name`` (0 if never charged); looked up by its
        pseudonym."""
        return datasets.subject_spend(self.ledger, name, subject_id)

    def subject_summary(self, name: str) -> SubjectSummary:
        """Count, maximum, mean and quantiles of per-subject spends, and how many are at the cap."""
        return datasets.subject_summary(self.ledger, name)

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
        return charges.charge(self.ledger, dataset, cost, purpose=purpose, requester=requester,
                              idempotency_key=idempotency_key, request=request)

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
        return subject_charges.charge_subjects(
            self.ledger, dataset, eps0, subject_ids, central_cost=central_cost, purpose=purpose,
            requester=requester, idempotency_key=idempotency_key, refuse_if_none=refuse_if_none,
            request=request)

    def releases(self, dataset: str | None = None) -> list[Release]:
        """Every release (optionally of one dataset), coverage typed."""
        return releases.list_releases(self.ledger, dataset)

    def release(self, release_id: int, *, checked: bool = True,
                visible: Callable[[str], bool] | None = None) -> Release:
        """One release by id; ``checked``: refused (AuditFailed) unless its row is what its
        audit entry recorded (red team 16: a threshold edited in the database); ``visible``:
        NotFound, before the check, unless it accepts the release's dataset name."""
        return releases.get_release(self.ledger, release_id, checked=checked, visible=visible)

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
        distribution_version: str = "unknown",
        requester: str | None = None,
        charge_ids: Sequence[int] = (),
    ) -> Release:
        """Append a release tied to charges already made (by ``run`` or a collection session).

        The charges must belong to ``dataset``; the first is the release's ``charge_id``
        and may carry only one release.
        """
        return releases.record_release(
            self.ledger, dataset, method=method, calibrator_version=calibrator_version,
            threshold=threshold, params=params, shape=shape, coverage=coverage, privacy=privacy,
            diagnostics=diagnostics, distribution=distribution,
            distribution_version=distribution_version, requester=requester, charge_ids=charge_ids,
        )

    # ------------------------------------------------------------ the calibration run
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
        distribution name and version recorded with the release. ``extra_diagnostics`` are
        public facts (e.g. the score name) stored with the calibrator's diagnostics.
        ``shuffle``, ``privacy_extra`` and ``central_cost`` (a shuffled run's amplified cost)
        are privcal's own (:meth:`calibrate`, ``shuffled=True``): a caller's are refused,
        uncharged (red team 16: a made-up amplification was recorded as the guarantee).
        ``classes``: the k of the probabilities precomputed scores came from (recorded in
        the shape; ``predict_set`` refuses another k).

        With an ``idempotency_key`` the key binds the whole request (method, params, cost,
        public shape, subjects) and the run holds the key's lock (:meth:`Ledger.key_lock`)
        from charge to release: a concurrent retry waits and returns the one release.
        """
        if privacy_extra is not None or shuffle is not None or central_cost is not None:
            raise InvalidInput("privacy_extra, shuffle and central_cost are privcal's: a "
                               "shuffled run is calibrate(..., shuffled=True)")
        return calibration_run.run(
            self.ledger, calibrator, params, data, dataset=dataset, requester=requester,
            idempotency_key=idempotency_key, rng=rng, registered=registered,
            privacy_extra=privacy_extra, central_cost=central_cost,
            extra_diagnostics=extra_diagnostics, shuffle=shuffle, classes=classes,
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
        other keyword is a calibrator parameter. They become one
        :class:`~privcal.accountant.calibration_request.CalibrationRequest`; validation and
        data preparation are :func:`privcal.accountant.calibration.calibrate`; the charge and
        release are :meth:`run`.
        """
        from privcal.accountant.calibration import calibrate as _calibrate
        from privcal.accountant.calibration_request import CalibrationRequest

        if params is not None and not isinstance(params, dict):
            raise InvalidInput(f"params must be a dict, got {type(params).__name__}")
        run = {k: kwargs.pop(k) for k in ("requester", "idempotency_key", "rng") if k in kwargs}
        inputs = {k: kwargs.pop(k) for k in INPUTS if k in kwargs}
        if both := sorted(set(params or ()) & set(kwargs)):  # not "the keyword wins" (red
            # team 22, newcomer F3: alpha=0.2 beside {"alpha": 0.1} ran at 0.2 without a word)
            raise InvalidInput(f"{', '.join(both)} given both in params and as a keyword: "
                               "give each parameter once")
        request = CalibrationRequest.of(method, {**(params or {}), **kwargs}, **inputs)
        return _calibrate(self, request, dataset=dataset, **run)

    def dry_run(self, calibrator: Calibrator, params: Any, shape: DataShape,
                dataset: str) -> DryRun:
        """The cost of a run and what would remain after it; writes nothing."""
        return calibration_run.dry_run(self.ledger, calibrator, params, shape, dataset)

    # ------------------------------------------------------------ audit
    def verify(self, expect_head: str | Sequence[str] | None = None, *, signed_head: Any = None,
               trusted_key: Any = None, allow_unsigned_tail: bool = False,
               progress: Any = None) -> Any:
        """Verify the audit log and recompute every release's guarantees with the installed code.

        Returns an :class:`~privcal.accountant.verification.AuditReport`; raises
        :class:`~privcal.errors.AuditFailed` naming the first entry or release that does not
        verify. ``signed_head`` + ``trusted_key``: see :meth:`privcal.storage.Ledger.verify`
        and :mod:`privcal.storage.signing`; ``progress`` reports the walk over the log (the
        CLI passes its bar's :func:`privcal.cli.progress.iterate`).
        """
        from privcal.accountant.verification import verify

        return verify(self, expect_head=expect_head, signed_head=signed_head,
                      trusted_key=trusted_key, allow_unsigned_tail=allow_unsigned_tail,
                      progress=progress)
