"""The privacy record of a release: what was charged and the guarantee it gives, in words.

One function, :func:`privacy_record`, used where a release is recorded (a calibration run,
a collection session) and where it is recomputed (:mod:`privcal.accountant.verification`),
so the recorded and the recomputed record come from the same code. zCDP is stated as
(ε, δ)-DP at the dataset's reporting δ by CKS20 (Canonne, Kamath & Steinke 2020,
Prop. 12 / Cor. 13; :func:`privcal.accountant.privacy.conversions.cks20_epsilon`).
"""

from __future__ import annotations

from typing import Any

from privcal.accountant import privacy as acc
from privcal.accountant.normalize import AnyCost, cost_json, json_safe
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP

__all__ = ["GENERIC_LOCAL", "LEGACY_LOCAL_RULE", "LOCAL_RULE", "is_legacy_local", "privacy_record"]


#: whom a shuffled release's amplified (ε, δ) protects against (red team 5): the reports
#: reach privcal with their subjects (to charge each subject once and keep one report per
#: subject; a session's ledger keeps them under pseudonyms), so the holder of the reports
#: and their subjects sees ε0-local-DP reports, not a shuffle
AMPLIFIED_FOR = ("whoever sees the releases but not the reports with their subjects (the "
                 "ledger keeps a session's reports under pseudonyms, to charge each subject "
                 "once: to its holder each report is ε0-local DP)")

#: what a shuffled release's amplification assumes of the other reports (red team 6): a
#: subject hides among the round's other randomized reports, so a report that is not its
#: subject's randomizer output, or that the adversary knows, hides nobody; privcal cannot
#: check this, so the statement says it (recorded since ldp-score version 3, whose older
#: releases' statements ``privcal audit verify`` counts as not compared)
AMPLIFICATION_ASSUMES = ("provided the round's other reports are their subjects' randomizer "
                         "outputs, unknown to the adversary (no colluding or Byzantine "
                         "participants)")


#: what a local-DP release is charged: ε0 per participating subject (an agent, for a
#: federated method), against the dataset's per-subject cap; what that ε0 protects is the
#: statement's to say (the calibrator's ``local_statement``)
LOCAL_RULE = "ε0 charged to each participating subject or agent, against its per-subject cap"
#: the rule every local release recorded before red team 7, which also claimed "ε0-local DP"
#: of every subject (false for LDP-CP-L's features and FedCP²-QQ's agents): its marker
LEGACY_LOCAL_RULE = "ε0-local DP for each participating subject"
#: the statement of a local-DP release whose calibrator does not say what its ε0 protects
GENERIC_LOCAL = "{eps}-local DP for each participating subject"


def is_legacy_local(recorded: Any) -> bool:
    """Whether a recorded privacy record is a local release's as written before its
    calibrator said what its ε0 protects (its rule is :data:`LEGACY_LOCAL_RULE`)."""
    return (isinstance(recorded, dict) and recorded.get("model") == "local"
            and recorded.get("rule") == LEGACY_LOCAL_RULE)


def privacy_record(cost: AnyCost | None, ds: Any, extra: dict[str, Any] | None,
                   calibrator: Any = None, *, legacy_wording: bool = False,
                   legacy_local: bool = False) -> dict[str, Any]:
    """The privacy record of a release; a non-private calibrator may say what it reveals
    (its ``privacy_statement``, e.g. FedCP-QQ's one order statistic per agent), a local-DP
    one what its ε0 protects (its ``local_statement``, a format string of ``eps``; else the
    generic "ε0-local DP for each participating subject"). ``ds``: the dataset — a
    :class:`~privcal.accountant.results.DatasetInfo`, or anything with its
    ``reporting_delta`` (a saved release's load check states one; typed ``Any`` so that
    this module does not import the results module, which loads saved releases).

    A shuffled release's record names whom its amplified (ε, δ) protects against
    (``amplified_for``, :data:`AMPLIFIED_FOR`), and its statement what the amplification
    assumes of the other reports (:data:`AMPLIFICATION_ASSUMES`); ``legacy_wording``: the
    statement as recorded before ``amplified_for`` existed ("for the aggregator"), for
    :mod:`privcal.accountant.verification` to recompute such a record as it was;
    ``legacy_local``: a local release's rule as recorded before its calibrator said what
    its ε0 protects (:func:`is_legacy_local`; its statement, older wording, is counted as
    not compared, not recomputed as it was)."""
    out: dict[str, Any] = {"cost": cost_json(cost) if cost is not None else None}
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
        # what the ε0 protects is the calibrator's to say (red team 7): LDP-CP-L randomizes
        # the label only, and a FedCP²-QQ agent's message is ε-DP per record of its data,
        # not a local randomizer of its whole input; the rule (what is charged) is the same
        local = getattr(calibrator, "local_statement", None) or GENERIC_LOCAL
        out.update(model="local", epsilon=e, delta="0",
                   rule=LEGACY_LOCAL_RULE if legacy_local else LOCAL_RULE,
                   statement=local.format(eps=e))
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
                heuristic = (f"(the paper's ε0/√n = {amp['heuristic_eps0_over_sqrt_n']:.4g} "
                             "is a heuristic, not a guarantee)")
                if legacy_wording:
                    out["statement"] += (
                        f"; shuffled: ({amp['eps']}, {amp['delta']})-DP for the aggregator "
                        f"{extra.get('scope', '')} by the {amp['bound']} bound {heuristic}")
                else:
                    out["statement"] += (
                        f"; shuffled: ({amp['eps']}, {amp['delta']})-DP "
                        f"{extra.get('scope', '')} by the {amp['bound']} bound {heuristic}, "
                        f"for {AMPLIFIED_FOR}, {AMPLIFICATION_ASSUMES}")
                    out["amplified_for"] = AMPLIFIED_FOR
            else:
                out["statement"] += ("; shuffled, but no amplification bound applies at "
                                     "this n and δ: the central guarantee stays ε0")
    return out
