"""Start-up time of CLI commands and the device client, as ratios to importing SQLAlchemy
(and, for ``privcal --help``, issue 15's reference ``python -c "import click, sqlalchemy"``).

    python bench/startup_bench.py [--rounds 7]

Each command runs in a fresh interpreter (an embedded ledger in a temporary
``PRIVCAL_HOME`` with one pure-ε and one zCDP dataset); rounds alternate over the
commands and each figure is the best round. References: ``python -c pass`` and
``python -c "import sqlalchemy"``.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    py = sys.executable
    cli = [py, "-c", "from privcal.cli import main; main()"]
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "PRIVCAL_HOME": home}
        env.pop("PRIVCAL_DATABASE_URL", None)
        subprocess.run([*cli, "dataset", "create", "p", "--epsilon", "1"], env=env, check=True,
                       capture_output=True)
        subprocess.run([*cli, "dataset", "create", "z", "--rho", "1"], env=env, check=True,
                       capture_output=True)
        cases = {
            "python -c pass": [py, "-c", "pass"],
            'python -c "import sqlalchemy"': [py, "-c", "import sqlalchemy"],
            'python -c "import click, sqlalchemy"': [py, "-c", "import click, sqlalchemy"],
            "privcal --help": [*cli, "--help"],
            "privcal dataset list": [*cli, "dataset", "list"],
            "privcal release list": [*cli, "release", "list"],
            "privcal budget show p (pure ε)": [*cli, "budget", "show", "p"],
            "privcal budget show z (zCDP: CKS20, no SciPy)": [*cli, "budget", "show", "z"],
            "privcal amplify --epsilon0 1 --n 10000 --delta 1e-6":
                [*cli, "amplify", "--epsilon0", "1", "--n", "10000", "--delta", "1e-6"],
            "privcal fed plan --agents 100 --local-n 1000 --alpha 0.1":
                [*cli, "fed", "plan", "--agents", "100", "--local-n", "1000", "--alpha", "0.1"],
            "import privcal.client; privcal.client.krr": [
                py, "-c", "import privcal.client as c; c.krr"],
        }
        best = dict.fromkeys(cases, math.inf)
        for _ in range(args.rounds):
            for name, cmd in cases.items():
                t = time.perf_counter()
                subprocess.run(cmd, env=env, check=True, capture_output=True)
                best[name] = min(best[name], time.perf_counter() - t)
    ref = best['python -c "import sqlalchemy"']
    ref2 = best['python -c "import click, sqlalchemy"']
    print(f"# best of {args.rounds} alternating rounds; load average {os.getloadavg()[0]:.1f}")
    print("| command | wall | × import sqlalchemy | × import click, sqlalchemy |")
    print("|---|---|---|---|")
    for name, t in best.items():
        print(f"| `{name}` | {1000 * t:.0f} ms | {t / ref:.2f} | {t / ref2:.2f} |")
    # issue 15: `privcal --help` within 2× `python -c "import click, sqlalchemy"`
    print(f"\nprivcal --help / import click, sqlalchemy = {best['privcal --help'] / ref2:.2f} "
          "(target ≤ 2)")


if __name__ == "__main__":
    main()
