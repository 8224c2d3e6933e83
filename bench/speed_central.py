"""Speed and peak memory of the central calibrators (split, P-COQS, ExponQ) against numpy.partition.

For each n, the scores are n i.i.d. U[0, 1] float64 values. The reference is
``np.partition(scores, r - 1)[r - 1]`` with r = ⌈(n+1)(1−α)⌉, the cheapest way
to select the split-conformal order statistic in numpy; the figure of merit
is each calibrator's time divided by the reference's (target: split and P-COQS
within 3× at n = 10⁷).

Time: median wall time of ``calibrate`` over several calls (at least
``--min-repeats`` rounds, until ``--min-seconds`` of total time), in this
process, on one score array per n; the reference and the methods are called in
interleaved rounds so that load from other processes affects them alike.

Memory, measured in a fresh subprocess per (n, method) so that high-water marks
do not leak between runs: peak RSS is VmHWM from ``/proc/self/status`` (Linux;
``resource.getrusage(...).ru_maxrss`` elsewhere — on Linux it is inherited from
the parent across fork+exec, which would hide the child's own peak):

- *baseline*: peak RSS after the interpreter, numpy and the calibrator are
  imported and a tiny warm-up call has run;
- *data*: peak RSS after the score array is created (≈ baseline + 8n bytes);
- *peak*: peak RSS after one ``calibrate`` call.

``peak − baseline`` over the array's size (8n bytes) is the whole-process figure
the target refers to (≤ 3×; it includes the array itself, so 1.0 is the floor);
``peak − data`` over the array's size is the calibrator's own working memory.
At small n these ratios are dominated by allocator noise (page granularity).

Run::

    python bench/speed_central.py                   # n = 1e3 … 1e7, time and memory
    python bench/speed_central.py --max-exp 6       # up to 1e6 only
    python bench/speed_central.py --profile pcoqs   # cProfile of one call at the largest n
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import os
import platform
import pstats
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from privcal.calibrators.base import CalibrationInput, conformal_rank

ALPHA = 0.1
SEED = 12345

#: method → ("module:Class", extra parameters); "partition" is the numpy reference.
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "split": ("privcal.calibrators.split:SplitConformal", {}),
    "pcoqs": ("privcal.calibrators.pcoqs:PCOQS", {"rho": 0.1}),
    "exponq": ("privcal.calibrators.exponq:ExponQ", {"epsilon": 1.0}),
}


def make_scores(n: int) -> np.ndarray:
    """n i.i.d. U[0, 1] scores (float64), the same for every method at a given n."""
    return np.random.default_rng([SEED, n]).random(n)


def partition_select(scores: np.ndarray, alpha: float = ALPHA) -> float:
    """The reference: the r-th smallest score by np.partition (+inf when r > n)."""
    r = conformal_rank(len(scores), alpha)
    if r > len(scores):
        return float("inf")
    return float(np.partition(scores, r - 1)[r - 1])


def make_runner(method: str) -> Callable[[np.ndarray], float]:
    """A function scores → threshold for ``method``, constructing params once up front."""
    if method == "partition":
        return partition_select
    target, extra = METHODS[method]
    module, attr = target.split(":")
    cls = getattr(importlib.import_module(module), attr)
    cal = cls()
    params = cls.Params(alpha=ALPHA, **extra)
    rng = random.Random(SEED)

    def run(scores: np.ndarray) -> float:
        return float(cal.calibrate(CalibrationInput(scores=scores), params, rng).threshold)

    return run


def available(methods: list[str]) -> list[str]:
    """The methods whose modules import (the others are reported as missing)."""
    ok = []
    for m in methods:
        try:
            make_runner(m)
            ok.append(m)
        except (ImportError, AttributeError) as exc:
            print(f"# skipped {m}: {exc}", file=sys.stderr)
    return ok


def time_interleaved(
    runners: dict[str, Callable[[np.ndarray], float]],
    scores: np.ndarray,
    *,
    min_repeats: int,
    min_seconds: float,
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call of each runner, timed in interleaved rounds.

    One round calls every runner once, so a change in machine load (other
    processes on a shared box) hits the reference and the methods alike and
    the ratios stay meaningful even when the absolute times drift. CPU time
    (``time.process_time``) leaves out the time the process waited for a core.
    """
    for run in runners.values():
        run(scores)  # warm-up: first-call imports and caches are not what we measure
    wall: dict[str, list[float]] = {name: [] for name in runners}
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    rounds = 0
    while rounds < min_repeats or sum(map(sum, wall.values())) < min_seconds:
        for name, run in runners.items():
            c0, t0 = time.process_time(), time.perf_counter()
            run(scores)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        rounds += 1
        if rounds >= 200:
            break
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in runners}


