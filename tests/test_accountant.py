"""The Accountant on both backends: datasets, charges, idempotency, subjects, the release path."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal.accountant import calibration_run
from privcal.accountant import privacy as acc
from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import AlreadyExists, BudgetRefused, InvalidInput, NotFound
from tests.seeded import Seeded


def _counts(ledger: Any) -> dict[str, int]:
    with ledger.engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in ("datasets", "charges", "releases", "subject_spend", "audit_log")}


def test_rho_budget_three_charges_then_refusal(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    for _ in range(3):
        accountant.charge("d", ZCDP(rho=0.3))
    before, head = _counts(accountant.ledger), str(accountant.ledger.head())
    with pytest.raises(BudgetRefused, match=r"dataset 'd'.*ρ=0.3.*remaining rho=0.1"):
        accountant.charge("d", ZCDP(rho=0.3))
    assert _counts(accountant.ledger) == before and str(accountant.ledger.head()) == head
    rep = accountant.budget("d")
    assert rep.spent == {"rho": Decimal("0.9")} and rep.remaining == {"rho": Decimal("0.1")}
    assert rep.cap == {"rho": Decimal(1)} and rep.charges == 3
    assert rep.spent_dp.epsilon == acc.round_up(acc.cks20_epsilon(0.9, 1e-6))
    assert rep.spent_dp.delta == Decimal("0.000001") and "CKS20" in rep.spent_dp.rule


def test_pure_budget_refuses_zcdp_and_sums_exactly(accountant: Any) -> None:
    accountant.create_dataset("p", epsilon=1)
    for _ in range(10):
        accountant.charge("p", PureDP(eps=0.1))
    assert accountant.budget("p").remaining == {"epsilon": Decimal(0)}
    with pytest.raises(BudgetRefused):
        accountant.charge("p", PureDP(eps="0.000000000001"))
    accountant.create_dataset("p2", epsilon=5)
    with pytest.raises(BudgetRefused, match="pure-ε budget accepts only"):
        accountant.charge("p2", ZCDP(rho=0.01))


def test_approx_budget(accountant: Any) -> None:
    info = accountant.create_dataset("a", approx_epsilon=2, approx_delta=1e-5)
    assert info.reporting_delta == Decimal("0.00001")
    accountant.charge("a", ApproxDP(eps=0.5, delta=1e-6))
    rep = accountant.budget("a")
    assert rep.spent == {"epsilon": Decimal("0.5"), "delta": Decimal("0.000001")}
    assert rep.remaining == {"epsilon": Decimal("1.5"), "delta": Decimal("0.000009")}


def test_amounts_rounded_up_to_12_places(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    r = accountant.charge("d", ZCDP(rho=1 / 3))
    assert r.cost["rho"] == "0.333333333334"  # rounded up, never down
    assert accountant.ledger.verify().charges == 1


def test_idempotency_key_records_once(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    first = accountant.charge("d", ZCDP(rho=0.2), idempotency_key="job-1", requester="me")
    n = _counts(accountant.ledger)
    again = accountant.charge("d", ZCDP(rho=0.2), idempotency_key="job-1", requester="me")
    assert again.replayed and not first.replayed and again.charge_id == first.charge_id
    assert _counts(accountant.ledger) == n
    assert accountant.budget("d").spent == {"rho": Decimal("0.2")}
    with pytest.raises(InvalidInput, match="already used for a different charge"):
        accountant.charge("d", ZCDP(rho=0.3), idempotency_key="job-1")
    # a key is per dataset
    accountant.create_dataset("e", rho=1)
    assert not accountant.charge("e", ZCDP(rho=0.2), idempotency_key="job-1").replayed


@pytest.mark.parametrize("kwargs", [
    {"epsilon": -1}, {"epsilon": 0}, {"rho": "abc"}, {"rho": math.inf},
    {"approx_epsilon": 1, "approx_delta": 1}, {"approx_epsilon": 1, "approx_delta": 1.5},
    {"approx_epsilon": 1}, {"epsilon": 1, "rho": 1}, {}, {"rho": 1, "delta": 1},
    {"rho": 1, "delta": 0}, {"rho": 1, "subject_epsilon": -2}, {"epsilon": "0.1234567890123"},
])
def test_create_dataset_bad_input_changes_nothing(accountant: Any, kwargs: dict[str, Any]) -> None:
    before = _counts(accountant.ledger)
    with pytest.raises(InvalidInput) as ei:
        accountant.create_dataset("d", **kwargs)
    assert "\n" not in str(ei.value)
    assert _counts(accountant.ledger) == before


def test_duplicate_and_unknown_dataset(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    before = _counts(accountant.ledger)
    with pytest.raises(AlreadyExists, match="'d' already exists"):
        accountant.create_dataset("d", epsilon=1)
    with pytest.raises(NotFound, match="unknown dataset 'zz'"):
        accountant.charge("zz", ZCDP(rho=0.1))
    with pytest.raises(NotFound):
        accountant.budget("zz")
    assert _counts(accountant.ledger) == before


def test_charge_subjects_mask_duplicates_cap_and_central(accountant: Any) -> None:
    accountant.create_dataset("d", approx_epsilon=1, approx_delta=1e-6, subject_epsilon=2)
    r1 = accountant.charge_subjects("d", 1.5, [1, 2, 3])
    assert r1.accepted == 3 and r1.accepted_mask.tolist() == [True, True, True]
    ids = np.array([3, 4, 4, 5, 1])
    r2 = accountant.charge_subjects("d", 0.5, ids, central_cost=ApproxDP(eps=0.1, delta=1e-7))
    # 3 and 1 have 0.5 left: accepted; one of the two rows of 4 (either: chosen at random,
    # never by position), the other a duplicate
    m2 = r2.accepted_mask.tolist()
    assert m2[0] and m2[3] and m2[4] and m2[1] != m2[2]
    assert (r2.rejected_over_cap, r2.rejected_duplicate) == (0, 1)
    r3 = accountant.charge_subjects("d", 0.5, ids)
    m3 = r3.accepted_mask.tolist()
    assert not (m3[0] or m3[4]) and m3[3] and m3[1] != m3[2]
    assert (r3.accepted, r3.rejected_over_cap, r3.rejected_duplicate) == (2, 2, 1)
    assert accountant.subject_spend("d", 3) == Decimal(2)
    assert accountant.subject_spend("d", 4) == Decimal(1)
    assert accountant.subject_spend("d", "nobody") == Decimal(0)
    assert r2.central is not None
    assert accountant.budget("d").spent == {"epsilon": Decimal("0.1"),
                                             "delta": Decimal("0.0000001")}
    summ = accountant.subject_summary("d")
    assert (summ.subjects, summ.at_cap, summ.max) == (5, 2, Decimal(2))  # subjects 1 and 3
    # a batch nobody can pay for is refused and writes nothing
    before = _counts(accountant.ledger)
    with pytest.raises(BudgetRefused, match="no listed subject"):
        accountant.charge_subjects("d", 1, [1, 2, 3])
    assert _counts(accountant.ledger) == before
    assert accountant.ledger.verify().charges == 4


def test_charge_subjects_needs_a_subject_cap_and_valid_ids(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    with pytest.raises(BudgetRefused, match="no per-subject ε cap"):
        accountant.charge_subjects("d", 1, ["a"])
    accountant.create_dataset("s", rho=1, subject_epsilon=1)
    with pytest.raises(InvalidInput):
        accountant.charge_subjects("s", 1, [])
    with pytest.raises(InvalidInput):
        accountant.charge_subjects("s", 1, [0.5, 1.5])
    with pytest.raises(InvalidInput):
        accountant.charge_subjects("s", -1, ["a"])


def test_charge_subjects_idempotent(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1, subject_epsilon=1)
    r = accountant.charge_subjects("d", 0.5, ["a", "b", "b"], idempotency_key="k")
    again = accountant.charge_subjects("d", 0.5, ["a", "b", "b"], idempotency_key="k")
    assert again.replayed and again.charge_id == r.charge_id
    assert (again.accepted, again.rejected) == (2, 1)
    assert accountant.subject_spend("d", "a") == Decimal("0.5")


# ----------------------------------------------------------------- the release path
def test_run_charges_then_releases(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("d", rho=1)
    cal = fake_calibrator(ZCDP(rho=0.25))
    scores = np.linspace(0, 1, 99)
    rel = accountant.run(cal, {"alpha": 0.1}, CalibrationInput(scores=scores), dataset="d",
                         requester="ana", rng=Seeded(1))
    r = math.ceil(100 * 0.9)
    assert rel.threshold == float(np.sort(scores)[r - 1])
    assert rel.method == "fake" and rel.calibrator_version == "9.9"
    assert rel.shape == {"n": 99, "k": None, "group_sizes": None}
    assert rel.coverage.rank == r and rel.params["alpha"] == 0.1
    assert rel.privacy["cost"] == {"kind": "zcdp", "rho": "0.25"}
    assert rel.privacy["epsilon"] == acc.dstr(acc.round_up(acc.cks20_epsilon(0.25, 1e-6)))
    assert rel.charge_id is not None and rel.requester == "ana"
    assert accountant.budget("d").spent == {"rho": Decimal("0.25")}
    assert accountant.release(rel.id) == rel
    assert [x.id for x in accountant.releases("d")] == [rel.id]
    assert accountant.ledger.verify().releases == 1


def test_run_refused_when_budget_exhausted(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("d", rho=0.1)
    cal = fake_calibrator(ZCDP(rho=0.25))
    before = _counts(accountant.ledger)
    with pytest.raises(BudgetRefused):
        accountant.run(cal, {"alpha": 0.1}, CalibrationInput(scores=np.ones(10)), dataset="d")
    assert cal.calls == 0 and _counts(accountant.ledger) == before


def test_run_nonprivate_needs_permission(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("strict", rho=1)
    accountant.create_dataset("open", rho=1, allow_nonprivate=True)
    cal = fake_calibrator(None)
    data = CalibrationInput(scores=np.arange(10.0))
    with pytest.raises(BudgetRefused, match="non-private release refused"):
        accountant.run(cal, {"alpha": 0.1}, data, dataset="strict")
    assert cal.calls == 0
    rel = accountant.run(cal, {"alpha": 0.1}, data, dataset="open")
    assert rel.charge_id is None and rel.privacy["model"] == "none"
    assert rel.threshold == 9.0  # r = ⌈11·0.9⌉ = 10: the largest of 0..9
    assert accountant.ledger.verify().releases == 1


def test_run_bad_params_or_data_changes_nothing(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("d", rho=1)
    cal = fake_calibrator(ZCDP(rho=0.1))
    before = _counts(accountant.ledger)
    with pytest.raises(InvalidInput, match="alpha"):
        accountant.run(cal, {"alpha": 1.5}, CalibrationInput(scores=np.ones(3)), dataset="d")
    with pytest.raises(InvalidInput, match="NaN"):
        accountant.run(cal, {"alpha": 0.1}, CalibrationInput(scores=np.array([1.0, np.nan])),
                       dataset="d")
    with pytest.raises(InvalidInput, match="needs 'scores'"):
        accountant.run(cal, {"alpha": 0.1}, CalibrationInput(labels=np.ones(3)), dataset="d")
    assert _counts(accountant.ledger) == before and cal.calls == 0


def test_crash_between_charge_and_release(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("d", rho=1)
    data = CalibrationInput(scores=np.linspace(0, 1, 20))
    with pytest.raises(RuntimeError, match="crashed"):
        accountant.run(fake_calibrator(ZCDP(rho=0.3), fail=True), {"alpha": 0.2}, data,
                       dataset="d", idempotency_key="job")
    # the charge stands (privacy spent), no release
    assert accountant.budget("d").spent == {"rho": Decimal("0.3")}
    assert accountant.releases("d") == []
    assert accountant.ledger.verify().charges == 1
    # retrying the same job releases once under the same charge, and a further retry replays
    cal = fake_calibrator(ZCDP(rho=0.3))
    rel = accountant.run(cal, {"alpha": 0.2}, data, dataset="d", idempotency_key="job")
    again = accountant.run(cal, {"alpha": 0.2}, data, dataset="d", idempotency_key="job")
    assert again.id == rel.id and cal.calls == 1
    assert accountant.budget("d").spent == {"rho": Decimal("0.3")}


def test_run_local_dp_drops_refused_subjects(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("d", rho=1, subject_epsilon=1)
    accountant.charge_subjects("d", 1, ["s0", "s1"])  # s0 and s1 are exhausted
    cal = fake_calibrator(LocalDP(eps0=1))
    subjects = np.array([f"s{i}" for i in range(10)])
    data = CalibrationInput(scores=np.arange(10.0), subjects=subjects)
    rel = accountant.run(cal, {"alpha": 0.5}, data, dataset="d")
    assert cal.seen_n == [8] and rel.shape["n"] == 8
    assert rel.privacy["model"] == "local" and rel.privacy["epsilon"] == "1"
    # the threshold is computed without the refused rows (scores 0 and 1)
    assert rel.threshold == float(np.arange(2.0, 10.0)[math.ceil(9 * 0.5) - 1])
    with pytest.raises(InvalidInput, match="subject id"):
        accountant.run(cal, {"alpha": 0.5}, CalibrationInput(scores=np.ones(3)), dataset="d")


def test_dry_run_writes_nothing(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho=0.5))
    before = _counts(accountant.ledger)
    ok = accountant.dry_run(fake_calibrator(ZCDP(rho=0.3)), {"alpha": 0.1}, DataShape(n=10), "d")
    no = accountant.dry_run(fake_calibrator(ZCDP(rho=0.6)), {"alpha": 0.1}, DataShape(n=10), "d")
    assert ok.allowed and ok.remaining_after == {"rho": Decimal("0.2")}
    assert not no.allowed and "exceed" in no.reason
    assert _counts(accountant.ledger) == before


def test_record_release_for_a_session(accountant: Any) -> None:
    # a release computed elsewhere (here: a run on dataset "e"), recorded with the installed
    # calibrator's version and sentences, paid for by two per-subject charges of all its rows
    accountant.create_dataset("e", rho=1, subject_epsilon=1)
    n = 60
    done = accountant.calibrate("ldp-score", dataset="e", alpha=0.1, epsilon=0.5,
                                scores=np.linspace(0, 1, n), subjects=np.arange(n))
    accountant.create_dataset("d", rho=1, subject_epsilon=1)
    c1 = accountant.charge_subjects("d", 0.5, [f"s{i}" for i in range(n - 1)]).charge_id
    c2 = accountant.charge_subjects("d", 0.5, ["c"]).charge_id
    cov = {"target": 0.9, "lower": 0.88, "over": "x", "statement": "s"}
    rel = accountant.record_release(
        "d", method="ldp-score", calibrator_version=done.calibrator_version,
        threshold=done.threshold, params=done.params, shape=done.shape,
        coverage=done.coverage, privacy=done.privacy, charge_ids=[c1, c2],
    )
    assert rel.charge_ids == [c1, c2] and rel.coverage == done.coverage
    same = dict(method="ldp-score", calibrator_version=done.calibrator_version,
                threshold=done.threshold, params=done.params, shape=done.shape,
                coverage=done.coverage, privacy=done.privacy)
    with pytest.raises(InvalidInput, match="already has a release"):
        accountant.record_release("d", **same, charge_ids=[c1])
    with pytest.raises(InvalidInput, match="not a charge of dataset"):
        accountant.record_release("d", **same, charge_ids=[999])
    with pytest.raises(InvalidInput, match="shape is not a data shape: n: Field required"):
        accountant.record_release("d", **{**same, "shape": {}}, charge_ids=[c2])
    with pytest.raises(InvalidInput, match="NaN"):
        accountant.record_release("d", method="m", calibrator_version="1",
                                  threshold=math.nan, params={}, shape={}, coverage=cov,
                                  privacy={})
    assert accountant.ledger.verify().releases == 2


def test_run_local_dp_with_central_cost(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("d", approx_epsilon=1, approx_delta=1e-6, subject_epsilon=4)
    cal = fake_calibrator(LocalDP(eps0=2))
    data = CalibrationInput(scores=np.arange(6.0), subjects=np.arange(6))
    with pytest.raises(InvalidInput, match="central_cost are privcal's"):  # red team 16
        accountant.run(cal, {"alpha": 0.5}, data, dataset="d",
                       central_cost=ApproxDP(eps=0.25, delta=1e-7))
    assert accountant.budget("d").spent == {"epsilon": 0, "delta": 0}
    # privcal's own run (a shuffled calibrate's) charges it with the subjects
    rel = calibration_run.run(accountant.ledger, cal, {"alpha": 0.5}, data, dataset="d",
                              central_cost=ApproxDP(eps=0.25, delta=1e-7),
                              extra_diagnostics={"score": "lac"})
    assert len(rel.charge_ids) == 2 and rel.charge_id == rel.charge_ids[0]
    assert rel.privacy["central_cost"] == {"kind": "approx", "eps": "0.25", "delta": "0.0000001"}
    assert rel.diagnostics["score"] == "lac" and rel.diagnostics["n"] == 6
    assert accountant.budget("d").spent == {"epsilon": Decimal("0.25"),
                                             "delta": Decimal("0.0000001")}
    with pytest.raises(InvalidInput, match="only to local-DP"):
        calibration_run.run(accountant.ledger, fake_calibrator(ZCDP(rho=0.1)), {"alpha": 0.5},
                            data, dataset="d", central_cost=ApproxDP(eps=0.25, delta=1e-7))
    assert accountant.ledger.verify().releases == 1


def test_calibrate_by_name_with_the_split_calibrator(accountant: Any) -> None:
    """Integration with the built-in registry: parameters as keywords, data as arrays."""
    accountant.create_dataset("open", rho=1, allow_nonprivate=True)
    rel = accountant.calibrate("split", dataset="open", scores=np.arange(10.0), alpha=0.1)
    assert rel.method == "split" and rel.threshold == 9.0 and rel.charge_id is None
    assert accountant.ledger.verify().releases == 1
