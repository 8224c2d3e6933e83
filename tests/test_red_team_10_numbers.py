"""Red team 10: a malformed number in a calibration's parameters was charged as a number,
and a missing required method option was not a usage error.

F1. ``privcal charge --rho 0_5``, ``dataset create`` and ``POST …/charges`` refuse
``0_5`` (``Decimal("1_0")`` is 10: not an amount anyone meant), but a calibration's own
parameters were read by Python's ``float``: ``privcal calibrate pcoqs --rho 0_5`` recorded
a 5-zCDP release, ``--epsilon 0_5`` a 5-DP one, ``--rho １`` (a fullwidth digit) charged 1,
``--alpha 0.0_5,0.1`` released at α = 0.005; in the library (hence over HTTP)
``rho="0_5"``, ``tol="1e-1_0"`` and ``alpha="0.0_5,0.1"`` were accepted likewise (pydantic's
lax float). ``privcal session open … --epsilon 2_0`` opened a session at ε = 20. Now a
number's text with a ``_`` or a non-ASCII character is refused: a usage error (exit 2) on
the CLI, an InvalidInput (422 over HTTP) in the library, and nothing is charged.

F4. With click ≥ 8.3 a method option declared ``required=True, default=None`` counted as
given: ``privcal calibrate pcoqs`` without ``--alpha`` exited 1 with "invalid alpha: Field
required" instead of click's usage error (exit 2, "Missing option '--alpha'").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privcal.accountant import Accountant
from privcal.errors import InvalidInput
from privcal.storage import Ledger
from tests.cli_env import CliEnv


@pytest.fixture
def env(ledger_url: str, tmp_path: Path) -> CliEnv:
    e = CliEnv(ledger_url, tmp_path)
    assert e.run("db", "upgrade").exit_code == 0
    for args in (("z", "--rho", "50", "--subject-epsilon", "100"), ("p", "--epsilon", "50")):
        assert e.run("dataset", "create", *args).exit_code == 0
    np.save(tmp_path / "s.npy", np.random.default_rng(10).beta(2, 5, 1000))
    return e


def _state(env: CliEnv) -> tuple[Any, ...]:
    """What a refused command must leave as it was: the audit head, the releases, the
    sessions' charges and what each dataset has spent."""
    budgets = tuple((b["charges"], json.dumps(b["spent"], sort_keys=True))
                    for b in (env.json("budget", "show", d) for d in ("z", "p")))
    return env.json("audit", "head")["head"], len(env.json("release", "list")), budgets


BAD_OPTIONS = {
    "rho 0_5": ("pcoqs", "z", ["--alpha", "0.1", "--rho", "0_5"], "--rho"),
    "epsilon 0_5": ("exponq", "p", ["--alpha", "0.1", "--epsilon", "0_5"], "--epsilon"),
    "fullwidth rho": ("pcoqs", "z", ["--alpha", "0.1", "--rho", "１"], "--rho"),
    "tol 1e-1_0": ("pcoqs", "z", ["--alpha", "0.1", "--rho", "0.5", "--tol", "1e-1_0"],
                   "--tol"),
    "deprecated beta": ("pcoqs", "z", ["--alpha", "0.1", "--rho", "0.5", "--beta", "0.0_5"],
                        "--beta"),
    "int bins 1_00": ("exponq", "p", ["--alpha", "0.1", "--epsilon", "0.5", "--bins", "1_00"],
                      "--bins"),
    "levels 0.0_5,0.1": ("pcoqs", "z", ["--alpha", "0.0_5,0.1", "--rho", "0.5"], "--alpha"),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_a_malformed_method_number_is_a_usage_error_and_charges_nothing(
        env: CliEnv, case: str) -> None:
    method, dataset, args, flag = BAD_OPTIONS[case]
    before = _state(env)
    res = env.run("calibrate", method, "--dataset", dataset, "--scores", env.f("s.npy"), *args)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert f"Invalid value for '{flag}'" in res.stderr
    assert _state(env) == before


def test_session_open_refuses_a_malformed_epsilon(env: CliEnv) -> None:
    before = _state(env)
    res = env.run("session", "open", "ldp-score", "--dataset", "z", "--alpha", "0.1",
                  "--epsilon", "2_0", "--rounds", "3", "--group-size", "10")
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert "Invalid value for '--epsilon'" in res.stderr
    assert _state(env) == before


@pytest.mark.parametrize("missing", ["--alpha", "--rho"])
def test_a_missing_required_method_option_is_a_usage_error(env: CliEnv, missing: str) -> None:
    given = {"--alpha": "0.1", "--rho": "0.5"}
    args = [x for k, v in given.items() if k != missing for x in (k, v)]
    res = env.run("calibrate", "pcoqs", "--dataset", "z", "--scores", env.f("s.npy"), *args)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert f"Missing option '{missing}'" in res.stderr


LIBRARY_BAD = {
    "rho 0_5": {"rho": "0_5"},
    "tol 1e-1_0": {"rho": 0.5, "tol": "1e-1_0"},
    "failure probability 0.0_5": {"rho": 0.5, "failure_probability": "0.0_5"},
    "levels 0.0_5,0.1": {"rho": 0.5, "alpha": "0.0_5,0.1"},
}


@pytest.mark.parametrize("case", list(LIBRARY_BAD))
def test_the_library_refuses_a_malformed_number_and_charges_nothing(
        ledger: Ledger, case: str) -> None:
    acct = Accountant(ledger)
    acct.create_dataset("z", rho=50)
    scores = np.random.default_rng(10).beta(2, 5, 1000)
    with pytest.raises(InvalidInput, match=r"plain number|comma-separated"):
        acct.calibrate("pcoqs", dataset="z", scores=scores, **{"alpha": 0.1, **LIBRARY_BAD[case]})
    budget = acct.budget("z")
    assert budget.charges == 0 and acct.releases("z") == []


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_http_refuses_a_malformed_number_and_charges_nothing(ledger_url: str) -> None:
    from tests.service.conftest import serve

    scores = np.random.default_rng(10).beta(2, 5, 1000).tolist()
    with serve(ledger_url) as lv, lv.client("analyst") as c:
        before = lv.accountant.budget("d").charges
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": "rt10"}, json={
            "method": "pcoqs", "params": {"alpha": 0.1, "rho": "0.0_5"}, "scores": scores})
        assert r.status_code == 422, r.text
        assert r.json()["type"].endswith("invalid-input")
        assert lv.accountant.budget("d").charges == before
        assert lv.accountant.releases("d") == []


