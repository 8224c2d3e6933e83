"""What each method's coverage guarantee assumes of the data, which privcal cannot check.

Every coverage guarantee of conformal prediction rests on how the calibration points and
the test point were drawn. The marginal guarantees of split conformal, P-COQS and ExponQ
need only that they be **exchangeable**; the guarantees that hold "with probability ≥ 1−δ
over the calibration data" (LDP-CP-L, LDP-CP-S: DKW–Massart and binomial tails) and the
federated ones (FedCP-QQ, FedCP²-QQ: Humbert et al., i.i.d. scores across agents) are
proven for **i.i.d.** draws from one distribution — so agents whose populations differ
(two hospitals) are outside FedCP's guarantee. Each module's docstring gives the theorem;
this is the one place the assumption is worded for people (``calibrate``, ``release show``,
the quickstart). The recorded statement is not changed: releases recorded before keep
verifying.

A plugin states its own with a class attribute ``assumes`` (a phrase, as below); one that
does not is shown as stating none.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ASSUMES", "NOT_STATED", "data_assumption", "method_assumption",
           "release_assumption"]

#: what a plugin that states no assumption is shown as stating
NOT_STATED = "not stated by the method (a plugin)"

_EXCHANGEABLE = "the calibration points and the test point are exchangeable (i.i.d. is enough)"
_IID_USERS = "the users' (x, y) and the test point are i.i.d. draws from one distribution"
#: a local-DP release leaves out the users past their per-subject cap (a one-shot run drops
#: their rows, a session refuses their reports): its users are a sample of everyone only if
#: which users are past it does not depend on their data (red team 19, coverage F4)
_CAPPED = ("; users past their per-subject cap are left out, so whether a user is must not "
           "depend on its (x, y)")

#: built-in method → what its coverage guarantee assumes of the data
ASSUMES: dict[str, str] = {
    "split": _EXCHANGEABLE,
    "pcoqs": _EXCHANGEABLE,
    "exponq": _EXCHANGEABLE,
    "ldp-label": _IID_USERS + _CAPPED,
    "ldp-score": _IID_USERS + ", and which round a user answers does not depend on its "
                 "(x, y) (privcal draws the rounds at random when it simulates the users)"
                 + _CAPPED,
    "fedcp-qq": "every agent's scores and the test point are i.i.d. draws from one distribution "
                "(agents whose populations differ are outside the guarantee)",
    "fedcp2-qq": "every agent's scores and the test point are i.i.d. draws from one "
                 "distribution (agents whose populations differ are outside the guarantee)",
}


def data_assumption(calibrator: Any) -> str | None:
    """What ``calibrator``'s coverage guarantee assumes of the data, as a phrase; None for a
    plugin that states nothing (its own ``assumes`` attribute, if it has one, is used).
    Wrappers: levels assume what their method does; Mondrian assumes it within each group
    (the guarantee is conditional on the group)."""
    own = getattr(calibrator, "assumes", None)
    if isinstance(own, str) and own:
        return own
    inner = getattr(calibrator, "inner", None)
    if inner is not None:
        found = data_assumption(inner)
        if found is None or not getattr(calibrator, "name", "").startswith("mondrian"):
            return found
        return f"within each group, {found}"
    return ASSUMES.get(getattr(calibrator, "name", None))  # type: ignore[arg-type]


def method_assumption(method: str) -> str | None:
    """What the installed method named ``method`` (a release's ``method``, wrappers
    included) assumes of the data: :func:`data_assumption` of its calibrator,
    :data:`NOT_STATED` for a plugin that states nothing, None for a method this
    installation does not know (a plugin since uninstalled). Not stored with a release: the
    wording of the installed method, so a release recorded before keeps verifying."""
    from privcal.calibrators.registry import get
    from privcal.errors import PrivcalError

    try:
        calibrator = get(method).calibrator
    except PrivcalError:
        return None
    return data_assumption(calibrator) or NOT_STATED


def release_assumption(method: str, diagnostics: Any = None) -> str | None:
    """:func:`method_assumption` of a release, with what its own run adds. A local-DP
    method's assumption says that users past their per-subject cap are left out and that
    whether a user is must not depend on its (x, y) (red team 19, coverage F4: a cap spent by
    an earlier study of the high-risk users left them out, and a release recorded ≥ 0.9
    covered 0.65) — privcal cannot check it; a one-shot run that did leave rows out
    (``diagnostics["dropped_rows"]["subject_over_cap"]``) says how many."""
    base = method_assumption(method)
    dropped = diagnostics.get("dropped_rows") if isinstance(diagnostics, dict) else None
    over = dropped.get("subject_over_cap") if isinstance(dropped, dict) else None
    if base is None or not isinstance(over, int) or over <= 0:
        return base
    return (f"{base} — here {over} row{'s' if over != 1 else ''} of users whose cap earlier "
            "runs had spent were left out (after a study of a chosen group of users, the "
            "kept ones are not a sample of everyone)")
