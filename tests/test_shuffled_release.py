"""Shuffled local-DP releases in the ledger (issue 4, "In the ledger"; issue 14.5/14.6),
through the CLI.

- ``ldp-score --simulate --shuffled`` records a per-round amplified (ε, δ) with
  ``n_shuffled`` = the round's group size n', and charges it to the dataset's (ε, δ) cap;
- a shuffled run on a pure-ε or zCDP cap, which cannot be charged the amplified (ε, δ),
  is refused (exit 3) and changes nothing (14.5);
- ``ldp-label --shuffled`` and ``fedcp2-qq --shuffled`` are refused with or without
  ``--assume-unlinkable-features``: their amplification is not proven (14.6).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cli_env import CliEnv

N = 1200


class Env(CliEnv):
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
    # local-DP runs need the subject of every row: the same N users in every run
    (tmp_path / "ids.csv").write_text("subject\n" + "".join(f"{i}\n" for i in range(N)))
    return e


def _amplify(env: Env, eps0: float, n: int, delta: str, randomizer: str, k: int | None = None
             ) -> Any:  # fmt: skip
    extra = ["--k", str(k)] if k else []
    return env.json("amplify", "--epsilon0", str(eps0), "--n", str(n), "--delta", delta,
                    "--randomizer", randomizer, *extra)  # fmt: skip


def test_ldp_score_shuffled_records_per_round_amplification(env: Env) -> None:
    doc = env.json("calibrate", "ldp-score", "--dataset", "a", "--alpha", "0.1",
                   "--epsilon", "2", "--simulate", "--shuffled", "--scores", env.f("s.npy"),
                   "--subjects", env.f("ids.csv"))
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
    assert amp["delta"] == pytest.approx(1e-5)  # the dataset's reporting δ
    assert 0 < amp["eps"] < 2.0 and amp["certified"] is True
    # the heuristic is shown, labelled, and is not what is claimed
    assert amp["heuristic_eps0_over_sqrt_n"] == pytest.approx(2 / np.sqrt(group))
    assert "heuristic" in amp["heuristic_label"] and amp["eps"] > amp["heuristic_eps0_over_sqrt_n"]
    # the same number as `privcal amplify` for that randomizer, n' and δ
    ref = _amplify(env, 2, group, "1e-5", "binary-rr")
    assert amp["eps"] == pytest.approx(ref["eps"], rel=1e-12)
    assert amp["bound"] == ref["bound"]
    # local-DP statement still there, and what is recorded is what was charged
    assert rel["privacy"]["cost"] == {"kind": "local", "eps0": "2"}
    assert rel["privacy"]["central_cost"]["kind"] == "approx"
    assert Decimal(doc["budget"]["spent"]["epsilon"]) == Decimal(rel["privacy"]["central_cost"]
                                                                  ["eps"])
    assert env.run("audit", "verify").exit_code == 0


@pytest.mark.parametrize("cap", [["--rho", "1"], ["--epsilon", "5"]], ids=["zcdp", "pure"])
def test_shuffled_run_refused_where_the_amplified_cost_cannot_be_charged(
    env: Env, cap: list[str]
) -> None:
    """Issue 14.5: a zCDP or pure-ε cap cannot be charged the amplified (ε, δ); the run used
    to record "(ε, δ)-DP for the aggregator" with nothing charged. Now: exit 3, one line,
    nothing written (and the dry run says the same)."""
    assert env.run("dataset", "create", "q", *cap, "--subject-epsilon", "20").exit_code == 0
    before = env.state("q")
    args = ["calibrate", "ldp-score", "--dataset", "q", "--alpha", "0.1", "--epsilon", "2",
            "--simulate", "--subjects", env.f("ids.csv"), "--shuffled", "--scores",
            env.f("s.npy")]
    for extra in ([], ["--dry-run"]):
        res = env.run(*args, *extra)
        assert res.exit_code == 3, res.stderr
        line = res.stderr.strip().splitlines()[-1]
        assert line.startswith("error: ") and "cannot be charged an (ε, δ) cost" in line
        assert env.state("q") == before
    # the same run without shuffling is fine: its local guarantee is what it claims
    rel = env.json(*args[:-3], "--scores", env.f("s.npy"))["release"]
    assert "extra" not in rel["privacy"]


def test_ldp_score_unshuffled_records_no_amplification(env: Env) -> None:
    rel = env.json("calibrate", "ldp-score", "--dataset", "z", "--alpha", "0.1",
                   "--epsilon", "2", "--simulate", "--scores", env.f("s.npy"),
                   "--subjects", env.f("ids.csv"))["release"]
    assert "extra" not in rel["privacy"]


@pytest.mark.parametrize("assume", [False, True], ids=["plain", "assume-unlinkable"])
def test_ldp_label_shuffled_is_refused(env: Env, assume: bool) -> None:
    """Issue 14.6: label-DP neighbours share the victim's features, sent in the clear, so
    shuffling does not amplify; the assumption of unlinkable features does not change it."""
    before = env.state("a")
    args = ["calibrate", "ldp-label", "--dataset", "a", "--alpha", "0.1", "--epsilon", "2",
            "--k", "4", "--probs", env.f("p.npy"), "--labels", env.f("y.npy"), "--shuffled",
            "--subjects", env.f("ids.csv")]
    res = env.run(*args, *(["--assume-unlinkable-features"] if assume else []))
    assert res.exit_code == 1
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ldp-label cannot be shuffled") and "features" in line
    assert env.state("a") == before


def test_fedcp2_qq_shuffled_is_refused(env: Env) -> None:
    """Issue 14.6: an agent's message is ε-DP per record, not an ε0-local randomizer of the
    agent's whole input: the shuffle bound does not apply."""
    agents = np.repeat(np.arange(40), N // 40)
    np.save(env.dir / "ag.npy", agents)
    before = env.state("a")
    res = env.run("calibrate", "fedcp2-qq", "--dataset", "a", "--alpha", "0.1",
                  "--epsilon", "2", "--scores", env.f("s.npy"), "--agent-of",
                  env.f("ag.npy"), "--shuffled")  # fmt: skip
    assert res.exit_code == 1
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: fedcp2-qq cannot be shuffled") and "record" in line
    assert env.state("a") == before


def test_assumption_without_shuffle_is_an_error(env: Env) -> None:
    before = env.state("z")
    res = env.run("calibrate", "ldp-label", "--dataset", "z", "--alpha", "0.1", "--epsilon", "2",
                  "--k", "4", "--probs", env.f("p.npy"), "--labels", env.f("y.npy"),
                  "--subjects", env.f("ids.csv"), "--assume-unlinkable-features")  # fmt: skip
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
                   "--epsilon", "2", "--simulate", "--shuffled", "--scores", env.f("s.npy"),
                   "--subjects", env.f("ids.csv"))
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
                  "--simulate", "--shuffled", "--scores", env.f("s.npy"),
                  "--subjects", env.f("ids.csv"))  # fmt: skip
    assert res.exit_code == 3 and "budget refused" in res.stderr
    assert env.state("a") == snap


def test_amplification_uses_the_subjects_actually_shuffled(env: Env) -> None:
    np.save(env.dir / "first.npy", np.load(env.f("s.npy"))[: N // 2])
    (env.dir / "first.csv").write_text("subject\n" + "".join(f"{i}\n" for i in range(N // 2)))
    assert env.run("dataset", "create", "c", "--approx-epsilon", "3", "--approx-delta", "1e-5",
                   "--subject-epsilon", "3").exit_code == 0
    # subjects 0 … N/2−1 spend 2 of their 3: they are refused by the next ε0 = 2 run
    env.json("calibrate", "ldp-score", "--dataset", "c", "--alpha", "0.1", "--epsilon", "2",
             "--simulate", "--scores", env.f("first.npy"), "--subjects",
             env.f("first.csv"))  # fmt: skip
    rel = env.json("calibrate", "ldp-score", "--dataset", "c", "--alpha", "0.1", "--epsilon", "2",
                   "--simulate", "--shuffled", "--scores", env.f("s.npy"), "--subjects",
                   env.f("ids.csv"))["release"]
    assert rel["shape"]["n"] == N // 2  # only the accepted half took part
    assert rel["privacy"]["extra"]["n_shuffled"] == rel["diagnostics"]["group_size"]
