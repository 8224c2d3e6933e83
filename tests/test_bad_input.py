"""Bad input gets a one-line error and changes nothing (DESIGN.md principles, issues 2 and 6).

Every case runs through the CLI (``privcal calibrate …``: exit 1 and exactly one
``error: …`` line on stderr, or exit 2 for a click usage error) and, where the
API has an equivalent, through ``Accountant.calibrate`` (an ``InvalidInput`` or
``NotFound``). After each: same audit head, same charge count and spent budget,
no release row. The SQLite ledger is shared by the whole module, so every
refused request is also checked against all the earlier ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from privcal import Accountant, Ledger
from privcal.cli import main
from privcal.errors import InvalidInput, NotFound

N, K = 200, 3
RNG = np.random.default_rng(11)
SCORES = RNG.beta(2, 5, N)
PROBS = RNG.dirichlet(np.ones(K), N)
LABELS = RNG.integers(0, K, N)
AGENTS = np.repeat(np.arange(4), N // 4)


def _with(a: np.ndarray, row: int, value: Any) -> np.ndarray:
    b = a.astype(float).copy()
    b[row] = value
    return b


NAN_SCORES = _with(SCORES, 7, np.nan)
BAD_ROW_PROBS = PROBS.copy()
BAD_ROW_PROBS[3] *= 1.5
NAN_PROBS = PROBS.copy()
NAN_PROBS[5, 1] = np.nan
LABEL_OUT = LABELS.copy()
LABEL_OUT[4] = K
LABEL_NEG = LABELS.copy()
LABEL_NEG[9] = -1

ARRAYS = {
    "s": SCORES, "s_nan": NAN_SCORES, "s_2d": SCORES.reshape(-1, 2), "s_one": SCORES[:1],
    "p": PROBS, "p_badrow": BAD_ROW_PROBS, "p_nan": NAN_PROBS, "p_1d": PROBS[:, 0],
    "y": LABELS, "y_out": LABEL_OUT, "y_neg": LABEL_NEG, "y_short": LABELS[:-1],
    "y_frac": _with(LABELS, 2, 1.5), "ag": AGENTS,
}  # fmt: skip


@dataclass
class Env:
    url: str
    dir: Path
    acct: Accountant

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["--db-url", self.url, *args], catch_exceptions=False)

    def state(self) -> tuple[Any, ...]:
        led = self.acct.ledger
        budgets = tuple(
            (b.charges, b.releases, json.dumps({k: str(v) for k, v in b.spent.items()}))
            for b in (self.acct.budget("d"), self.acct.budget("open"))
        )
        return str(led.head()), len(led.releases()), budgets


def _make_env(url: str, d: Path) -> Env:
    res = CliRunner().invoke(main, ["--db-url", url, "db", "upgrade"])
    assert res.exit_code == 0, res.stderr
    acct = Accountant(Ledger(url))
    acct.create_dataset("d", rho=5, subject_epsilon=100)
    acct.create_dataset("open", rho=5, subject_epsilon=100, allow_nonprivate=True)
    for name, arr in ARRAYS.items():
        np.save(d / f"{name}.npy", arr)
    (d / "garbage.npy").write_bytes(b"definitely not an npy file")
    (d / "s.parquet").write_bytes(b"PAR1")
    return Env(url, d, acct)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    d = tmp_path_factory.mktemp("bad_input")
    e = _make_env(f"sqlite:///{d}/ledger.sqlite", d)
    # one real release so "nothing changed" is checked against a non-empty ledger
    e.acct.calibrate("exponq", dataset="d", scores=SCORES, alpha=0.1, epsilon=0.5)
    yield e
    e.acct.ledger.close()


# name → (CLI arguments after `calibrate`, API call (method, kwargs) or None, exit, message regex)
PC = ["pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1"]
API_PC: dict[str, Any] = {"dataset": "d", "alpha": 0.1, "rho": 0.1}
CASES: dict[str, tuple[list[str], tuple[str, dict[str, Any]] | None, int, str]] = {
    "nan score names the row": (
        [*PC, "--scores", "s_nan.npy"],
        ("pcoqs", {**API_PC, "scores": NAN_SCORES}), 1, r"scores: row 7 is nan"),
    "probs row not summing to 1": (
        [*PC, "--probs", "p_badrow.npy", "--labels", "y.npy", "--score", "lac"],
        ("pcoqs", {**API_PC, "probs": BAD_ROW_PROBS, "labels": LABELS, "score": "lac"}),
        1, r"row 3 sums to 1\.5, not 1"),
    "nan in probs": (
        [*PC, "--probs", "p_nan.npy", "--labels", "y.npy", "--score", "aps"],
        ("pcoqs", {**API_PC, "probs": NAN_PROBS, "labels": LABELS, "score": "aps"}),
        1, r"row 5"),
    "label equal to k": (
        [*PC, "--probs", "p.npy", "--labels", "y_out.npy", "--score", "lac"],
        ("pcoqs", {**API_PC, "probs": PROBS, "labels": LABEL_OUT, "score": "lac"}),
        1, r"labels: row 4 is 3, outside \[0, 3\)"),
    "negative label": (
        [*PC, "--probs", "p.npy", "--labels", "y_neg.npy", "--score", "lac"],
        ("pcoqs", {**API_PC, "probs": PROBS, "labels": LABEL_NEG, "score": "lac"}),
        1, r"labels: row 9 is -1"),
    "fractional label": (
        [*PC, "--probs", "p.npy", "--labels", "y_frac.npy", "--score", "lac"],
        ("pcoqs", {**API_PC, "probs": PROBS, "labels": _with(LABELS, 2, 1.5), "score": "lac"}),
        1, r"labels.*row 2"),
    "length mismatch": (
        [*PC, "--probs", "p.npy", "--labels", "y_short.npy", "--score", "lac"],
        ("pcoqs", {**API_PC, "probs": PROBS, "labels": LABELS[:-1], "score": "lac"}),
        1, rf"length mismatch: probs has {N}, labels has {N - 1} rows"),
    "scores not 1-D": (
        [*PC, "--scores", "s_2d.npy"],
        ("pcoqs", {**API_PC, "scores": SCORES.reshape(-1, 2)}), 1, r"scores must be a 1-D array"),
    "probs not 2-D": (
        [*PC, "--probs", "p_1d.npy", "--labels", "y.npy", "--score", "lac"],
        ("pcoqs", {**API_PC, "probs": PROBS[:, 0], "labels": LABELS, "score": "lac"}),
        1, r"prob"),
    "fewer than 2 rows": (
        [*PC, "--scores", "s_one.npy"],
        ("pcoqs", {**API_PC, "scores": SCORES[:1]}), 1, r"at least 2 rows, got 1"),
    "alpha above 1": (
        ["pcoqs", "--dataset", "d", "--alpha", "1.5", "--rho", "0.1", "--scores", "s.npy"],
        ("pcoqs", {**API_PC, "alpha": 1.5, "scores": SCORES}), 1, r"invalid alpha"),
    "alpha 0": (
        ["pcoqs", "--dataset", "d", "--alpha", "0", "--rho", "0.1", "--scores", "s.npy"],
        ("pcoqs", {**API_PC, "alpha": 0.0, "scores": SCORES}), 1, r"invalid alpha"),
    "alpha 1": (
        ["pcoqs", "--dataset", "d", "--alpha", "1", "--rho", "0.1", "--scores", "s.npy"],
        ("pcoqs", {**API_PC, "alpha": 1, "scores": SCORES}), 1, r"invalid alpha"),
    "alpha nan": (
        ["pcoqs", "--dataset", "d", "--alpha", "nan", "--rho", "0.1", "--scores", "s.npy"],
        ("pcoqs", {**API_PC, "alpha": float("nan"), "scores": SCORES}), 1, r"invalid alpha"),
    "rho 0": (
        ["pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0", "--scores", "s.npy"],
        ("pcoqs", {**API_PC, "rho": 0, "scores": SCORES}), 1, r"invalid rho"),
    "rho negative": (
        ["pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "-1", "--scores", "s.npy"],
        ("pcoqs", {**API_PC, "rho": -1.0, "scores": SCORES}), 1, r"invalid rho"),
    "epsilon 0": (
        ["exponq", "--dataset", "d", "--alpha", "0.1", "--epsilon", "0", "--scores", "s.npy"],
        ("exponq", {"dataset": "d", "alpha": 0.1, "epsilon": 0, "scores": SCORES}),
        1, r"invalid epsilon"),
    "epsilon negative": (
        ["exponq", "--dataset", "d", "--alpha", "0.1", "--epsilon", "-0.5", "--scores", "s.npy"],
        ("exponq", {"dataset": "d", "alpha": 0.1, "epsilon": -0.5, "scores": SCORES}),
        1, r"invalid epsilon"),
    "unknown dataset": (
        ["pcoqs", "--dataset", "nope", "--alpha", "0.1", "--rho", "0.1", "--scores", "s.npy"],
        ("pcoqs", {**API_PC, "dataset": "nope", "scores": SCORES}),
        1, r"unknown dataset 'nope'"),
    "unknown score": (
        [*PC, "--probs", "p.npy", "--labels", "y.npy", "--score", "nope"],
        ("pcoqs", {**API_PC, "probs": PROBS, "labels": LABELS, "score": "nope"}),
        1, r"unknown score 'nope' \(known: lac, aps, raps"),
    "probs without a score": (
        [*PC, "--probs", "p.npy", "--labels", "y.npy"],
        ("pcoqs", {**API_PC, "probs": PROBS, "labels": LABELS}), 1, r"name a score"),
    "scores and probs together": (
        [*PC, "--scores", "s.npy", "--probs", "p.npy", "--labels", "y.npy", "--score", "lac"],
        ("pcoqs", {**API_PC, "scores": SCORES, "probs": PROBS, "labels": LABELS, "score": "lac"}),
        1, r"either --scores, or --probs with --labels, not both"),
    "no data": (PC, ("pcoqs", API_PC), 1, r"needs --scores"),
    "unknown parameter (API)": (
        [*PC, "--scores", "s.npy", "--bogus", "3"],
        ("pcoqs", {**API_PC, "scores": SCORES, "bogus": 3}), 1, r"takes no parameter 'bogus'"),
    "unknown method": (
        ["nope", "--dataset", "d", "--alpha", "0.1", "--scores", "s.npy"],
        ("nope", {"dataset": "d", "alpha": 0.1, "scores": SCORES}),
        1, r"unknown calibrator 'nope' \(known: .*pcoqs"),
    "missing file": ([*PC, "--scores", "missing.npy"], None, 1, r"missing\.npy: no such file"),
    "unreadable file": ([*PC, "--scores", "garbage.npy"], None, 1,
                        r"garbage\.npy: not a NumPy \.npy file"),
    "missing npz member": ([*PC, "--scores", "s.npy:x"], None, 1, r"s\.npy"),
    "agents for a central method": (
        [*PC, "--scores", "s.npy"],  # the CLI has no --agent-of here: usage error, see below
        ("pcoqs", {**API_PC, "scores": SCORES, "agents": AGENTS}), 1, r"not federated"),
}  # fmt: skip

#: CLI cases that are click usage errors (exit 2), with the message click prints
USAGE = {
    "unknown parameter (API)": r"No such option: --bogus|No such option '--bogus'",
    "unknown method": r"No such command 'nope'",
}


def _cli_args(env: Env, args: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(args):
        if i and args[i - 1] in ("--scores", "--probs", "--labels", "--agent-of"):
            a = str(env.dir / a)
        out.append(a)
    return out


@pytest.mark.parametrize("case", [c for c in CASES if c != "agents for a central method"])
def test_cli_bad_input(env: Env, case: str) -> None:
    args, _, code, pattern = CASES[case]
    before = env.state()
    res = env.run("calibrate", *_cli_args(env, args))
    if case in USAGE:
        assert res.exit_code == 2, res.stderr
        assert re.search(USAGE[case], res.stderr)
    else:
        assert res.exit_code == code, (res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("error: ")
        assert re.search(pattern, lines[0]), lines[0]
    assert res.stdout == ""
    assert env.state() == before


@pytest.mark.parametrize("case", [c for c, v in CASES.items() if v[1] is not None])
def test_api_bad_input(env: Env, case: str) -> None:
    _, api, _, pattern = CASES[case]
    assert api is not None
    method, kwargs = api
    before = env.state()
    with pytest.raises((InvalidInput, NotFound)) as info:
        env.acct.calibrate(method, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    assert re.search(pattern, msg), msg
    assert env.state() == before


# ------------------------------------------------------------------ every method
METHODS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "split": (["--scores", "{s}"], {"scores": "{s}"}),
    "pcoqs": (["--rho", "0.1", "--scores", "{s}"], {"rho": 0.1, "scores": "{s}"}),
    "exponq": (["--epsilon", "1", "--scores", "{s}"], {"epsilon": 1, "scores": "{s}"}),
    "ldp-label": (["--epsilon", "1", "--k", "3", "--probs", "{p}", "--labels", "y.npy"],
                  {"epsilon": 1, "k": 3, "probs": "{p}", "labels": LABELS}),
    "ldp-score": (["--epsilon", "1", "--simulate", "--scores", "{s}"],
                  {"epsilon": 1, "scores": "{s}"}),
    "fedcp-qq": (["--scores", "{s}", "--agent-of", "ag.npy"], {"scores": "{s}", "agents": AGENTS}),
    "fedcp2-qq": (["--epsilon", "5", "--scores", "{s}", "--agent-of", "ag.npy"],
                  {"epsilon": 5, "scores": "{s}", "agents": AGENTS}),
}  # fmt: skip
DEFECTS = {
    # defect → (file for {s}/{p}, array for {s}/{p}, alpha, message)
    "nan": ("s_nan.npy", "p_nan.npy", NAN_SCORES, NAN_PROBS, "0.1", r"row [57]"),
    "alpha": ("s.npy", "p.npy", SCORES, PROBS, "1.5", r"invalid alpha"),
    "one row": ("s_one.npy", None, SCORES[:1], None, "0.1", r"at least 2 rows|length|agent"),
}


def _sub(v: Any, s: Any, p: Any) -> Any:
    if isinstance(v, str) and v in ("{s}", "{p}"):
        return s if v == "{s}" else p
    return v


def _fill(items: Any, s: Any, p: Any) -> Any:
    if isinstance(items, list):
        return [_sub(a, s, p) for a in items]
    return {k: _sub(v, s, p) for k, v in items.items()}


@pytest.mark.parametrize("defect", list(DEFECTS))
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_refuses_bad_data(env: Env, method: str, defect: str) -> None:
    s_file, p_file, s_arr, p_arr, alpha, pattern = DEFECTS[defect]
    cli, api = METHODS[method]
    if defect == "one row" and method == "ldp-label":
        p_file, p_arr = "p.npy", PROBS[:1]
        np.save(env.dir / "p_one.npy", PROBS[:1])
        p_file = "p_one.npy"
        pattern = r"length mismatch|at least 2 rows"
    before = env.state()
    res = env.run("calibrate", method, "--dataset", "open", "--alpha", alpha,
                  *_cli_args(env, _fill(cli, s_file, p_file)))  # fmt: skip
    assert res.exit_code == 1, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert env.state() == before
    with pytest.raises(InvalidInput, match=pattern):
        env.acct.calibrate(method, dataset="open", alpha=float(alpha), **_fill(api, s_arr, p_arr))
    assert env.state() == before


# ------------------------------------------------------------------ predict / evaluate
def test_predict_evaluate_unknown_release(env: Env) -> None:
    before = env.state()
    for cmd in (["predict", "--release", "999", "--probs", str(env.dir / "p.npy")],
                ["evaluate", "--release", "999", "--probs", str(env.dir / "p.npy"),
                 "--labels", str(env.dir / "y.npy")]):  # fmt: skip
        res = env.run(*cmd)
        assert res.exit_code == 1
        assert res.stderr.strip() == "error: unknown release 999"
    res = env.run("predict", "--release", "abc", "--probs", str(env.dir / "p.npy"))
    assert res.exit_code == 2 and "'abc' is not a valid integer" in res.stderr
    with pytest.raises(NotFound, match="unknown release 999"):
        env.acct.release(999)
    assert env.state() == before


def test_evaluate_bad_labels(env: Env) -> None:
    rid = env.acct.ledger.releases()[0].id
    res = env.run("evaluate", "--release", str(rid), "--probs", str(env.dir / "p.npy"),
                  "--labels", str(env.dir / "y_out.npy"), "--score", "lac")  # fmt: skip
    assert res.exit_code == 1
    assert re.fullmatch(r"error: labels: row 4 is 3, outside \[0, 3\)", res.stderr.strip())


# ------------------------------------------------------------------ on PostgreSQL too
@pytest.mark.parametrize(
    "case", ["nan score names the row", "label equal to k", "unknown dataset", "alpha above 1"]
)
def test_bad_input_changes_nothing_on_each_backend(
    ledger_url: str, tmp_path: Path, case: str
) -> None:
    e = _make_env(ledger_url, tmp_path)
    e.acct.calibrate("exponq", dataset="d", scores=SCORES, alpha=0.1, epsilon=0.5)
    args, api, code, pattern = CASES[case]
    before = e.state()
    res = e.run("calibrate", *_cli_args(e, args))
    assert res.exit_code == code and re.search(pattern, res.stderr)
    assert api is not None
    with pytest.raises((InvalidInput, NotFound), match=pattern):
        e.acct.calibrate(api[0], **api[1])
    assert e.state() == before
    e.acct.ledger.close()


def test_infeasible_federated_plan_is_refused_before_any_charge(env: Env) -> None:
    """ε too small for n: FedCP²-QQ has no plan. That is known from the parameters and the
    shape alone, so the agents must not be charged for a run that cannot happen."""
    before = env.state()
    with pytest.raises(InvalidInput, match="no FedCP²-QQ plan"):
        env.acct.calibrate("fedcp2-qq", dataset="open", scores=SCORES, agents=AGENTS,
                           alpha=0.01, epsilon=0.1)  # fmt: skip
    res = env.run("calibrate", "fedcp2-qq", "--dataset", "open", "--alpha", "0.01",
                  "--epsilon", "0.1", "--scores", str(env.dir / "s.npy"),
                  "--agent-of", str(env.dir / "ag.npy"))  # fmt: skip
    assert res.exit_code == 1 and "no FedCP²-QQ plan" in res.stderr
    assert env.state() == before
    assert env.acct.subject_summary("open").subjects == 0