def _maxrss_bytes() -> int:
    """This process's peak RSS in bytes.

    VmHWM (Linux) belongs to the address space and starts afresh at exec;
    ru_maxrss does not: Linux carries it over from the parent across
    fork+exec, so a child of a large parent would report the parent's peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    # Fallback (not Linux): KiB on most Unixes, bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def memory_child(n: int, method: str) -> dict[str, int]:
    """Run in a fresh interpreter: the three high-water marks described in the module doc."""
    run = make_runner(method)
    run(make_scores(1000))
    baseline = _maxrss_bytes()
    scores = make_scores(n)
    data = _maxrss_bytes()
    run(scores)
    peak = _maxrss_bytes()
    return {"baseline": baseline, "data": data, "peak": peak, "array": scores.nbytes}


def measure_memory(n: int, method: str) -> dict[str, int]:
    """``memory_child`` in a subprocess (its own ru_maxrss)."""
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(n), method],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def profile(method: str, n: int) -> None:
    """Print the top of a cProfile of one ``calibrate`` call at size n."""
    run = make_runner(method)
    scores = make_scores(n)
    run(scores)
    prof = cProfile.Profile()
    prof.enable()
    run(scores)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def main() -> None:
    """Parse arguments; print the time table and the memory table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-exp", type=int, default=3)
    parser.add_argument("--max-exp", type=int, default=7)
    parser.add_argument("--methods", default="split,pcoqs,exponq")
    parser.add_argument("--min-repeats", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--profile", metavar="METHOD")
    parser.add_argument("--memory-child", nargs=2, metavar=("N", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.memory_child:
        print(json.dumps(memory_child(int(args.memory_child[0]), args.memory_child[1])))
        return
    sizes = [10**e for e in range(args.min_exp, args.max_exp + 1)]
    if args.profile:
        profile(args.profile, sizes[-1])
        return

    methods = available(args.methods.split(","))
    print(
        f"α = {ALPHA}; P-COQS ρ = {METHODS['pcoqs'][1]['rho']}, ExponQ ε = "
        f"{METHODS['exponq'][1]['epsilon']}; python {platform.python_version()}, "
        f"numpy {np.__version__}; median wall time per call (ratio to partition: wall; "
        f"cpu = ratio of median process CPU times); load average {os.getloadavg()[0]:.2f}\n"
    )
    header = "| n | partition | " + " | ".join(f"{m} (× partition)" for m in methods) + " |"
    print(header)
    print("|" + "---|" * (2 + len(methods)))
    for n in sizes:
        scores = make_scores(n)
        runners = {m: make_runner(m) for m in ["partition", *methods]}
        med = time_interleaved(
            runners, scores, min_repeats=args.min_repeats, min_seconds=args.min_seconds
        )
        ref, ref_cpu = med["partition"]
        cells = [f"{ref * 1e3:.3f} ms"]
        for m in methods:
            w, c = med[m]
            cells.append(f"{w * 1e3:.3f} ms ({w / ref:.2f}×; cpu {c / ref_cpu:.2f}×)")
        print(f"| {n:.0e} | " + " | ".join(cells) + " |", flush=True)

    if args.no_memory:
        return
    print(
        "\nPeak RSS beyond the interpreter+imports baseline, in units of the score array "
        "(8n bytes): whole = (peak − baseline)/8n (includes the array; target ≤ 3), "
        "own = (peak − after-array)/8n (the method's working memory)\n"
    )
    mem_methods = ["partition", *methods]
    print("| n | array MiB | " + " | ".join(f"{m} whole / own" for m in mem_methods) + " |")
    print("|" + "---|" * (2 + len(mem_methods)))
    for n in sizes:
        cells = []
        array_mib = 8 * n / 2**20
        for m in mem_methods:
            r = measure_memory(n, m)
            whole = (r["peak"] - r["baseline"]) / r["array"]
            own = (r["peak"] - r["data"]) / r["array"]
            cells.append(f"{whole:.2f} / {own:.2f}")
        print(f"| {n:.0e} | {array_mib:.3g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
