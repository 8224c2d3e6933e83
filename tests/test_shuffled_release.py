"""Shuffled local-DP releases in the ledger (issue 4, "In the ledger"), through the CLI.

- ``ldp-score --simulate --shuffled`` records a per-round amplified (ε, δ) with
  ``n_shuffled`` = the round's group size n';
- ``ldp-label --shuffled`` is refused without ``--assume-unlinkable-features``
  (nothing changes), and records the assumption with it;
- on a dataset with an (ε, δ) cap, the amplified cost is charged to the dataset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from privcal.cli import main

N = 1200


@dataclass
class Env:
    url: str
    dir: Path

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["--db-url", self.url, *args], catch_exceptions=False)

    def json(self, *args: str) -> Any:
        res = self.run(*args, "--json")
        assert res.exit_code == 0, (args, res.stderr)
        return json.loads(res.stdout)

    def f(self, name: str) -> str:
        return str(self.dir / name)

    def state(self, dataset: str) -> tuple[Any, ...]:
        b = self.json("budget", "show", dataset)
        return (self.json("audit", "head")["head"], len(self.json("release", "list")),
                b["charges"], b["spent"])  # fmt: skip


@pytest.fixture
def env(ledger_url: str, tmp_path: Path) -> Env:
    e = Env(ledger_url, tmp_path)
    assert e.run("db", "upgrade").exit_code == 0
    assert e.run("dataset", "create", "z", "--rho", "1", "--subject-epsilon", "20").exit_code == 0
    assert e.run("dataset", "create", "a", "--approx-epsilon", "3", "--approx-delta", "1e-5",
                 "--subject-epsilon", "20").exit_code == 0  # fmt: skip
    rng = np.random.default_rng(2)
    np.save(tmp_path / "s.npy", rng.beta(2, 5, N))
    probs = rng.dirichlet(np.ones(4), N)
    np.save(tmp_path / "p.npy", probs)
    np.save(tmp_path / "y.npy", rng.integers(0, 4, N))
    return e


def _amplify(env: Env, eps0: float, n: int, delta: str, randomizer: str, k: int | None = None
             ) -> Any:  # fmt: skip
    extra = ["--k", str(k)] if k else []
    return env.json("amplify", "--epsilon0", str(eps0), "--n", str(n), "--delta", delta,
                    "--randomizer", randomizer, *extra)  # fmt: skip


def test_ldp_score_shuffled_records_per_round_amplification(env: Env) -> None:
    doc = env.json("calibrate", "ldp-score", "--dataset", "z", "--alpha", "0.1",
                   "--epsilon", "2", "--simulate", "--shuffled", "--scores", env.f("s.npy"))
    rel = doc["release"]
    extra = rel["privacy"]["extra"]
    group = rel["diagnostics"]["group_size"]
    assert rel["coverage"]["details"]["group_size"] == group
    assert extra["shuffled"] is True
    assert extra["n_shuffled"] == group < N  # per round, not all N users
    assert "per round" in extra["scope"]
    assert extra["randomizer"] == "binary-rr"
    amp = extra["amplification"]
    assert amp["n"] == group and amp["eps0"] == 2.0
    assert amp["delta"] == pytest.approx(1e-6)  # the dataset's reporting δ
    assert 0 < amp["eps"] < 2.0 and amp["certified"] is True
    # the heuristic is shown, labelled, and is not what is claimed
    assert amp["heuristic_eps0_over_sqrt_n"] == pytest.approx(2 / np.sqrt(group))
    assert "heuristic" in amp["heuristic_label"] and amp["eps"] > amp["heuristic_eps0_over_sqrt_n"]
    # the same number as `privcal amplify` for that randomizer, n' and δ
    ref = _amplify(env, 2, group, "1e-6", "binary-rr")
    assert amp["eps"] == pytest.approx(ref["eps"], rel=1e-12)
    assert amp["bound"] == ref["bound"]
    # local-DP statement still there; a zCDP dataset is not charged the amplified (ε, δ)
    assert rel["privacy"]["cost"] == {"kind": "local", "eps0": "2"}
    assert "central_cost" not in rel["privacy"]
    assert doc["budget"]["spent"] == {"rho": "0"}
    assert env.run("audit", "verify").exit_code == 0


def test_ldp_score_unshuffled_records_no_amplification(env: Env) -> None:
    rel = env.json("calibrate", "ldp-score", "--dataset", "z", "--alpha", "0.1",
                   "--epsilon", "2", "--simulate", "--scores", env.f("s.npy"))["release"]
    assert "extra" not in rel["privacy"]


def test_ldp_label_shuffled_needs_the_explicit_assumption(env: Env) -> None:
    before = env.state("z")
    args = ["calibrate", "ldp-label", "--dataset", "z", "--alpha", "0.1", "--epsilon", "2",
            "--k", "4", "--probs", env.f("p.npy"), "--labels", env.f("y.npy"), "--shuffled"]
    res = env.run(*args)
    assert res.exit_code == 1
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: ")
    assert "--assume-unlinkable-features" in line and "features" in line
    assert env.state("z") == before
    assert env.json("budget", "show", "z", "--subjects")  # still readable
    rel = env.json(*args, "--assume-unlinkable-features")["release"]
    extra = rel["privacy"]["extra"]
    assert "not linkable" in extra["assumption"]
    assert extra["randomizer"] == "krr" and extra["n_shuffled"] == N
    ref = _amplify(env, 2, N, "1e-6", "krr", k=4)
    assert extra["amplification"]["eps"] == pytest.approx(ref["eps"], rel=1e-12)
    assert env.run("audit", "verify").exit_code == 0


def test_assumption_without_shuffle_is_an_error(env: Env) -> None:
    before = env.state("z")
    res = env.run("calibrate", "ldp-label", "--dataset", "z", "--alpha", "0.1", "--epsilon", "2",
                  "--k", "4", "--probs", env.f("p.npy"), "--labels", env.f("y.npy"),
                  "--assume-unlinkable-features")  # fmt: skip
    assert res.exit_code == 1 and "only matters with --shuffled" in res.stderr
    assert env.state("z") == before


def test_central_methods_have_no_shuffle_option(env: Env) -> None:
    res = env.run("calibrate", "pcoqs", "--dataset", "z", "--alpha", "0.1", "--rho", "0.1",
                  "--scores", env.f("s.npy"), "--shuffled")  # fmt: skip
    assert res.exit_code == 2 and "--shuffled" in res.stderr


def test_amplified_cost_charged_to_an_approx_dataset(env: Env) -> None:
    before = env.json("budget", "show", "a")
    assert before["spent"] == {"epsilon": "0", "delta": "0"}
    doc = env.json("calibrate", "ldp-score", "--dataset", "a", "--alpha", "0.1",
                   "--epsilon", "2", "--simulate", "--shuffled", "--scores", env.f("s.npy"))
    rel = doc["release"]
    amp = rel["privacy"]["extra"]["amplification"]
    assert amp["delta"] == pytest.approx(1e-5)  # the dataset's δ
    central = rel["privacy"]["central_cost"]
    assert central["kind"] == "approx"
    eps = Decimal(central["eps"])
    # charged amount = the amplified ε rounded UP (never under-counted)
    assert eps >= Decimal(repr(amp["eps"])) and eps - Decimal(repr(amp["eps"])) < Decimal("1e-11")
    assert Decimal(central["delta"]) == Decimal("0.00001")
    after = env.json("budget", "show", "a")
    assert Decimal(after["spent"]["epsilon"]) == eps
    assert Decimal(after["spent"]["delta"]) == Decimal("0.00001")
    assert Decimal(after["remaining"]["epsilon"]) == Decimal(3) - eps
    assert after["charges"] == before["charges"] + 2  # subjects' ε0 and the dataset's (ε, δ)
    assert len(rel["charge_ids"]) == 2
    assert env.run("audit", "verify").exit_code == 0
    # the whole δ of the cap is spent: a second shuffled run is refused, nothing written
    snap = env.state("a")
    res = env.run("calibrate", "ldp-score", "--dataset", "a", "--alpha", "0.1", "--epsilon", "2",
                  "--simulate", "--shuffled", "--scores", env.f("s.npy"))  # fmt: skip
    assert res.exit_code == 3 and "budget refused" in res.stderr
    assert env.state("a") == snap


def test_amplification_uses_the_subjects_actually_shuffled(env: Env) -> None:
    np.save(env.dir / "first.npy", np.load(env.f("s.npy"))[: N // 2])
    assert env.run("dataset", "create", "c", "--rho", "1", "--subject-epsilon", "3").exit_code == 0
    # subjects 0 … N/2−1 spend 2 of their 3: they are refused by the next ε0 = 2 run
    env.json("calibrate", "ldp-score", "--dataset", "c", "--alpha", "0.1", "--epsilon", "2",
             "--simulate", "--scores", env.f("first.npy"))  # fmt: skip
    rel = env.json("calibrate", "ldp-score", "--dataset", "c", "--alpha", "0.1", "--epsilon", "2",
                   "--simulate", "--shuffled", "--scores", env.f("s.npy"))["release"]
    assert rel["shape"]["n"] == N // 2  # only the accepted half took part
    assert rel["privacy"]["extra"]["n_shuffled"] == rel["diagnostics"]["group_size"]