def test_the_library_opens_no_session_on_a_malformed_epsilon(ledger: Ledger) -> None:
    from privcal.accountant.sessions import open_session

    acct = Accountant(ledger)
    acct.create_dataset("z", rho=50, subject_epsilon=100)
    with pytest.raises(InvalidInput, match="plain number"):
        open_session(acct, "ldp-score", dataset="z", alpha=0.1, epsilon="2_0", rounds=3,
                     group_size=10)
    assert acct.budget("z").charges == 0


# --------------------------------------------------------- the cost side, the same rule
@pytest.mark.parametrize("text", ["１", "0.５", "1٠"])
def test_amounts_in_non_ascii_digits_are_refused(text: str, tmp_path: Any) -> None:
    """``Decimal("１")`` is 1: ``charge --rho １``, ``ZCDP("１")`` and ``parse_amount``
    refused ``0_5`` but took a fullwidth (or Arabic-Indic) digit as a number."""
    from click.testing import CliRunner

    from privcal.accountant.normalize import parse_amount
    from privcal.cli import main
    from privcal.costs import ZCDP

    with pytest.raises(ValueError):
        ZCDP(text)
    with pytest.raises(InvalidInput):
        parse_amount(text, "rho")
    url = f"sqlite:///{tmp_path}/a.sqlite"
    run = CliRunner().invoke
    assert run(main, ["--db-url", url, "dataset", "create", "z", "--rho", "2"]).exit_code == 0
    res = run(main, ["--db-url", url, "charge", "z", "--rho", text])
    assert res.exit_code == 2 and "is not a decimal number" in res.output
    shown = run(main, ["--db-url", url, "budget", "show", "z", "--json"])
    assert '"charges": 0' in shown.output


# ---------------------------------------------- reviewed (r10rev 3 and 5): bytes, score ranges
@pytest.mark.parametrize("value", [b"0_5", np.bytes_(b"0_5"), bytearray(b"0.5")])
def test_a_number_given_as_bytes_is_refused(tmp_path: Path, value: Any) -> None:
    """``float(b"0_5")`` is 5: a NumPy ``S`` array's item passed as ρ was charged 5."""
    from privcal.accountant import sessions as S
    from privcal.errors import PrivcalError

    led = Ledger(f"sqlite:///{tmp_path}/b.sqlite")
    acct = Accountant(led)
    acct.create_dataset("d", rho=20)
    acct.create_dataset("u", approx_epsilon=50, approx_delta="1e-6", subject_epsilon=30)
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidInput, match="not bytes"):
        acct.calibrate("pcoqs", {"alpha": 0.1, "rho": value}, dataset="d",
                       scores=rng.random(200))
    with pytest.raises(InvalidInput, match="must be a number"):
        S.open_session(acct, "ldp-score", dataset="u", alpha=0.1, epsilon=value, rounds=2,
                       group_size=10)
    assert acct.budget("d").charges == acct.budget("u").charges == 0
    assert acct.releases() == []
    with pytest.raises(PrivcalError, match="session"):  # none was opened
        S.session_status(acct, 1)
    led.close()


@pytest.mark.parametrize("text", ["0,1_0", "0,１", ("0", "1_0"), (b"0", 1), (True, 2)])
def test_a_score_range_in_malformed_text_is_refused(tmp_path: Path, text: Any) -> None:
    """``--score-range 0,1_0`` was charged and released on [0, 10]."""
    led = Ledger(f"sqlite:///{tmp_path}/r.sqlite")
    acct = Accountant(led)
    acct.create_dataset("d", rho=2)
    with pytest.raises(InvalidInput, match=r"score[ _-]range"):
        acct.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.5}, dataset="d",
                       scores=np.random.default_rng(0).random(200), score_range=text)
    assert acct.budget("d").charges == 0 and acct.releases() == []
    led.close()


def test_cli_score_range_in_malformed_text_is_a_usage_error(tmp_path: Path) -> None:
    env = CliEnv(f"sqlite:///{tmp_path}/c.sqlite", tmp_path)
    np.save(tmp_path / "s.npy", np.random.default_rng(0).random(200))
    assert env.run("dataset", "create", "d", "--rho", "2").exit_code == 0
    res = env.run("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.5",
                  "--scores", env.f("s.npy"), "--score-range", "0,1_0")
    assert res.exit_code != 0 and "plain numbers" in res.output
    assert env.json("budget", "show", "d")["charges"] == 0
