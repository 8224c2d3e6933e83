"""A released threshold against what its own release records (red team 16, F6).

Some methods' thresholds are a function of public quantities their release records:

- P-COQS releases ``right``, the right end of the binary search's final interval
  (``diagnostics.interval``), when a noisy count backed it (``backed``), else +∞; +∞ with
  no interval when the target rank exceeds n. The interval itself is a cell of the public
  dyadic grid the N bisection steps of [lower, upper] make (one cell per path), and the
  search's N, τ and target rank are recomputed from the parameters and n.
- ExponQ releases the grid point ``grid(lower, upper, bins)[bin]`` (+∞ for the top point,
  and when q̃ ≥ 1); bins, γ and q̃ are recomputed from the parameters and n.
- FedCP²-QQ releases the k-th smallest of the agents' messages (recorded, sorted; missing
  agents counted as +∞), or +∞ when that is the top of the grid.
- LDP-CP-S (ldp-score) releases the query of the round that stopped in the band, else the
  last query a round lowered ``hi`` to, else +∞ (``diagnostics.history``'s decisions), and
  +∞ whenever no round can clear its cut-off; LDP-CP-L (ldp-label) releases +∞ when its
  target 1−α+Δ_L (``calibration_target``, recomputed) exceeds 1; both record ``trivial``
  exactly when the threshold is +∞ (red team 21, readme F1: an edited threshold of 0.05
  loaded under a +∞ release's record).

A saved release (:func:`privcal.accountant.saved_release.consistency_problems`) whose
threshold was edited alone contradicts them, and is refused. A file whose threshold *and*
diagnostics were edited together (another bin, another cell) stays consistent: a copy is
not checked against its ledger (compare it with ``acct.release(id)``).

:func:`threshold_problems` dispatches on the calibrator: a calibrator (a plugin's) with a
``check_threshold(params, shape, threshold, diagnostics)`` method is asked; privcal's own are
in :data:`CHECKS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from privcal.calibrators.mechanisms.exponential import grid

__all__ = ["CHECKS", "threshold_problems"]


def _num(x: Any) -> float | None:
    """A recorded number (a float, an int, or ``"inf"``) as a float; None if it is not one."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return float(x)
    if x in ("inf", "Infinity"):
        return math.inf
    return None


