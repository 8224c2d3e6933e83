"""Re-checking what was released: the hash chain, and every recorded guarantee recomputed.

An auditor should not have to trust whoever wrote a release row. The ledger's
own :meth:`~privcal.storage.Ledger.verify` proves the log is intact (every
hash, every row against its entry); this module then recomputes, with the
*installed* calibrator code, each release's coverage guarantee and privacy
guarantee from its stored parameters and public shape, and flags any
difference (DESIGN.md: "Every guarantee can be recomputed"): the numbers, and the
sentences that state them (``statement``, ``over``, ``neighbouring``). A sentence is
left uncompared — and counted in ``statements_not_compared`` — only where it is older
wording the installed code cannot reproduce (:func:`_legacy_texts`). It also checks that the
release's charges pay for the privacy cost it recomputes
(:func:`privcal.storage.verify_releases.shortfall`; the storage's verification applies it to
the recorded cost).
"""

from __future__ import annotations

from decimal import Decimal
from functools import partial
from typing import Any

from pydantic import BaseModel, ConfigDict

from privcal.accountant import privacy as acc
from privcal.accountant.normalize import cost_json, normalize_cost
from privcal.accountant.record_compare import coverage_as_recorded, plain, same, zcdp_parts
from privcal.accountant.release_privacy import is_legacy_local, privacy_record
from privcal.calibrators import registry
from privcal.calibrators.base import DataShape
from privcal.errors import AuditFailed, PrivcalError
from privcal.storage.records import VerifyReport
from privcal.storage.unreadable import unreadable
from privcal.storage.verify_releases import PaidBy, reports_used, shortfall


class ReleaseCheck(BaseModel):
    """The result of recomputing one release's guarantees."""

    model_config = ConfigDict(frozen=True)

    release: int
    dataset: str
    method: str
    ok: bool
    problems: list[str]
    #: guarantee sentences of an older version whose wording the installed code does not
    #: reproduce, hence not compared (their numbers are)
    statements_not_compared: int = 0


class AuditReport(VerifyReport):
    """A verified log (the storage's :class:`~privcal.storage.records.VerifyReport`), the
    number of releases whose guarantees were recomputed, and how many of their sentences
    were left uncompared (older wording the installed code does not reproduce)."""

    guarantees_recomputed: int
    statements_not_compared: int = 0

    @property
    def summary(self) -> str:
        signed = ""
        if self.signed_through is not None:
            signed = (f"; signed by the trusted key through entry {self.signed_through} "
                      f"(signed {self.signed_at})")
            if self.unsigned_entries:
                signed += f", {self.unsigned_entries} later entries unsigned"
        queued = ""
        if self.queued:
            since = self.queued_since.strftime("%Y-%m-%d %H:%M:%S") if self.queued_since else "?"
            queued = (f"; {self.queued} more entr{'y' if self.queued == 1 else 'ies'} committed "
                      f"(oldest {since} UTC) but not yet chained: still in the audit queue, "
                      "checked against their rows (not covered by the head; any write, or "
                      "`privcal audit head` with write access, chains them)")
        expected = ""
        if self.expected_through is not None:
            expected = (f"; the expected head is entry {self.expected_through}: "
                        + (f"{self.after_expected} later entr"
                           + ("y" if self.after_expected == 1 else "ies")
                           + (f" ({self.queued} still queued)" if self.queued else "")
                           + " not covered by it (appended since: sign heads to vouch for "
                           "them)" if self.after_expected else "no entry after it"))
        texts = ""
        if self.statements_not_compared:
            n = self.statements_not_compared
            texts = (f" ({n} guarantee sentence{'' if n == 1 else 's'} not reproduced by the "
                     "installed code (older wording) not compared; their numbers are "
                     "compared)")
        kept = ""
        if not self.heads_checked:
            kept = ("; no kept head was given, so a log whose newest entries were removed, or "
                    "one rewritten with every hash recomputed, verifies too (keep `privcal "
                    "audit head` outside the database and pass --expect-head, or sign heads)")
        return (
            f"ok: {self.entries} log entries verify (head {self.head}){signed}{queued}"
            f"{expected}; {self.guarantees_recomputed} release guarantees recomputed and "
            f"match{texts}{kept}"
        )


