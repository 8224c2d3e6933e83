"""Speed of the amplification-by-shuffling bounds (issue 4, SHUFFLE.md).

Times each numerical bound as ``privcal amplify`` runs it (plan, search for ε,
certification at the rounded-up ε):

- clone bounds (generic clone, stronger clone) at n = 10⁶ and 10⁷;
- the blanket of k-RR at n = 10⁶ for k ∈ {2, 10, 100} (k = 2 has no blanket, it
  needs k ≥ 3: binary RR's blanket *is* the stronger clone, which is timed instead);

over ε0 ∈ {0.5, 1, 2, 4, 8} and δ ∈ {1e−6, 1e−8}, then the whole ``amplify`` call
for k-RR, k = 10 at n = 10⁶ (all four bounds). Targets: clone ≤ 1 s at 10⁶,
≤ 3 s at 10⁷; blanket ≤ 10 s at 10⁶.

    python bench/shuffle_speed.py            # prints a Markdown table and a summary
"""

from __future__ import annotations

import math
import platform
import sys
import time
from collections.abc import Callable

from privcal.accountant.privacy import shuffle_bounds as sb
from privcal.accountant.privacy.shuffle import amplify

EPS0 = (0.5, 1.0, 2.0, 4.0, 8.0)
DELTAS = (1e-6, 1e-8)


def timed_bound(make_plan: Callable[[], sb.PairPlan], eps0: float, delta: float
                ) -> tuple[float, float, int, int]:
    """(ε, seconds, δ(ε) evaluations, plan size) for one bound, search and certification."""
    calls = 0
    t0 = time.perf_counter()
    plan = make_plan()

    def fn(x: float) -> float:
        nonlocal calls
        calls += 1
        return sb.pair_delta(x, plan)

    found = sb.solve_eps(fn, eps0, delta)
    eps = found[0] if found else eps0
    fn(math.nextafter(eps, math.inf))  # the certification amplify() does
    return eps, time.perf_counter() - t0, calls, plan.size


def main() -> None:
    rows: list[tuple[str, int, float, float, str, float, float, int, int]] = []
    for n in (10**6, 10**7):
        for eps0 in EPS0:
            for delta in DELTAS:
                tau = sb.truncation_tau(delta)
                for name, stronger in (("clone", False), ("stronger-clone", True)):
                    eps, sec, calls, size = timed_bound(
                        lambda n=n, e=eps0, t=tau, s=stronger: sb.clone_plan(e, n, t, stronger=s),
                        eps0, delta)
                    rows.append(("clone", n, eps0, delta, name, eps, sec, calls, size))
    n = 10**6
    for k in (2, 10, 100):
        for eps0 in EPS0:
            for delta in DELTAS:
                tau = sb.truncation_tau(delta)
                if k == 2:
                    def make(e: float = eps0, t: float = tau) -> sb.PairPlan:
                        return sb.clone_plan(e, n, t, stronger=True)
                    name = "stronger-clone (k=2: no blanket)"
                else:
                    def make(e: float = eps0, t: float = tau, kk: int = k) -> sb.PairPlan:
                        return sb.blanket_plan(e, n, kk, t)
                    name = f"blanket k={k}"
                eps, sec, calls, size = timed_bound(make, eps0, delta)
                rows.append(("blanket", n, eps0, delta, name, eps, sec, calls, size))

    print(f"Python {platform.python_version()} on {platform.machine()}, {sys.platform}")
    print()
    print("| group | n | ε0 | δ | bound | ε | seconds | δ(ε) evals | C points |")
    print("|---|---|---|---|---|---|---|---|---|")
    for group, n_, eps0, delta, name, eps, sec, calls, size in rows:
        print(f"| {group} | {n_:.0e} | {eps0:g} | {delta:g} | {name} | {eps:.4g} | "
              f"{sec:.3f} | {calls} | {size} |")
    print()
    for label, pred, target in (
        ("clone bounds, n = 1e6", lambda r: r[0] == "clone" and r[1] == 10**6, 1.0),
        ("clone bounds, n = 1e7", lambda r: r[0] == "clone" and r[1] == 10**7, 3.0),
        ("blanket k ∈ {10, 100}, n = 1e6",
         lambda r: r[0] == "blanket" and r[4].startswith("blanket"), 10.0),
        ("k = 2 (stronger clone), n = 1e6",
         lambda r: r[0] == "blanket" and r[4].startswith("stronger"), 1.0),
    ):
        worst = max(r[6] for r in rows if pred(r))
        print(f"- {label}: max {worst:.3f} s (target ≤ {target:g} s)")
    for delta in DELTAS:
        t0 = time.perf_counter()
        res = amplify(8.0, 10**6, delta, "krr", 10)
        print(f"- whole `amplify(8, 1e6, {delta:g}, krr, k=10)` (4 bounds): "
              f"{time.perf_counter() - t0:.3f} s → ε = {res.eps:.6g} ({res.bound})")


if __name__ == "__main__":
    main()