def _recorded(diag: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """``diagnostics.KEY: recorded …, recomputed …`` for each of ``want`` recorded otherwise."""
    out = []
    for key, value in want.items():
        got = diag.get(key)
        if _num(got) is None or _num(got) != _num(value):
            out.append(f"diagnostics.{key}: recorded {got!r:.60}, recomputed {value!r:.60}")
    return out


def pcoqs(cal: Any, params: Any, shape: Any, threshold: float,
          diag: dict[str, Any]) -> list[str]:
    """P-COQS (module docstring)."""
    n_steps, tau, rank = cal._plan(params, shape.n)
    out = _recorded(diag, {"N": n_steps, "tau": tau, "target_rank": rank})
    if out:
        return out
    iv = diag.get("interval")
    if rank > shape.n:
        if threshold != math.inf or iv is not None:
            return [f"threshold {threshold} (interval {iv!r:.80}): the target rank {rank} "
                    f"exceeds n = {shape.n}, so the threshold is +inf"]
        return []
    if not (isinstance(iv, list) and len(iv) == 2 and all(
            _num(v) is not None and math.isfinite(_num(v)) for v in iv)):  # type: ignore[arg-type]
        return [f"diagnostics.interval: {iv!r:.80} is not the search's final [left, right]"]
    left, right = float(iv[0]), float(iv[1])
    if not _reachable(float(params.lower), float(params.upper), n_steps, left, right):
        return [f"diagnostics.interval: {iv!r:.80} is not a cell of the search's grid on "
                f"[{params.lower}, {params.upper}] ({n_steps} steps)"]
    upper = float(params.upper)
    backed = diag.get("backed", right < upper)
    if not isinstance(backed, bool) or (not backed and right != upper) or (
            backed and right > upper):
        return [f"diagnostics.backed: {backed!r:.20} contradicts diagnostics.interval {iv!r:.80}"]
    want = right if backed else math.inf
    if threshold != want:
        return [f"threshold {threshold} is not the one diagnostics.interval {iv!r:.80} "
                f"records ({want}: its right end" + ("" if backed else ", unbacked: +inf") + ")"]
    return []


def _reachable(lower: float, upper: float, n_steps: int, left: float, right: float) -> bool:
    """Whether P-COQS's search (``mid = (left + right) / 2``, then ``left = mid`` or ``right
    = mid``, ``n_steps`` times, in floats) can end at [left, right]. Once the interval is
    narrower than a float step, mid rounds to an end and the interval stops shrinking or
    collapses to a point, so the end is not always a dyadic cell (rev R1: thresholds above
    ~2.3e5 at the default tol were refused): every state that can still reach the end is
    followed (left only grows, right only shrinks), at most two of them."""
    states = {(lower, upper)}
    for _ in range(n_steps):
        step = set()
        for lo, hi in states:
            mid = (lo + hi) / 2
            if mid >= right:
                step.add((lo, mid))
            if mid <= left:
                step.add((mid, hi))
        if not step or len(step) > 8:
            return False
        states = step
    return (left, right) in states


def exponq(cal: Any, params: Any, shape: Any, threshold: float,
           diag: dict[str, Any]) -> list[str]:
    """ExponQ (module docstring)."""
    m, gamma, q = cal.plan(params, shape.n)
    out = _recorded(diag, {"bins": m, "gamma": gamma, "q_tilde": q})
    if out:
        return out
    if q >= 1:
        return [] if threshold == math.inf else [
            f"threshold {threshold}: q̃ ≥ 1 for n = {shape.n}, so the threshold is +inf"]
    j = diag.get("bin")
    if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < m:
        return [f"diagnostics.bin: {j!r:.40} is not a grid index 0 … {m - 1}"]
    top = j == m - 1
    if diag.get("top_bin") is not top:
        return [f"diagnostics.top_bin: {diag.get('top_bin')!r:.20} contradicts diagnostics.bin "
                f"{j} of {m}"]
    want = math.inf if top else float(grid(float(params.lower), float(params.upper), m)[j])
    if threshold != want:
        return [f"threshold {threshold} is not grid point {j} of diagnostics.bins = {m} on "
                f"[{params.lower}, {params.upper}] ({want})"]
    return []


def fedcp2_qq(cal: Any, params: Any, shape: Any, threshold: float,
              diag: dict[str, Any]) -> list[str]:
    """FedCP²-QQ (module docstring)."""
    msgs, m = diag.get("messages"), diag.get("m")
    k = diag.get("k_gamma", diag.get("k"))
    if not isinstance(msgs, list) or not all(_num(v) is not None for v in msgs) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in (m, k)):
        return ["diagnostics: not the messages, m and k the threshold is aggregated from"]
    values = sorted(_num(v) for v in msgs)  # type: ignore[type-var]
    values += [math.inf] * (m - len(values))  # missing agents, counted as +inf
    if len(values) != m or k > m:
        return [f"diagnostics.messages: {len(msgs)} messages, for m = {m} agents, k = {k}"]
    q = values[k - 1]
    if threshold != q and threshold != math.inf:
        return [f"threshold {threshold} is not the k = {k}-th smallest of "
                f"diagnostics.messages ({q}), nor +inf"]
    return []


def _trivial(threshold: float, diag: dict[str, Any]) -> list[str]:
    if diag.get("trivial") is not math.isinf(threshold):
        return [f"diagnostics.trivial: {diag.get('trivial')!r:.20} contradicts the threshold "
                f"{threshold}"]
    return []