#: the human sentences of each record: compared by :func:`_texts`, not by :func:`_diff`
TEXTS = {"coverage": ("statement", "over"), "privacy": ("statement", "neighbouring")}

#: what every non-private release said before a calibrator could state what it reveals
_OLD_NONPRIVATE = "non-private release (allowed by the dataset policy)"


def _diff(what: str, recorded: dict[str, Any], recomputed: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted((set(recorded) | set(recomputed)) - set(TEXTS[what])):
        if not same(recorded.get(key), recomputed.get(key)):
            out.append(
                f"{what}.{key}: recorded {recorded.get(key)!r}, recomputed {recomputed.get(key)!r}"
            )
    return out


def _texts(what: str, recorded: dict[str, Any], recomputed: dict[str, Any],
           legacy: bool) -> tuple[list[str], int]:
    """(problems, sentences not compared): each sentence of ``what`` must be the recomputed
    one, except where ``legacy`` (an older wording the installed code does not reproduce):
    then a different sentence is counted as not compared instead."""
    problems, skipped = [], 0
    for key in TEXTS[what]:
        if recorded.get(key) == recomputed.get(key):
            continue
        if legacy:
            skipped += 1
        else:
            problems.append(f"{what}.{key}: recorded {recorded.get(key)!r:.120}, recomputed "
                            f"{recomputed.get(key)!r:.120}")
    return problems, skipped


def _legacy_texts(cal: Any, rel: Any, recorded: dict[str, Any],
                  recomputed: dict[str, Any]) -> tuple[bool, bool]:
    """(coverage, privacy): whether the release's sentences may be older wording the installed
    code does not write, so that a different one is counted as not compared, not a failure.

    An older calibrator version: its formula is reproduced (``legacy_params``,
    ``guarantee_as``), its wording not always (P-COQS 1.0.0 and 2.0.0, LDP-CP-S version 1,
    and LDP-CP-L version 1 before issue 14.7 worded theirs otherwise). A private release
    recorded before the neighbouring relation was (issue 14.7; ExponQ 1.0.0 then worded its
    statement otherwise). A non-private release that says only what every one said before
    its calibrator could state what it reveals. A local release recorded before its
    calibrator said what its ε0 protects (red team 7). A release of the installed version
    recorded since is compared sentence by sentence."""
    older = rel.calibrator_version != cal.version
    pre_14_7 = recomputed.get("cost") is not None and "neighbouring" not in recorded
    nonprivate_old = (recomputed.get("cost") is None
                      and recorded.get("statement") == _OLD_NONPRIVATE)
    return older or pre_14_7, older or pre_14_7 or nonprivate_old or is_legacy_local(recorded)


def privacy_problems(cal: Any, rel: Any, recorded: dict[str, Any],
                     recomputed: dict[str, Any], *, lenient: bool = True
                     ) -> tuple[list[str], int]:
    """(problems, sentences not compared) of release ``rel``'s privacy record ``recorded``
    against ``recomputed`` (:func:`recompute`'s): its numbers and rule compared, its
    sentences too unless they may be an older wording (:func:`_legacy_texts`) and
    ``lenient`` (a ledger's own records; a saved file is checked without it). The rule of
    ``audit verify`` and of a saved release's load check."""
    problems = _diff("privacy", recorded, recomputed)
    _, legacy = _legacy_texts(cal, rel, recorded, recomputed)
    legacy = legacy and lenient
    text_problems, skipped = _texts("privacy", recorded, recomputed, legacy)
    return problems + text_problems, skipped


def _made_by(rel: Any, reg: registry.Registered) -> bool:
    """Whether release ``rel`` was recorded by the calibrator registered as its method. Also
    the two forms a calibrator object passed by a caller was recorded under before
    provenance was checked (privcal 0.x): ``Accountant.run`` wrote ``privcal`` and an empty
    version, ``calibrate`` its class's top-level package and ``unknown``."""
    if rel.distribution == reg.distribution:
        return True
    cal = reg.calibrator
    while getattr(cal, "inner", None) is not None:  # a wrapper records its method's origin
        cal = cal.inner
    package = type(cal).__module__.split(".")[0]
    return ((rel.distribution, rel.distribution_version) == ("privcal", "")
            or (rel.distribution, rel.distribution_version) == (package, "unknown"))


def recompute(rel: Any, ds: Any, *, current: bool = False,
              ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(calibrator, coverage, privacy): release ``rel``'s guarantees as the installed code
    states them for its stored parameters, shape and (shuffled) record on dataset ``ds``
    (a :class:`~privcal.accountant.results.DatasetInfo`), by the formula of the calibrator
    version that made it; the records as a JSON column gives them back. The one
    recomputation of :func:`check_release` and of ``record_release``'s check of the
    sentences it is given (``current``: in the installed code's wording only, never an
    older one the recorded sentences use). Raises :class:`PrivcalError` (also for an
    unknown method)."""
    from privcal.accountant.amplification import shuffled_guarantee
    cal = registry.get(rel.method).calibrator
    params, shape, guarantee = coverage_as_recorded(cal, rel)
    coverage = guarantee.model_dump(mode="json")
    cost = cal.cost(params, shape)
    extra = (rel.privacy or {}).get("extra")
    new_extra = None
    central_cost = None
    if extra and extra.get("shuffled"):
        central_cost, new_extra = shuffled_guarantee(
            rel.method, params, shape, ds.reporting_delta,
            assume_unlinkable_features="assumption" in extra,
        )  # fmt: skip
    recorded = rel.privacy or {}
    # a local-DP release recorded before its calibrator said what its ε0 protects (red
    # team 7: "ε-local DP for each participating subject" also for LDP-CP-L's label-only
    # and FedCP²-QQ's record-level ε): its rule as then; its statement, older wording, is
    # counted as not compared (_legacy_texts), never reported as matching
    legacy_local = not current and is_legacy_local(recorded)
    privacy = privacy_record(cost, ds, new_extra, cal, legacy_local=legacy_local)
    if not current and "amplified_for" in privacy and "amplified_for" not in recorded:
        # a shuffled release recorded before its record named whom the amplification
        # protects against: recomputed in the wording of then
        privacy = privacy_record(cost, ds, new_extra, cal, legacy_wording=True,
                                 legacy_local=legacy_local)
    if central_cost is not None and ds.notion == "approx":  # charged to the dataset (run)
        privacy["central_cost"] = cost_json(normalize_cost(central_cost))
    return cal, plain(coverage), plain(privacy)


def sentence_problems(rel: Any, ds: Any) -> list[str]:
    """Why ``record_release`` refuses to write release ``rel`` (not yet written) on dataset
    ``ds``: a calibrator version other than the installed one, or a guarantee sentence
    (coverage ``statement``/``over``, privacy ``statement``/``neighbouring``) other than the
    one the installed code recomputes (:func:`recompute`). Only a release written before
    this check existed may carry older wording (``audit verify`` counts it, uncompared)."""
    try:
        cal, coverage, privacy = recompute(rel, ds, current=True)
    except PrivcalError as exc:
        return [f"its guarantees cannot be recomputed: {exc}"]
    if rel.calibrator_version != cal.version:
        return [f"calibrator version {rel.calibrator_version} is not the installed "
                f"{rel.method} {cal.version}"]
    out: list[str] = []
    for what, rec, new in (("coverage", plain(rel.coverage), coverage),
                           ("privacy", plain(rel.privacy), privacy)):
        rec = rec if isinstance(rec, dict) else {}
        # the numbers too: a release verify would fail is never written (red team 5)
        out += _diff(what, rec, plain(new)) + _texts(what, rec, new, legacy=False)[0]
    return out


def reports_of(cal: Any, rel: Any, session_total: int | None) -> int:
    """The reports local release ``rel`` used (:func:`~privcal.storage.verify_releases.
    reports_used`, federated as its calibrator is)."""
    return reports_used(rel.shape, federated=getattr(cal, "privacy_model", None) == "federated",
                        session_total=session_total)


def check_release(accountant: Any, rel: Any, charges: dict[int, PaidBy] | None = None,
                  sessions: dict[int, int] | None = None) -> ReleaseCheck:
    """Recompute one release's coverage and privacy guarantees from its stored inputs, and
    check that its charges (``charges``: charge id → what it paid, at least the release's;
    read from the ledger if not given) pay for the cost recomputed (a local release: for as
    many subjects as it used reports; ``sessions``: release id → its session's reports,
    read if not given)."""
    problems: list[str] = []
    skipped = 0
    try:
        reg = registry.get(rel.method)
    except PrivcalError as exc:
        return ReleaseCheck(release=rel.id, dataset=rel.dataset, method=rel.method, ok=False,
                            problems=[f"cannot recompute: {exc}"])  # fmt: skip
    cal = reg.calibrator
    if not _made_by(rel, reg):  # another package's mechanism under this name
        problems.append(f"made by {rel.distribution!r}, but the installed {rel.method} comes "
                        f"from {reg.distribution!r}: its guarantee cannot be recomputed")
    # a release of an older calibrator version is recomputed by the formula it was made with:
    # the calibrator lists the parameter values that select it (issue 13)
    legacy = getattr(cal, "legacy_params", {}).get(rel.calibrator_version)
    if cal.version != rel.calibrator_version and legacy is None:
        problems.append(
            f"calibrator version: recorded {rel.calibrator_version}, installed {cal.version}"
        )
    try:
        from privcal.accountant.prepare import validate_params

        ds = accountant.dataset(rel.dataset)
        cal, coverage, new_priv = recompute(rel, ds)
        recorded_cov = plain(
            rel.coverage if isinstance(rel.coverage, dict) else rel.coverage.model_dump(mode="json")
        )
        problems += _diff("coverage", recorded_cov, coverage)
        if hasattr(cal, "check_record"):  # a levels/Mondrian wrapper: its stored thresholds
            params = validate_params(cal, {**(legacy or {}), **rel.params})
            problems += cal.check_record(params, DataShape.model_validate(rel.shape),
                                         rel.threshold, rel.diagnostics or {})
        recorded_priv = plain(rel.privacy)
        legacy_cov, _ = _legacy_texts(cal, rel, recorded_priv, new_priv)
        text_problems, n = _texts("coverage", recorded_cov, coverage, legacy_cov)
        priv_problems, m = privacy_problems(cal, rel, recorded_priv, new_priv)
        problems += text_problems + priv_problems
        skipped += n + m
        if charges is None:
            charges = accountant.ledger.release_charges(rel.charge_ids)
        if sessions is None:
            sessions = accountant.ledger.session_reports(rel.id)
        unpaid = shortfall(new_priv, [charges[i] for i in rel.charge_ids if i in charges],
                           reports_of(cal, rel, sessions.get(rel.id)),
                           zcdp_parts=zcdp_parts(cal, rel, new_priv, ds.notion))
        if unpaid is not None:
            problems.append(f"charges: the release {unpaid} (its recomputed cost)")
    except PrivcalError as exc:
        problems.append(f"cannot recompute: {exc}")
    return ReleaseCheck(release=rel.id, dataset=rel.dataset, method=rel.method,
                        ok=not problems, problems=problems,
                        statements_not_compared=skipped)  # fmt: skip


def check_cap(ds: Any, under_grid: bool = True) -> None:
    """An (ε, δ) dataset's spend (its totals, which the storage's verification has just found
    equal to the sum of its logged charges) within its logged cap's Rényi filter
    (:func:`~privcal.accountant.privacy.filters.within_cap`): each charge privcal accepts
    keeps it so, but a cap raised around a charge and put back, or totals lowered around one
    and restored, left every row equal to its entry and the budget overspent — verified ok,
    and signed (red team 23, ledger F7). Pure-ε and ρ-zCDP caps are the storage's own check,
    in the same words (:mod:`privcal.storage.verify_caps`: red team 24, ledger F2); an
    (ε, δ) cap's filter is accountant mathematics, so this is the ``cap_check`` :func:`verify`
    gives :meth:`privcal.storage.Ledger.verify`, which calls it on each dataset row of the
    snapshot it verifies — the rows whose head is reported, and signed (red team 25, ledger
    F3: checked in a later read, a cap raised between the two reads let an overspent head be
    signed). ``under_grid``: the totals were last charged under the cap's filter — False only
    for a dataset made before migration 0004 not charged since the 0005 ``migration`` entry,
    which may be past the filter under the pre-0004 rule (it then states no guarantee:
    :func:`~privcal.accountant.privacy.guarantees.filter_guarantee`); one charged since was
    charged under the filter on the frozen grid, and is checked on it (red team 25, ledger
    F7: :func:`privcal.storage.verify_caps.grid_check`)."""
    if ds.notion != "approx":
        return  # pure-ε and ρ-zCDP caps: checked by the storage's verification
    if not under_grid:
        return  # charged before migration 0004 and not since: no guarantee is stated
    # policy_of / spent_of of privcal.accountant.policy, which this module cannot
    # import (policy → results → saved_release → verification: a cycle)
    orders = (acc.MIGRATED_RENYI_ORDERS if ds.renyi_orders is None
              else tuple(Decimal(a) for a in ds.renyi_orders))
    pol = acc.Policy(ds.notion, ds.cap_epsilon, ds.cap_rho, ds.cap_delta, orders)
    spent = acc.Spent(ds.spent_pure_eps, ds.spent_pure_rho, ds.spent_zcdp_rho,
                      ds.spent_approx_eps, ds.spent_approx_delta)
    if acc.within_cap(pol, spent):
        return
    u = ", ".join(f"{k}={acc.dstr(v)}" for k, v in acc.used(pol, spent).items())
    raise AuditFailed(
        f"dataset {ds.id} ({ds.name!r}): its logged charges spend {u} of its cap "
        f"{pol.describe()}, more than the cap's filter allows: a cap or running "
        "totals edited around a charge, or a charge accepted past its budget")


def verify(accountant: Any, expect_head: Any = None, **signed: Any) -> AuditReport:
    """Verify the log, then every release's guarantees; raise :class:`AuditFailed` on the first
    release whose recorded guarantee the installed code does not reproduce, and on a stored
    value privcal cannot read (:func:`~privcal.storage.unreadable.unreadable`). ``signed``:
    ``signed_head``, ``trusted_key``, ``allow_unsigned_tail`` and ``progress`` of
    :meth:`privcal.storage.Ledger.verify`."""
    # the (ε, δ) caps checked on the rows of the snapshot verified (red team 25, ledger F3)
    rep = accountant.ledger.verify(expect_head=expect_head, cap_check=check_cap, **signed)
    with unreadable("the releases", accountant.ledger.first_unreadable):
        rels = accountant.ledger.releases()
        charges = accountant.ledger.release_charges([i for r in rels for i in r.charge_ids])
        sessions = accountant.ledger.session_reports()
    checked = skipped = 0
    for rel in rels:
        with unreadable(f"release {rel.id}"):
            res = check_release(accountant, rel, charges, sessions)
        if not res.ok:
            raise AuditFailed(
                f"release {res.release} ({res.method} on {res.dataset!r}) does not recompute: "
                + "; ".join(res.problems[:3])
            )
        checked += 1
        skipped += res.statements_not_compared
    # each release's payment recomputed by its calibrator (zcdp_parts): none left unchecked
    return AuditReport(**{**rep.model_dump(), "releases_unchecked": 0},
                       guarantees_recomputed=checked, statements_not_compared=skipped)


def sign_head(accountant: Any, private_key: Any, *, previous: Any = None,
              progress: Any = None) -> Any:
    """:meth:`privcal.storage.Ledger.sign_head` after :func:`verify` (every release's
    guarantees recomputed too): the head of the log that verified, signed (``privcal audit
    head --sign``); AuditFailed, nothing signed, if the log does not verify or does not
    contain ``previous`` (the last head signed with this key)."""
    from privcal.storage import signing

    return signing.sign_verified(partial(verify, accountant, progress=progress), private_key,
                                 previous)
