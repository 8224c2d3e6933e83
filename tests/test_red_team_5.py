"""Red team, session 11: the accounting and the statements built around it. Each test is an
attack that used to record a false statement, attach an unrelated charge to a release, or
crash where a one-line refusal was due; it passes when the attack fails.

- a keyed local-DP run finds its central charge again by the key ``KEY#central``: a caller's
  own charge under that key was taken, on a replay, for the run's (and recorded in its
  release as its central cost);
- ``{"rho": "1e999999999"}`` crashed the budget check with ``decimal.Overflow``;
- a dataset named ``a/b``, ``..``, with a control character or not in NFC was created and
  then unaddressable in the service's URLs (or broke its Location header);
- the dataset's guarantee named no neighbouring relation, while LDP-CP-L's releases protect
  labels only and Mondrian's assume public groups;
- a shuffled release said its amplified (ε, δ) held "for the aggregator", which stores each
  report with its subject's pseudonym.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal.accountant.charges import charge_central
from privcal.accountant.normalize import normalize_cost
from privcal.costs import ZCDP, PureDP
from privcal.errors import InvalidInput
from tests.cli_env import CliEnv


def _written(acct: Any) -> tuple[int, ...]:
    """Datasets, charges, audit entries and releases in the ledger."""
    with acct.ledger.engine.connect() as conn:
        return tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar())
                     for t in ("datasets", "charges", "audit_log", "releases"))


# ------------------------------------------------------- the reserved central-charge key
def test_a_callers_key_ending_in_central_is_refused(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("l", rho=1, subject_epsilon=10)
    before = _written(acct)
    for call in (lambda: acct.charge("l", ZCDP(rho="0.3"), idempotency_key="job#central"),
                 lambda: acct.charge_subjects("l", "1", ["a"], idempotency_key="x#central")):
        with pytest.raises(InvalidInput, match="reserved"):
            call()
    assert _written(acct) == before


def test_a_replay_never_takes_an_unrelated_charge_for_the_runs_central_one(accountant: Any
                                                                           ) -> None:
    """A ledger written before the suffix was reserved may hold a caller's ``job#central``:
    the replay of the keyed batch ``job`` (which had no central cost) must not report it."""
    acct = accountant
    acct.create_dataset("l", rho=1, subject_epsilon=10)
    first = acct.charge_subjects("l", "1", ["a", "b"], idempotency_key="job")
    assert first.central is None
    led = acct.ledger

    def plant(conn: Any) -> Any:  # a caller's charge under the key, as an old ledger holds
        ds = led.dataset_row(conn, "l")
        return charge_central(led, conn, ds, ZCDP(rho="0.3"), "unrelated DP mean", None,
                              "job#central", "f" * 64)

    led.write_core(plant)
    again = acct.charge_subjects("l", "1", ["a", "b"], idempotency_key="job")
    assert again.replayed and again.charge_id == first.charge_id
    assert again.central is None


def test_a_keyed_runs_own_central_charge_is_still_replayed(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("l", rho=1, subject_epsilon=10)
    first = acct.charge_subjects("l", "1", ["a", "b"], central_cost=ZCDP(rho="0.01"),
                                 idempotency_key="job")
    again = acct.charge_subjects("l", "1", ["a", "b"], central_cost=ZCDP(rho="0.01"),
                                 idempotency_key="job")
    assert first.central is not None and again.central is not None
    assert again.central.charge_id == first.central.charge_id
    assert acct.budget("l").spent["rho"] == Decimal("0.01")


# ------------------------------------------------------------------ overflowing amounts
@pytest.mark.parametrize("value", ["1e999999999", "-1e999999999", "1e-999999999"])
def test_an_amount_with_a_huge_exponent_is_refused_not_overflowed(value: str) -> None:
    with pytest.raises(InvalidInput, match=r"^ZCDP rho: .*exponent past[^\n]*$"):
        ZCDP(rho=value)


def test_a_large_amount_is_refused_by_the_charge_not_overflowed(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    before = _written(accountant)
    with pytest.raises(InvalidInput, match="too large"):
        accountant.charge("d", ZCDP(rho="1e999"))
    assert _written(accountant) == before


def test_a_cost_built_without_validation_is_refused_by_its_exponent() -> None:

    for cost in (ZCDP.model_construct(rho=Decimal("1e999999999")),
                 PureDP.model_construct(eps=Decimal("-1e999999999"))):
        with pytest.raises(InvalidInput, match="too large"):
            normalize_cost(cost)


# ------------------------------------------------------------------------ dataset names
@pytest.mark.parametrize("name", ["a/b", ".", "..", "x\r\ny", "tab\there", "e\u0301"])
def test_an_unaddressable_dataset_name_is_refused_writing_nothing(accountant: Any,
                                                                 name: str) -> None:
    before = _written(accountant)
    with pytest.raises(InvalidInput, match="dataset name"):
        accountant.create_dataset(name, rho=1)
    assert _written(accountant) == before


def test_names_that_are_one_url_segment_are_accepted(accountant: Any) -> None:
    for name in ("数据", "ok.name", "caf\u00e9", "with space"):
        assert accountant.create_dataset(name, rho=1).name == name


# ----------------------------------------------------- what the statements are about
def test_the_dataset_guarantee_names_its_neighbouring_relation(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("p", epsilon=0.5, subject_epsilon=4)
    st = acct.budget("p").guarantee.statement
    assert "(4.5, 0)-DP" in st
    assert "in the sense each release states" in st and "LDP-CP-L" in st
    assert "Mondrian" in st


def test_a_shuffled_release_says_whom_its_amplification_protects_against(
        ledger_url: str, tmp_path: Path) -> None:
    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    assert env.run("dataset", "create", "s", "--approx-epsilon", "20", "--approx-delta",
                   "1e-5", "--subject-epsilon", "6").exit_code == 0
    np.save(tmp_path / "s.npy", np.random.default_rng(5).random(4000))
    (tmp_path / "ids.csv").write_text("subject\n" + "".join(f"{i}\n" for i in range(4000)))
    doc = env.json("calibrate", "ldp-score", "--dataset", "s", "--alpha", "0.1", "--epsilon",
                   "2", "--simulate", "--shuffled", "--scores", env.f("s.npy"), "--subjects",
                   env.f("ids.csv"))
    priv = doc["release"]["privacy"]
    assert priv["extra"]["amplification"]["amplified"] is True
    assert "for the aggregator" not in priv["statement"]
    assert "not the reports with their subjects" in priv["statement"]
    assert "ε0-local DP" in priv["amplified_for"]
    assert env.run("audit", "verify").exit_code == 0


# ------------------------------------------------------- nested sets of several levels
def _aps_levels(acct: Any) -> tuple[Any, np.ndarray]:
    g = np.random.default_rng(1)
    p = g.dirichlet(np.ones(3), 4000)
    y = (p.cumsum(1) > g.random((4000, 1))).argmax(1)
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    rel = acct.calibrate("split", dataset="d", probs=p[:1000], labels=y[:1000], score="aps",
                         alpha=[0.1, 0.15])
    return rel, p[1000:]


def test_the_sets_of_all_levels_are_nested_for_randomized_scores(accountant: Any) -> None:
    rel, p = _aps_levels(accountant)
    (a1, s10), (a2, s15) = rel.level_sets(p)
    assert (a1, a2) == (0.1, 0.15)
    assert not (s15 & ~s10).any()  # one draw of u for both levels
    assert (s10 & ~s15).any()  # and the levels differ: the test can tell


def test_predict_alpha_all_writes_nested_sets(ledger_url: str, tmp_path: Path) -> None:
    from privcal import Accountant

    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    rel, p = _aps_levels(Accountant(ledger_url))
    np.save(tmp_path / "p.npy", p)
    res = env.run("predict", "--release", str(rel.id), "--probs", env.f("p.npy"), "--alpha",
                  "all", "--out", env.f("sets.npz"))
    assert res.exit_code == 0, res.output
    with np.load(tmp_path / "sets.npz") as z:
        s10, s15 = z["alpha=0.1"], z["alpha=0.15"]
    assert not (s15 & ~s10).any()


# ------------------------------------------------------ the discrete Gaussian's cutoff
def test_the_cutoff_of_a_huge_variance_takes_few_steps(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """ρ = 1e-300 gave σ² ≈ 10³⁰⁰, and the cutoff walked back one integer at a time: P-COQS
    (and `advise`) never returned. Each tail evaluation is counted; a walk fails fast."""
    from privcal.calibrators import tail_bounds as tb

    real, calls = tb._closed_form_tail, [0]

    def counted(s2: float, k: int) -> float:
        calls[0] += 1
        if calls[0] > 10_000:
            raise AssertionError("the cutoff search walks")
        return real(s2, k)

    monkeypatch.setattr(tb, "_closed_form_tail", counted)
    for s2 in (1e12, 1e100, 1e300):
        t = tb.discrete_gaussian_cutoff(s2, 1e-9)
        assert real(s2, t + 1) <= 1e-9 < real(s2, t)  # the smallest such t


# ----------------------------------------------------------------- CLI one-line errors
@pytest.mark.parametrize("expires", ["99999999999d", "3000000d", "3661d"])
def test_a_token_that_would_outlive_the_calendar_is_one_line(ledger_url: str, tmp_path: Path,
                                                             expires: str) -> None:
    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    res = env.run("--json", "token", "create", "--role", "admin", "--name", "x", "--expires",
                  expires)
    assert res.exit_code == InvalidInput.exit_code, res.output
    assert "at most 10 years" in json.loads(res.stdout)["error"]["message"]
    assert env.json("token", "list") == []  # nothing written


def test_a_ledger_at_a_revision_this_privcal_does_not_know_is_named_so(ledger_url: str,
                                                                        tmp_path: Path) -> None:
    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    from privcal.storage import Ledger

    led = Ledger(ledger_url)
    with led.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    for args in (("dataset", "list"), ("db", "upgrade")):
        res = env.run("--json", *args)
        assert res.exit_code == 5, res.output
        msg = json.loads(res.stdout)["error"]["message"]
        assert "does not know" in msg and "upgrade privcal" in msg and "\n" not in msg


def test_completion_with_json_prints_one_document(ledger_url: str, tmp_path: Path) -> None:
    doc = json.loads(CliEnv(ledger_url, tmp_path).run("--json", "completion", "bash").stdout)
    assert doc["shell"] == "bash" and "_PRIVCAL_COMPLETE" in doc["script"]


def test_a_replay_on_a_ledger_from_before_digests_keeps_the_runs_central_charge(
        accountant: Any) -> None:
    """Charges written before migration 0005 carry no request digest: the batch and its
    ``KEY#central`` charge are then matched as they were then, not dropped."""
    acct = accountant
    acct.create_dataset("l", rho=1, subject_epsilon=10)
    first = acct.charge_subjects("l", "1", ["a", "b"], central_cost=ZCDP(rho="0.01"),
                                 idempotency_key="job")
    with acct.ledger.engine.begin() as conn:  # as an old ledger holds them
        conn.execute(text("UPDATE charges SET request_digest = NULL"))
    again = acct.charge_subjects("l", "1", ["a", "b"], central_cost=ZCDP(rho="0.01"),
                                 idempotency_key="job")
    assert first.central is not None and again.central is not None
    assert again.central.charge_id == first.central.charge_id


def test_json_nested_past_the_stack_is_invalid_not_a_crash() -> None:
    import json as _json

    from privcal.service.json_body import check_unique_keys, loads_strict

    with pytest.raises(_json.JSONDecodeError, match="nested too deeply"):
        loads_strict(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(InvalidInput, match="nested too deeply"):
        check_unique_keys(b'{"a":' * 50_000 + b"1" + b"}" * 50_000)