def ldp_score(cal: Any, params: Any, shape: Any, threshold: float,
              diag: dict[str, Any]) -> list[str]:
    """LDP-CP-S (module docstring)."""
    if cal.only_infinite(params, shape) and threshold != math.inf:
        return [f"threshold {threshold}: no round can clear its cut-off for n = {shape.n}, so "
                "the threshold is +inf"]
    hist, want = diag.get("history"), math.inf
    if not isinstance(hist, list) or not all(isinstance(r, dict) for r in hist):
        return ["diagnostics.history: not the rounds' records"]
    for r in hist:
        q, decision = _num(r.get("query")), r.get("decision")
        if q is None or decision not in ("lower", "raise", "stop"):
            return [f"diagnostics.history: round {r.get('round')!r:.20} is not a round record"]
        if decision != "raise":
            want = q  # "lower": hi = q, released if no later round does better; "stop": q
        if decision == "stop":
            break
    if threshold != want:
        return [f"threshold {threshold} is not the one diagnostics.history releases ({want})"]
    return _trivial(threshold, diag)


def ldp_label(cal: Any, params: Any, shape: Any, threshold: float,
              diag: dict[str, Any]) -> list[str]:
    """LDP-CP-L (module docstring)."""
    from privcal.calibrators.ldp_label import label_slack, target_level

    sl = label_slack(shape.n, cal._k(params, shape), params.epsilon,
                     params.failure_probability, params.bound)
    target = target_level(params, sl)
    out = _recorded(diag, {"calibration_target": target})
    if out:
        return out
    if target > 1 and threshold != math.inf:
        return [f"threshold {threshold}: the target {target} exceeds 1 for n = {shape.n}, so "
                "the threshold is +inf"]
    return _trivial(threshold, diag)


def _wrapped(cal: Any, inner: Any, params: Any, shape: Any,
             diagnostics: dict[str, Any]) -> list[str]:
    """:func:`threshold_problems` of every level's raw threshold (levels) or every group's
    (Mondrian) against that run's diagnostics; the wrapper's ``check_record`` checks how they
    make the release's threshold."""
    from privcal.calibrators.base import DataShape
    from privcal.calibrators.group_sets import _float

    out: list[str] = []
    if isinstance(diagnostics.get("levels"), list) and hasattr(params, "per_level"):
        for (a, p), lv in zip(params.per_level(), diagnostics["levels"], strict=False):
            out += [f"level α = {a}: {m}" for m in threshold_problems(
                inner, p, shape, _float(lv.get("threshold_raw")), lv.get("diagnostics") or {})]
    elif isinstance(diagnostics.get("groups"), list) and hasattr(params, "inner_params"):
        p = params.inner_params()
        for g in diagnostics["groups"]:
            n = g.get("n")
            if not isinstance(n, int) or cal._group_guarantee(p, n, shape.k) is None:
                continue  # too few points: +inf, the wrapper's check_record
            out += [f"group {g.get('group')}: {m}" for m in threshold_problems(
                inner, p, DataShape(n=n, k=shape.k), _float(g.get("threshold")),
                g.get("diagnostics") or {})]
    return out


#: privcal's own methods whose threshold is a function of what their release records
CHECKS: dict[str, Callable[[Any, Any, Any, float, dict[str, Any]], list[str]]] = {
    "pcoqs": pcoqs, "exponq": exponq, "fedcp2-qq": fedcp2_qq, "ldp-score": ldp_score,
    "ldp-label": ldp_label,
}


def threshold_problems(cal: Any, params: Any, shape: Any, threshold: float,
                       diagnostics: dict[str, Any]) -> list[str]:
    """Why ``threshold`` is not the one release diagnostics ``diagnostics`` of calibrator
    ``cal`` (with ``params`` and ``shape``, as recorded) record; [] if it is, or if the
    method's threshold is not a function of what it records (split)."""
    own = getattr(cal, "check_threshold", None)
    if callable(own):
        return list(own(params, shape, threshold, diagnostics))
    inner = getattr(cal, "inner", None)
    if inner is not None:  # a levels or Mondrian wrapper: each inner run's own record
        return _wrapped(cal, inner, params, shape, diagnostics)
    check = CHECKS.get(getattr(cal, "name", ""))
    if check is None or type(cal).__module__.split(".")[0] != "privcal":
        return []
    return check(cal, params, shape, threshold, diagnostics)
