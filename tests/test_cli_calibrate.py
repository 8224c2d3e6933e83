"""``privcal calibrate / predict / evaluate / methods`` end to end, through the real CLI.

Every flow runs on a freshly upgraded ledger on SQLite and on PostgreSQL (the
``ledger_url`` fixture); one test runs the installed ``privcal`` executable in a
subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from privcal.cli import main

BUILTINS = {
    "split": "none (non-private)",
    "pcoqs": "central zCDP",
    "exponq": "central pure DP",
    "ldp-label": "local DP",
    "ldp-score": "local DP",
    "fedcp-qq": "federated",
    "fedcp2-qq": "federated",
}


@dataclass
class Env:
    url: str
    dir: Path

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["--db-url", self.url, *args], catch_exceptions=False)

    def ok(self, *args: str) -> Result:
        res = self.run(*args)
        assert res.exit_code == 0, (args, res.stdout, res.stderr)
        return res

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json").stdout)

    def f(self, name: str) -> str:
        return str(self.dir / name)

    def state(self) -> tuple[Any, ...]:
        """What must not change when a command is refused or a dry run."""
        head = self.json("audit", "head")["head"]
        rels = len(self.json("release", "list"))
        budgets = tuple(
            (b["charges"], json.dumps(b["spent"], sort_keys=True))
            for b in (self.json("budget", "show", d) for d in ("open", "closed"))
        )
        return head, rels, budgets


def _write_inputs(d: Path) -> None:
    rng = np.random.default_rng(7)
    n, k = 1000, 3
    s = rng.beta(2, 5, n)
    np.save(d / "s.npy", s)
    np.savetxt(d / "s.csv", s, delimiter=",", header="score", comments="")
    probs = rng.dirichlet(np.ones(k) * 2, n)
    labels = rng.integers(0, k, n)
    np.save(d / "p.npy", probs)
    np.save(d / "y.npy", labels)
    np.savez(d / "calib.npz", probs=probs, labels=labels, scores=s)
    np.save(d / "agents.npy", np.repeat(np.arange(10), n // 10))
    (d / "ids.csv").write_text("subject\n" + "".join(f"user-{i}\n" for i in range(n)))
    (d / "s.parquet").write_bytes(b"PAR1")


@pytest.fixture
def env(ledger_url: str, tmp_path: Path) -> Env:
    e = Env(ledger_url, tmp_path)
    res = e.ok("db", "upgrade")
    assert "revision" in res.stdout
    e.ok("dataset", "create", "open", "--rho", "50", "--subject-epsilon", "100",
         "--allow-nonprivate")  # fmt: skip
    e.ok("dataset", "create", "closed", "--rho", "1")
    _write_inputs(tmp_path)
    return e


# --------------------------------------------------------------------------- calibrate
METHOD_ARGS: dict[str, list[str]] = {
    "pcoqs": ["--rho", "0.5", "--scores", "s.npy"],
    "exponq": ["--epsilon", "1", "--scores", "s.npy"],
    "split": ["--scores", "s.npy"],
    "ldp-label": ["--epsilon", "2", "--k", "3", "--probs", "p.npy", "--labels", "y.npy",
                  "--subjects", "ids.csv"],
    "ldp-score": ["--epsilon", "2", "--simulate", "--scores", "s.npy", "--subjects", "ids.csv"],
    "fedcp-qq": ["--scores", "s.npy", "--agent-of", "agents.npy"],
    "fedcp2-qq": ["--epsilon", "8", "--scores", "s.npy", "--agent-of", "agents.npy"],
}
FILE_OPTS = {"--scores", "--probs", "--labels", "--agent-of", "--subjects"}


def _args(env: Env, items: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(items):
        out.append(env.f(a) if i and items[i - 1] in FILE_OPTS else a)
    return out


@pytest.mark.parametrize("method", list(METHOD_ARGS))
def test_calibrate_every_method_json(env: Env, method: str) -> None:
    before_rels = len(env.json("release", "list"))
    doc = env.json("calibrate", method, "--dataset", "open", "--alpha", "0.1",
                   *_args(env, METHOD_ARGS[method]))  # fmt: skip
    rel, budget = doc["release"], doc["budget"]
    assert set(doc) == {"release", "budget"}
    assert rel["method"] == method and rel["dataset"] == "open"
    thr = rel["threshold"]
    assert thr == "Infinity" or isinstance(thr, float)
    cov = rel["coverage"]
    assert cov["target"] == pytest.approx(0.9)
    assert 0 < cov["lower"] <= 1 and cov["statement"]
    priv = rel["privacy"]
    assert priv["statement"]
    assert {"epsilon", "delta"} <= set(priv) or priv["model"] == "none"
    assert budget["dataset"] == "open" and "remaining" in budget
    assert len(env.json("release", "list")) == before_rels + 1


def test_calibrate_json_privacy_at_dataset_delta(env: Env) -> None:
    doc = env.json("calibrate", "pcoqs", "--dataset", "open", "--alpha", "0.1", "--rho", "0.5",
                   "--scores", env.f("s.npy"))  # fmt: skip
    priv = doc["release"]["privacy"]
    assert priv["cost"] == {"kind": "zcdp", "rho": "0.5"}
    assert priv["delta"] == "0.000001"  # the dataset's reporting δ (default 1e-6)
    assert float(priv["epsilon"]) > 0
    assert doc["budget"]["remaining"] == {"rho": "49.5"}
    rel = doc["release"]
    assert isinstance(rel["threshold"], float)  # n = 1000, ρ = 0.5: a finite threshold
    assert rel["coverage"]["lower"] == pytest.approx(0.9)
    assert rel["coverage"]["failure_probability"] == pytest.approx(0.05)
    assert rel["shape"]["n"] == 1000


def test_calibrate_human_output(env: Env) -> None:
    res = env.ok("calibrate", "exponq", "--dataset", "open", "--alpha", "0.1", "--epsilon", "1",
                 "--scores", env.f("s.npy"))  # fmt: skip
    out = res.stdout.lower()
    for word in ("threshold", "coverage guarantee", "privacy", "budget left", "1-dp"):
        assert word in out, word


@pytest.mark.parametrize(
    "inputs",
    [
        ["--scores", "s.npy"],
        ["--scores", "s.csv:score"],
        ["--scores", "calib.npz:scores"],
        ["--probs", "p.npy", "--labels", "y.npy", "--score", "lac"],
        ["--probs", "calib.npz:probs", "--labels", "calib.npz:labels", "--score", "aps"],
        ["--probs", "p.npy", "--labels", "y.npy", "--score", "raps"],
    ],
)
def test_calibrate_input_formats(env: Env, inputs: list[str]) -> None:
    doc = env.json("calibrate", "exponq", "--dataset", "open", "--alpha", "0.1", "--epsilon", "1",
                   *_args(env, inputs))  # fmt: skip
    rel = doc["release"]
    assert rel["shape"]["n"] == 1000
    if "--score" in inputs:
        assert rel["diagnostics"]["score"]["name"] == inputs[-1]


def test_csv_and_npy_scores_give_the_same_split_threshold(env: Env) -> None:
    a = env.json("calibrate", "split", "--dataset", "open", "--alpha", "0.1",
                 "--scores", env.f("s.npy"))["release"]["threshold"]  # fmt: skip
    b = env.json("calibrate", "split", "--dataset", "open", "--alpha", "0.1",
                 "--scores", env.f("s.csv") + ":score")["release"]["threshold"]  # fmt: skip
    s = np.sort(np.load(env.f("s.npy")))
    assert a == pytest.approx(b, rel=1e-12)
    assert a == s[int(np.ceil(1001 * 0.9)) - 1]  # the ⌈(n+1)(1−α)⌉-th smallest


def test_dry_run_writes_nothing(env: Env) -> None:
    before = env.state()
    res = env.ok("calibrate", "pcoqs", "--dataset", "closed", "--alpha", "0.1", "--rho", "0.3",
                 "--scores", env.f("s.npy"), "--dry-run")  # fmt: skip
    assert "rho=0.3" in res.stdout and "rho=1 now" in res.stdout and "rho=0.7 after" in res.stdout
    doc = env.json("calibrate", "pcoqs", "--dataset", "closed", "--alpha", "0.1", "--rho", "0.3",
                   "--scores", env.f("s.npy"), "--dry-run")  # fmt: skip
    assert doc["allowed"] is True
    assert doc["cost"] == {"kind": "zcdp", "rho": "0.3"}
    assert doc["remaining_before"] == {"rho": "1"} and doc["remaining_after"] == {"rho": "0.7"}
    # refused: the same document, and exit 3 as the run would (red team 17: a script gating
    # on `--dry-run && …` ran the real call); the people's form says NO and exits 3 too
    res = env.run("calibrate", "pcoqs", "--dataset", "closed", "--alpha", "0.1",
                  "--rho", "3", "--scores", env.f("s.npy"), "--dry-run", "--json")  # fmt: skip
    assert res.exit_code == 3, res.stderr
    too_much = json.loads(res.stdout)
    assert too_much["allowed"] is False and too_much["remaining_after"] is None
    res = env.run("calibrate", "pcoqs", "--dataset", "closed", "--alpha", "0.1",
                  "--rho", "3", "--scores", env.f("s.npy"), "--dry-run")  # fmt: skip
    assert res.exit_code == 3 and "allowed     NO" in res.stdout, res.stdout
    assert env.state() == before


def test_refusal_past_the_budget(env: Env) -> None:
    env.ok("calibrate", "pcoqs", "--dataset", "closed", "--alpha", "0.1", "--rho", "0.6",
           "--scores", env.f("s.npy"))  # fmt: skip
    before = env.state()
    res = env.run("calibrate", "pcoqs", "--dataset", "closed", "--alpha", "0.1", "--rho", "0.6",
                  "--scores", env.f("s.npy"), "--json")  # fmt: skip
    assert res.exit_code == 3
    # issue 15: under --json a failure is also one JSON error document on stdout
    err = json.loads(res.stdout)["error"]
    assert err["type"] == "BudgetRefused" and err["exit_code"] == 3
    assert err["scope"] and err["remaining"] and err["message"].startswith("budget refused")
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: budget refused")
    assert "closed" in line and "0.4" in line  # the scope and what is left
    assert env.state() == before


def test_split_refused_without_allow_nonprivate(env: Env) -> None:
    before = env.state()
    res = env.run("calibrate", "split", "--dataset", "closed", "--alpha", "0.1",
                  "--scores", env.f("s.npy"))  # fmt: skip
    assert res.exit_code == 3
    assert "does not allow non-private releases" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert env.state() == before


# --------------------------------------------------------------------------- predict / evaluate
def _known_release(env: Env) -> tuple[int, float]:
    """A split release on lac scores uniform on [0, 0.6): threshold ≈ 0.54 ∈ [0.3, 0.8)."""
    rng = np.random.default_rng(3)
    n = 500
    py = 1 - rng.uniform(0, 0.6, n)  # lac score 1 − p_y
    rest = (1 - py)[:, None] * np.array([0.5, 0.5])
    probs = np.column_stack([py, rest])
    np.save(env.dir / "cp.npy", probs)
    np.save(env.dir / "cy.npy", np.zeros(n, dtype=int))
    rel = env.json("calibrate", "split", "--dataset", "open", "--alpha", "0.1",
                   "--probs", env.f("cp.npy"), "--labels", env.f("cy.npy"),
                   "--score", "lac")["release"]  # fmt: skip
    thr = rel["threshold"]
    assert 0.3 <= thr < 0.8
    return rel["id"], thr


def _test_set(env: Env) -> None:
    # every row p = (0.7, 0.2, 0.1): lac scores (0.3, 0.8, 0.9), so each set is exactly {0}
    probs = np.tile([0.7, 0.2, 0.1], (50, 1))
    labels = np.array([0] * 40 + [1] * 10)  # 80% covered
    np.save(env.dir / "tp.npy", probs)
    np.save(env.dir / "ty.npy", labels)
    np.save(env.dir / "ty0.npy", np.zeros(50, dtype=int))


def test_predict_known_sets(env: Env) -> None:
    rid, _ = _known_release(env)
    _test_set(env)
    doc = env.json("predict", "--release", str(rid), "--probs", env.f("tp.npy"))
    assert doc["release"] == rid and doc["sets"] == [[0]] * 50
    for out in ("sets.npy", "sets.npz", "sets.json"):
        res = env.ok("predict", "--release", str(rid), "--probs", env.f("tp.npy"),
                     "--out", env.f(out))  # fmt: skip
        assert "wrote 50 prediction sets" in res.stderr
    expected = np.zeros((50, 3), dtype=bool)
    expected[:, 0] = True
    np.testing.assert_array_equal(np.load(env.f("sets.npy")), expected)
    with np.load(env.f("sets.npz")) as z:
        np.testing.assert_array_equal(z["sets"], expected)
    assert json.loads(Path(env.f("sets.json")).read_text()) == [[0]] * 50
    bad = env.run("predict", "--release", str(rid), "--probs", env.f("tp.npy"),
                  "--out", env.f("sets.txt"))  # fmt: skip
    assert bad.exit_code == 1
    assert "--out must end in .npy, .npz, .json, .csv, .parquet" in bad.stderr


def test_evaluate_known_metrics(env: Env) -> None:
    rid, _ = _known_release(env)
    _test_set(env)
    ev = env.json("evaluate", "--release", str(rid), "--probs", env.f("tp.npy"),
                  "--labels", env.f("ty.npy"))  # fmt: skip
    assert ev["n"] == 50
    assert ev["coverage"] == pytest.approx(0.8)
    assert ev["mean_set_size"] == pytest.approx(1.0)
    assert ev["singleton_fraction"] == pytest.approx(1.0)
    assert ev["guaranteed_lower"] == pytest.approx(0.9)
    assert ev["meets_guarantee"] is False
    ev0 = env.json("evaluate", "--release", str(rid), "--probs", env.f("tp.npy"),
                   "--labels", env.f("ty0.npy"))  # fmt: skip
    assert ev0["coverage"] == 1.0 and ev0["meets_guarantee"] is True
    human = env.ok("evaluate", "--release", str(rid), "--probs", env.f("tp.npy"),
                   "--labels", env.f("ty0.npy")).stdout  # fmt: skip
    for word in ("coverage", "mean set size", "singleton fraction", "meets"):
        assert word in human


def test_guarantee_verdict_wording() -> None:
    """`evaluate`'s verdict line, shared by sets and intervals (cli/render.py)."""
    from types import SimpleNamespace as NS

    from privcal.cli.render import guarantee_verdict

    def ev(meets: bool, consistent: bool) -> Any:
        return NS(meets_guarantee=meets, consistent_with_guarantee=consistent,
                  coverage_upper_95=0.91234)

    assert guarantee_verdict(ev(True, True)) == "meets the recorded guarantee"
    assert guarantee_verdict(ev(False, True)) == (
        # an upper bound printed rounded up, never down (red team 23, newcomer F1)
        "below, but consistent with (95% upper bound 0.9124) the recorded guarantee")
    assert guarantee_verdict(ev(False, False)) == (
        "BELOW and inconsistent with the recorded guarantee")


