"""Red team 24, federated and local-DP flows (fedlocal).

F2: the CLI printed an LDP-CP-S round's query with 12 significant digits (``session open``'s
``round 0 query``, ``session submit``'s next query, ``session status``) and ``fed plan`` the
agents' level q with 6 and the grid's ends with ``:g``. Devices run from the README's CLI tour
answer the printed query: on [0, 0.3] round 1's query 0.22499999999999998 was printed 0.225,
the bits counted the scores at 0.225 (15 % of them), and the release — threshold
0.22499999999999998, which excludes them — recorded coverage ≥ 0.9 for a true 0.80. Every
protocol number is now printed as the shortest decimal that reads back as the same float.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.cli_env import CliEnv


def _submit(env: CliEnv, path: Path, round_: int, bits: list[int], prefix: str) -> str:
    path.write_text("subject,bit,round\n" + "".join(
        f"{prefix}{i},{b},{round_}\n" for i, b in enumerate(bits)))
    res = env.run("session", "submit", "1", "--reports", str(path))
    assert res.exit_code == 0, res.output
    return res.stdout


def test_cli_prints_each_rounds_query_exactly(ledger_url: str, tmp_path: Path) -> None:
    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    assert env.run("dataset", "create", "--dataset", "u", "--epsilon", "1",
                   "--subject-epsilon", "8").exit_code == 0
    res = env.run("session", "open", "ldp-score", "--dataset", "u", "--alpha", "0.1",
                  "--epsilon", "6", "--rounds", "3", "--group-size", "4", "--lower", "0",
                  "--upper", "0.3")
    assert res.exit_code == 0, res.output
    printed = re.search(r"round 0 query: q = (\S+)", res.stdout)
    assert printed is not None and float(printed.group(1)) == 0.15
    # round 0 raises (no 1-report can pass): round 1 asks (0.15 + 0.3) / 2
    out = _submit(env, tmp_path / "r0.csv", 0, [0, 0, 0, 0], "a")
    query = env.json("session", "status", "1")["query"]
    assert query == (0.15 + 0.3) / 2 == 0.22499999999999998
    printed = re.search(r"query q = (\S+)", out)
    assert printed is not None and float(printed.group(1)) == query, out  # was 0.225
    status = env.run("session", "status", "1").stdout
    row = re.search(r"current query q\s+(\S+)", status)
    assert row is not None and float(row.group(1)) == query, status
    lo_hi = re.search(r"interval \[lo, hi\]\s+\[(\S+), (\S+)\]", status)
    assert lo_hi is not None and (float(lo_hi.group(1)), float(lo_hi.group(2))) == (0.15, 0.3)


def test_fed_plan_and_status_print_the_agents_level_and_grid_exactly(
        ledger_url: str, tmp_path: Path) -> None:
    env = CliEnv(ledger_url, tmp_path)
    args = ("--agents", "5", "--local-n", "1999", "--alpha", "0.1", "--epsilon", "4",
            "--upper", "1.00000001")
    plan = env.json("fed", "plan", *args)
    assert plan["q"] == 0.9014507253626813
    out = env.run("fed", "plan", *args).stdout
    q = re.search(r"agent level q\s+(\S+)", out)
    assert q is not None and float(q.group(1)) == plan["q"], out  # was 0.901451
    grid = re.search(r"grid\s+100 points on \[(\S+), (\S+)\]", out)
    assert grid is not None and float(grid.group(2)) == 1.00000001, out  # was 1
    assert env.run("db", "upgrade").exit_code == 0
    assert env.run("dataset", "create", "--dataset", "h", "--epsilon", "1",
                   "--subject-epsilon", "8").exit_code == 0
    res = env.run("session", "open", "fedcp2-qq", "--dataset", "h", *args)
    assert res.exit_code == 0, res.output
    q = re.search(r"agents answer at level q\s+(\S+)", res.stdout)
    assert q is not None and float(q.group(1)) == plan["q"], res.stdout
