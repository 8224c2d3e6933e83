"""Red team 10 (r10fuzz), findings 2 and 3: a parameter every check before the charge
accepted, refused (or crashed on) only after the charge was committed.

F2. ``ldp-label`` with a failure probability δ at the bottom of the float range (5e-324 up
to about 1e-308): ln(2/δ) (one-sided, the default) or ln(4/δ) (two-sided) overflows, so Δ_L
and the target 1−α+Δ_L are +inf. Nothing checked that before the charge (the dry run said
"allowed"); every subject was charged ε0, and then ``noise_aware_threshold`` refused
("target must be a finite number > 0, got inf"): the subjects paid for no release (CLI exit
1, HTTP 422 that still charged). Now :func:`~privcal.calibrators.ldp_label.label_slack`
refuses a δ whose Δ_L is not finite, with one line, and it runs in ``guarantee`` before the
charge and in the dry run: the smallest δ refused is 2⁻¹⁰²³ (one-sided) or 2⁻¹⁰²² (two-sided);
the next float up is still accepted (its release is the trivial +inf one, Δ_L > α at n = 200).

F3. ``pcoqs`` with ρ between about 1e-39 and 1e-30: the rank error τ and the target rank
passed 2⁵³, the largest integer a release's audit entry (RFC 8785 JSON) holds. The charge
was committed, then writing the audit entry raised ``IntegerDomainError``: a traceback on
the CLI, a plain-text 500 over HTTP, the budget spent and no release. The dry run said
"allowed". Decision: refuse such a ρ before the charge (one line), not record a capped rank:
the recorded guarantee states τ and the target rank, and a capped number would be false; at
such a ρ the guaranteed release is +inf whatever the data, so refusing loses nothing.
``advise`` still answers "needs more than 10⁹ scores" for such a ρ (it plans with
``PCOQS._plan``, which does not refuse). The largest ρ refused and a ρ just inside (target
rank within 2 % of 2⁵³) are checked for each bound and for ``--nominal`` (where τ alone
passes 2⁵³).

Each refusal is checked on ``Accountant.run``, ``Accountant.calibrate``, the dry run (the
CLI's and the service's path) and the CLI: one line, no traceback, and every ledger table
(subject spends, charges, releases, audit log) and the audit head as they were.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.accountant.calibration import dry_run
from privcal.calibrators import registry
from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.cli import main
from privcal.errors import InvalidInput
from tests.seeded import Seeded

N = 200
#: every table a run may write: a refused run must leave each exactly as it was
TABLES = ("datasets", "charges", "charge_members", "subject_spend", "subject_baseline",
          "releases", "release_charges", "release_keys", "audit_log", "audit_head",
          "audit_queue")
MAX_SAFE = 2**53 - 1

_rng = np.random.default_rng(10)
SCORES = _rng.uniform(size=N)
PROBS = _rng.dirichlet([1, 1, 1], size=N)
LABELS = _rng.integers(0, 3, size=N)
SUBJECTS = np.array([f"u{i}" for i in range(N)])

#: bound: (the failure probabilities refused, the smallest accepted: the next float up)
LDP_CASES: dict[str, tuple[list[float], float]] = {
    "one-sided": ([5e-324, 1e-308, 2.0**-1023], math.nextafter(2.0**-1023, 1)),
    "two-sided": ([5e-324, 1e-308, 2.0**-1022], math.nextafter(2.0**-1022, 1)),
}
#: case: (parameters, the ρ refused, a ρ just inside: target rank or τ ≥ 98 % of 2⁵³)
PCOQS_CASES: dict[str, tuple[dict[str, Any], list[float], float]] = {
    "exact": ({}, [1e-39, 1e-30, 1.85e-30], 1.9e-30),
    "exact nominal": ({"nominal": True}, [1e-39, 1e-30, 1.85e-30], 1.9e-30),
    "subgaussian": ({"bound": "subgaussian"}, [1e-39, 1e-30, 3e-30], 3.05e-30),
}
ENTRIES = ("run", "calibrate", "dry run")


def _ledger(led: Any) -> tuple[Any, dict[str, list[str]]]:
    """The audit head and every row of every table a run writes."""
    with led.engine.connect() as c:
        rows = {t: sorted(repr(tuple(r)) for r in c.execute(text(f"SELECT * FROM {t}")))
                for t in TABLES}
    return led.head(), rows


def _enter(acct: Any, entry: str, method: str, params: dict[str, Any],
           inputs: dict[str, Any]) -> Any:
    if entry == "run":
        return acct.run(registry.get(method).calibrator, params, CalibrationInput(**inputs),
                        dataset="d", rng=Seeded(0))
    if entry == "calibrate":
        return acct.calibrate(method, params, dataset="d", rng=Seeded(0), **inputs)
    return dry_run(acct, method, params, dataset="d", **inputs)


def _refused(acct: Any, entry: str, method: str, params: dict[str, Any],
             inputs: dict[str, Any], msg: str) -> None:
    """Refused with one line, and the ledger exactly as it was."""
    before = _ledger(acct.ledger)
    with pytest.raises(InvalidInput, match=msg) as exc:
        _enter(acct, entry, method, params, inputs)
    assert "\n" not in str(exc.value)
    assert _ledger(acct.ledger) == before


# ---------------------------------------------------------------- F2: ldp-label, tiny δ
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("bound", list(LDP_CASES))
def test_ldp_label_refuses_a_delta_whose_slack_is_infinite_before_any_subject_pays(
        accountant: Any, bound: str, entry: str) -> None:
    acct = accountant
    acct.create_dataset("d", epsilon=10, subject_epsilon=2)
    inputs = {"probs": PROBS, "labels": LABELS, "subjects": SUBJECTS}
    bad, inside = LDP_CASES[bound]
    for delta in bad:
        params = {"alpha": 0.1, "epsilon": 2, "failure_probability": delta, "bound": bound}
        _refused(acct, entry, "ldp-label", params, inputs, r"failure probability .* too small")
    assert acct.subject_spend("d", "u0") == 0 and acct.budget("d").charges == 0
    # the next float up: accepted, and its release is the trivial one it should be
    params = {"alpha": 0.1, "epsilon": 2, "failure_probability": inside, "bound": bound}
    out = _enter(acct, entry, "ldp-label", params, inputs)
    if entry == "dry run":
        assert out.allowed
        return
    assert math.isfinite(out.coverage.details["delta_L"]) and out.coverage.details["delta_L"] > 1
    assert out.threshold == math.inf and out.diagnostics["trivial"] is True
    assert out.coverage.lower == 0.9 and out.coverage.failure_probability == inside
    assert acct.subject_spend("d", "u0") == 2 and [r.id for r in acct.releases("d")] == [out.id]
    assert acct.verify().guarantees_recomputed == 1


# ---------------------------------------------------------------- F3: pcoqs, tiny ρ
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", list(PCOQS_CASES))
def test_pcoqs_refuses_a_rho_whose_rank_no_record_holds_before_the_charge(
        accountant: Any, case: str, entry: str) -> None:
    acct = accountant
    acct.create_dataset("d", rho=1)
    extra, bad, inside = PCOQS_CASES[case]
    inputs = {"scores": SCORES}
    for rho in bad:
        _refused(acct, entry, "pcoqs", {"alpha": 0.1, "rho": rho, **extra}, inputs,
                 r"ρ = .* too small: .* past 2\*\*53 − 1")
    assert acct.budget("d").charges == 0
    # just inside: accepted, recorded with its exact τ and rank, and verified
    params = {"alpha": 0.1, "rho": inside, **extra}
    _, tau, r = PCOQS()._plan(PCOQSParams(**params), N)
    assert 0.98 * MAX_SAFE < max(r, tau) <= MAX_SAFE
    out = _enter(acct, entry, "pcoqs", params, inputs)
    if entry == "dry run":
        assert out.allowed
        return
    assert out.coverage.rank == r and out.coverage.details["tau"] == tau
    if not extra.get("nominal"):  # r > n: the guaranteed release is +inf, coverage 1
        assert out.threshold == math.inf and out.coverage.lower == 1.0
    assert acct.budget("d").charges == 1 and [x.id for x in acct.releases("d")] == [out.id]
    assert acct.verify().guarantees_recomputed == 1


def test_advise_still_plans_pcoqs_at_such_a_rho() -> None:
    """``advise`` keeps its own answer for such a ρ (it never records a release)."""
    from privcal.calibrators.advisor_central import advise_central

    with pytest.raises(InvalidInput, match="needs more than"):
        advise_central("pcoqs", 0.1, rho=1e-30)
    with pytest.raises(InvalidInput, match="too small"):  # the release is refused
        PCOQS().guarantee(PCOQSParams(alpha=0.1, rho=1e-30), DataShape(n=N))


# ---------------------------------------------------------------- the CLI
def _cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


#: case: (dataset options, method, its options, the refused value's options, the accepted)
CLI_CASES: dict[str, tuple[list[str], str, list[str], list[str], list[str]]] = {
    "ldp-label one-sided": (
        ["--epsilon", "10", "--subject-epsilon", "2"], "ldp-label",
        ["--epsilon", "2", "--probs", "p.npy", "--labels", "y.npy", "--subjects", "subj.csv",
         "--classes", "a,b,c"],
        ["--failure-probability", "5e-324"],
        ["--failure-probability", repr(math.nextafter(2.0**-1023, 1))]),
    "ldp-label two-sided": (
        ["--epsilon", "10", "--subject-epsilon", "2"], "ldp-label",
        ["--epsilon", "2", "--probs", "p.npy", "--labels", "y.npy", "--subjects", "subj.csv",
         "--classes", "a,b,c", "--bound", "two-sided"],
        ["--failure-probability", "1e-308"],
        ["--failure-probability", repr(math.nextafter(2.0**-1022, 1))]),
    "pcoqs exact": (["--rho", "1"], "pcoqs", ["--scores", "s.npy"], ["--rho", "1e-30"],
                    ["--rho", "1.9e-30"]),
    "pcoqs exact nominal": (["--rho", "1"], "pcoqs", ["--scores", "s.npy", "--nominal"],
                            ["--rho", "1.85e-30"], ["--rho", "1.9e-30"]),
    "pcoqs subgaussian": (["--rho", "1"], "pcoqs", ["--scores", "s.npy", "--bound",
                                                    "subgaussian"],
                          ["--rho", "3e-30"], ["--rho", "3.05e-30"]),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_refuses_before_the_charge_and_the_dry_run_refuses_too(
        ledger: Any, ledger_url: str, tmp_path: Path, case: str, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    np.save("p.npy", PROBS)
    np.save("y.npy", LABELS)
    np.save("s.npy", SCORES)
    Path("subj.csv").write_text("subject\n" + "\n".join(SUBJECTS) + "\n")
    ds_opts, method, opts, bad, good = CLI_CASES[case]
    assert _cli(ledger_url, "dataset", "create", "d", *ds_opts).exit_code == 0
    base = ["calibrate", method, "--dataset", "d", "--alpha", "0.1", *opts]
    before = _ledger(ledger)
    for extra in (["--dry-run"], [], ["--dry-run", "--json"], ["--json"]):
        res = _cli(ledger_url, *base, *bad, *extra)
        assert res.exit_code == 1, (extra, res.stdout, res.stderr)
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
        assert "too small" in res.stderr and "Traceback" not in res.stderr
        assert "allowed" not in res.stdout
        if "--json" in extra:
            assert json.loads(res.stdout)["error"]["type"] == "InvalidInput"
        assert _ledger(ledger) == before
    # the boundary just inside: the dry run allows it and the run releases it
    dry = _cli(ledger_url, *base, *good, "--dry-run", "--json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["allowed"] is True, dry.stdout
    assert _ledger(ledger) == before
    res = _cli(ledger_url, *base, *good, "--json")
    assert res.exit_code == 0, res.stderr
    assert len(_ledger(ledger)[1]["releases"]) == 1
    ver = _cli(ledger_url, "audit", "verify")
    assert ver.exit_code == 0 and "1 release guarantees recomputed and match" in ver.stdout


# ---------------------------------------------------------------- HTTP (the same checks)
#: method: (its parameters, the value refused, the value accepted, its data)
HTTP_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "ldp-label": ({"alpha": 0.1, "epsilon": 2}, {"failure_probability": 5e-324},
                  {"failure_probability": math.nextafter(2.0**-1023, 1)},
                  {"probs": PROBS.tolist(), "labels": LABELS.tolist(),
                   "subjects": SUBJECTS.tolist()}),
    "pcoqs": ({"alpha": 0.1}, {"rho": 1e-30}, {"rho": 1.9e-30}, {"scores": SCORES.tolist()}),
}


@pytest.mark.parametrize("method", list(HTTP_CASES))
def test_http_refuses_before_the_charge_with_a_problem_document(
        ledger_url: str, method: str) -> None:
    """Before: the dry run 200 "allowed", the run 422 after charging (ldp-label) or a
    plain-text 500 after charging (pcoqs)."""
    from tests.service.conftest import ledger_snapshot, serve

    params, bad, good, data = HTTP_CASES[method]
    url = "/v1/datasets/d/calibrations"
    with serve(ledger_url) as lv, lv.client("analyst") as c:
        before = ledger_snapshot(lv)
        for dry in ("?dry_run=true", ""):
            r = c.post(url + dry, headers={"Idempotency-Key": f"bad{dry}"},
                       json={"method": method, "params": {**params, **bad}, **data})
            assert r.status_code == 422, (dry, r.status_code, r.text)
            assert r.json()["type"].endswith("invalid-input") and "too small" in r.text
            assert ledger_snapshot(lv) == before
        ok = {"method": method, "params": {**params, **good}, **data}
        r = c.post(url + "?dry_run=true", json=ok)
        assert r.status_code == 200 and r.json()["allowed"] is True, r.text
        r = c.post(url, headers={"Idempotency-Key": "good"}, json=ok)
        assert r.status_code == 201, r.text
        assert len(lv.accountant.releases("d")) == 1