def test_predict_scores_release_needs_score_name(env: Env) -> None:
    rel = env.json("calibrate", "split", "--dataset", "open", "--alpha", "0.1",
                   "--scores", env.f("s.npy"))["release"]  # fmt: skip
    _test_set(env)
    res = env.run("predict", "--release", str(rel["id"]), "--probs", env.f("tp.npy"))
    assert res.exit_code == 1 and "--score" in res.stderr
    doc = env.json("predict", "--release", str(rel["id"]), "--probs", env.f("tp.npy"),
                   "--score", "lac")  # fmt: skip
    expected = [i for i, sc in enumerate((0.3, 0.8, 0.9)) if sc <= rel["threshold"]]
    assert doc["sets"] == [expected] * 50


# --------------------------------------------------------------------------- methods
#: the example plugin's deliberate shadowing entry point warns; test_registry asserts it
SHADOW_WARNING = "ignore:ignoring plugin calibrator 'split':UserWarning"


@pytest.mark.filterwarnings(SHADOW_WARNING)
def test_methods_lists_builtins_and_plugin(env: Env, example_plugin: Path) -> None:
    rows = {r["name"]: r for r in env.json("methods")}
    for name, model in BUILTINS.items():
        assert rows[name]["privacy_model"] == model
        assert rows[name]["distribution"] == "privcal"
        assert "alpha" in rows[name]["parameters"]
    assert rows["example-max"]["distribution"] == "privcal-example-plugin"
    assert rows["example-max"]["privacy_model"] == "none (non-private)"
    assert list(rows)[:7] == list(BUILTINS)
    human = env.ok("methods").stdout
    for name, model in [*BUILTINS.items(), ("example-max", "none")]:
        assert name in human and model in human


@pytest.mark.filterwarnings(SHADOW_WARNING)
def test_plugin_calibrates_through_the_cli(env: Env, example_plugin: Path) -> None:
    rel = env.json("calibrate", "example-max", "--dataset", "open", "--alpha", "0.1",
                   "--scores", env.f("s.npy"))["release"]  # fmt: skip
    assert rel["threshold"] == pytest.approx(float(np.load(env.f("s.npy")).max()))
    assert rel["distribution"] == "privcal-example-plugin"
    assert rel["distribution_version"] == "0.3.1"
    assert env.ok("audit", "verify").exit_code == 0


# --------------------------------------------------------------------------- the real executable
def test_real_executable_calibrate_json(tmp_path: Path) -> None:
    _write_inputs(tmp_path)
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    exe = str(Path(sys.executable).with_name("privcal"))
    exe = exe if os.path.exists(exe) else "privcal"
    e = Env(url, tmp_path)
    e.ok("db", "upgrade")
    e.ok("dataset", "create", "d", "--epsilon", "2")
    proc = subprocess.run(
        [exe, "--db-url", url, "calibrate", "exponq", "--dataset", "d", "--alpha", "0.1",
         "--epsilon", "1", "--scores", str(tmp_path / "s.npy"), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # exactly one JSON document on stdout
    assert doc["release"]["privacy"]["cost"] == {"kind": "pure", "eps": "1"}
    assert doc["budget"]["remaining"] == {"epsilon": "1"}
    proc = subprocess.run(
        [exe, "--db-url", url, "calibrate", "exponq", "--dataset", "d", "--alpha", "0.1",
         "--epsilon", "1.5", "--scores", str(tmp_path / "s.npy")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 3
    assert proc.stdout == ""
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "budget refused" in errors[0]
    assert len(e.json("release", "list")) == 1
