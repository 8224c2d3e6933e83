"""Issue 12 part B through the API: Mondrian (class-conditional) calibration charged once,
several levels α charged k times, the record of each group and level, sets and evaluation,
audit verify, and bad input refused with nothing charged."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal import Accountant
from privcal.calibrators import registry
from privcal.calibrators.prediction_sets import lac_cut
from privcal.calibrators.scores import all_class_scores
from privcal.errors import AuditFailed, InvalidInput
from tests.seeded import Seeded


def _data(n: int = 1500, k: int = 3, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(k) * 2, n)
    y = np.array([rng.choice(k, p=p) for p in probs])
    return probs, y


def _state(acct: Accountant, ds: str = "d") -> tuple[Any, ...]:
    b = acct.budget(ds)
    return b.spent, b.charges, len(acct.releases(ds)), acct.ledger.head()


@pytest.fixture
def acct(accountant: Accountant) -> Accountant:
    accountant.create_dataset("d", rho="10")
    return accountant


def test_label_mondrian_is_charged_once_and_records_each_class(acct: Accountant) -> None:
    probs, y = _data()
    rel = acct.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac", alpha=0.1,
                         rho=0.5, mondrian="label", public_groups=True, rng=Seeded(3))
    assert rel.method == "mondrian:pcoqs"
    assert acct.budget("d").spent == {"rho": Decimal("0.5")}  # one run's cost, not 3 × 0.5
    sizes = [int((y == j).sum()) for j in range(3)]
    assert rel.shape["group_sizes"] == sizes
    groups = rel.diagnostics["groups"]
    assert [g["group"] for g in groups] == ["0", "1", "2"]
    assert [g["n"] for g in groups] == sizes
    assert rel.threshold == max(g["threshold"] for g in groups)
    # each class's guarantee is pcoqs's at that class's n
    pc = registry.get("pcoqs").calibrator
    for j, n in enumerate(sizes):
        g = pc.guarantee(pc.Params(alpha=0.1, rho=0.5), _shape(n, 3))
        assert rel.coverage.details[f"group {j}: lower"] == g.lower
        assert rel.coverage.details[f"group {j}: n"] == n
    assert rel.coverage.lower == min(rel.coverage.details[f"group {j}: lower"] for j in range(3))
    assert "public" in rel.privacy["neighbouring"]
    assert rel.params["public_groups"] is True
    assert acct.verify().guarantees_recomputed == 1


def _shape(n: int, k: int) -> Any:
    from privcal.calibrators.base import DataShape

    return DataShape(n=n, k=k)


def test_label_conditional_sets_use_each_class_threshold(acct: Accountant) -> None:
    probs, y = _data()
    for score in ("lac", "aps"):
        rel = acct.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score=score,
                             alpha=0.1, rho=0.5, mondrian="label", public_groups=True,
                             rng=Seeded(4))
        t = np.array([g["threshold"] for g in rel.diagnostics["groups"]])
        test, _ = _data(200, seed=9)
        got = rel.predict_set(test, rng=Seeded(7))
        if score == "lac":
            want = (1.0 - test) <= t[None, :]
            assert np.array_equal(got, test >= np.array([lac_cut(x) for x in t])[None, :])
        else:  # the same u per row as all_class_scores draws from the same seed
            want = all_class_scores("aps", test, rng=Seeded(7)) <= t[None, :]
        assert np.array_equal(got, want)
        assert len(set(t.tolist())) == 3  # three different thresholds were used


def test_group_column_sets_and_unknown_group(acct: Accountant) -> None:
    probs, y = _data()
    rng = np.random.default_rng(2)
    groups = rng.choice(["north", "south"], size=y.shape[0])
    acct.create_dataset("s", rho="1", allow_nonprivate=True)
    rel = acct.calibrate("split", dataset="s", probs=probs, labels=y, score="lac", alpha=0.2,
                         groups=groups, public_groups=True)
    assert rel.method == "mondrian:split" and rel.params["group_by"] == "column"
    scores = 1.0 - probs[np.arange(y.shape[0]), y]
    for name, g in zip(("north", "south"), rel.diagnostics["groups"], strict=True):
        s = np.sort(scores[groups == name])
        r = math.ceil((s.shape[0] + 1) * 0.8)
        assert g["group"] == name and g["threshold"] == s[r - 1]
    test, _ = _data(50, seed=3)
    tg = rng.choice(["north", "south"], size=50)
    sets = rel.predict_set(test, groups=tg)
    t = {g["group"]: g["threshold"] for g in rel.diagnostics["groups"]}
    want = (1.0 - test) <= np.array([t[g] for g in tg])[:, None]
    assert np.array_equal(sets, want)
    with pytest.raises(InvalidInput, match="give the group of every row"):
        rel.predict_set(test)
    with pytest.raises(InvalidInput, match="'east'"):
        rel.predict_set(test, groups=np.array(["east"] + ["north"] * 49))


def test_small_group_gets_infinity_never_a_clipped_value(acct: Accountant) -> None:
    probs, y = _data(800)
    groups = np.where(np.arange(800) < 6, "tiny", "big")
    rel = acct.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac", alpha=0.1,
                         rho=0.5, groups=groups, public_groups=True, rng=Seeded(0))
    by = {r["group"]: r for r in rel.thresholds()}
    assert by["tiny"]["n"] == 6 and by["tiny"]["threshold"] == math.inf
    assert by["tiny"]["lower"] == 1.0
    assert by["big"]["n"] == 794 and math.isfinite(by["big"]["threshold"])
    assert rel.threshold == math.inf
    assert rel.coverage.details["group tiny: lower"] == 1.0
    sets = rel.predict_set(probs[:10], groups=np.array(["tiny"] * 10))
    assert sets.all()  # every label: the set at +inf
    assert acct.verify().guarantees_recomputed == 1


def test_levels_cost_k_times_and_nested_thresholds(acct: Accountant) -> None:
    probs, y = _data()
    rel = acct.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac",
                         alpha=[0.2, 0.05, 0.1], rho=0.25, rng=Seeded(5))
    assert rel.method == "levels:pcoqs"
    assert rel.params["alpha"] == [0.05, 0.1, 0.2]
    assert acct.budget("d").spent == {"rho": Decimal("0.75")}  # 3 × 0.25, exactly
    levels = rel.diagnostics["levels"]
    nested = [x["threshold"] for x in levels]
    raw = [x["threshold_raw"] for x in levels]
    assert nested == [max(raw[i:]) for i in range(3)]
    assert rel.threshold == nested[0]
    sizes = [rel.predict_set(probs[:300], alpha=a).sum() for a in (0.05, 0.1, 0.2)]
    assert sizes[0] >= sizes[1] >= sizes[2]
    with pytest.raises(InvalidInput, match="choose one"):
        rel.predict_set(probs[:3])
    with pytest.raises(InvalidInput, match="no level"):
        rel.predict_set(probs[:3], alpha=0.3)
    pc = registry.get("pcoqs").calibrator
    for a in (0.05, 0.1, 0.2):
        g = pc.guarantee(pc.Params(alpha=a, rho=0.25), _shape(1500, 3))
        assert rel.coverage.details[f"alpha={a:g}: lower"] == g.lower
    assert acct.verify().guarantees_recomputed == 1


def test_mondrian_with_levels_is_charged_k_rho_once(acct: Accountant) -> None:
    probs, y = _data()
    rel = acct.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac",
                         alpha="0.1,0.2", rho=0.5, mondrian="label", public_groups=True,
                         rng=Seeded(6))
    assert rel.method == "mondrian:levels:pcoqs"
    assert acct.budget("d").spent == {"rho": Decimal("1.0")}
    ev = rel.evaluate(probs, y, alpha=0.2)
    assert ev.by_group is not None and [g.group for g in ev.by_group] == ["0", "1", "2"]
    assert [g.n for g in ev.by_group] == [int((y == j).sum()) for j in range(3)]
    assert acct.verify().guarantees_recomputed == 1


def test_exponq_pure_dp_parallel_and_levels(accountant: Accountant) -> None:
    accountant.create_dataset("e", epsilon="10")
    probs, y = _data()
    accountant.calibrate("exponq", dataset="e", probs=probs, labels=y, score="lac",
                         alpha=[0.1, 0.2], epsilon=1, mondrian="label", public_groups=True,
                         rng=Seeded(1))
    assert accountant.budget("e").spent == {"epsilon": Decimal("2")}
    assert accountant.verify().guarantees_recomputed == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"mondrian": "label"}, "public_groups=True"),
    ({"mondrian": "label", "public_groups": "yes"}, "True or False"),
    ({"mondrian": "class", "public_groups": True}, "'label' or 'column'"),
    ({"mondrian": "column", "public_groups": True}, "give the group of every row"),
    ({"public_groups": True}, "only matters"),
    ({"groups": ["a"] * 10, "public_groups": True}, "one group per row"),
    ({"groups": [1.5] * 1500, "public_groups": True}, "groups"),
    ({"alpha": [0.1, 0.1]}, "twice"),
    ({"alpha": [0.1, 1.2]}, r"\(0, 1\)"),
    ({"alpha": "0.1,x"}, "comma-separated"),
])
def test_bad_wrapper_input_changes_nothing(acct: Accountant, kwargs: dict[str, Any],
                                           match: str) -> None:
    probs, y = _data()
    before = _state(acct)
    args = {"alpha": 0.1, "rho": 0.5, **kwargs}
    with pytest.raises(InvalidInput, match=match):
        acct.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac", **args)
    assert _state(acct) == before


def test_wrappers_refuse_local_and_federated_methods(accountant: Accountant) -> None:
    accountant.create_dataset("l", epsilon="5", subject_epsilon="5")
    probs, y = _data(300)
    before = _state(accountant, "l")
    with pytest.raises(InvalidInput, match="central method"):
        accountant.calibrate("ldp-label", dataset="l", probs=probs, labels=y, alpha=0.1,
                             epsilon=2, mondrian="label", public_groups=True,
                             subjects=[f"u{i}" for i in range(300)])
    with pytest.raises(InvalidInput, match="central method"):
        accountant.calibrate("fedcp-qq", dataset="l", scores=np.linspace(0, 1, 300),
                             agents=np.repeat(np.arange(3), 100), alpha=[0.1, 0.2])
    assert _state(accountant, "l") == before


def test_exponq_level_validation_is_per_level(acct: Accountant) -> None:
    probs, y = _data()
    with pytest.raises(InvalidInput, match="α ≤ 1/2"):
        acct.calibrate("exponq", dataset="d", probs=probs, labels=y, score="lac",
                       alpha=[0.1, 0.7], epsilon=1)


def test_audit_flags_a_tampered_group_threshold(acct: Accountant) -> None:
    probs, y = _data()
    rel = acct.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac", alpha=0.1,
                         rho=0.5, mondrian="label", public_groups=True, rng=Seeded(2))
    release = registry.get(rel.method).calibrator
    diag = dict(rel.diagnostics)
    diag["groups"] = [dict(g) for g in diag["groups"]]
    diag["groups"][0]["threshold"] = rel.threshold + 1.0
    assert release.check_record(release.Params.model_validate(rel.params),
                                _shape_of(rel), rel.threshold, diag)
    # a row edited in the database: the hash chain or the recomputation catches it
    with acct.ledger.engine.begin() as c:
        c.execute(text("UPDATE releases SET threshold = '0.5' WHERE id = :i"), {"i": rel.id})
    with pytest.raises(AuditFailed):
        acct.verify()


def _shape_of(rel: Any) -> Any:
    from privcal.calibrators.base import DataShape

    return DataShape.model_validate(rel.shape)


def test_dry_run_reads_group_sizes(acct: Accountant) -> None:
    from privcal.accountant.calibration import dry_run

    probs, y = _data()
    rep = dry_run(acct, "pcoqs", {"alpha": [0.1, 0.2], "rho": 0.5}, dataset="d", probs=probs,
                  labels=y, score="lac", mondrian="label", public_groups=True)
    assert rep.cost == {"kind": "zcdp", "rho": "1"}  # 2 levels × 0.5, over 3 classes once
    assert acct.budget("d").charges == 0


def test_regression_intervals_per_group_and_level(acct: Accountant) -> None:
    """Mondrian column groups and several levels on regression scores: each row's interval
    is f ± its group's threshold at the chosen level; label groups give no intervals."""
    rng = np.random.default_rng(4)
    n = 3000
    region = rng.choice(["calm", "noisy"], size=n, p=[0.6, 0.4])
    f = rng.normal(size=n)
    y = f + rng.normal(size=n) * np.where(region == "calm", 0.05, 0.3)
    rel = acct.calibrate("pcoqs", dataset="d", preds=f, targets=y, score="absolute",
                         alpha=[0.1, 0.2], rho=0.5, score_range=(0, 2), groups=region,
                         public_groups=True, rng=Seeded(8))
    assert rel.method == "mondrian:levels:pcoqs"
    rows = {(r["group"], r["alpha"]): r["threshold"] for r in rel.thresholds()}
    assert rows[("calm", 0.1)] < rows[("noisy", 0.1)]  # the noisy group's intervals are wider
    ft = rng.normal(size=20)
    gt = np.array(["calm", "noisy"] * 10)
    iv = rel.predict_interval(ft, alpha=0.1, groups=gt)
    t = np.array([rows[(g, 0.1)] for g in gt])
    assert np.allclose(iv[:, 0], ft - t) and np.allclose(iv[:, 1], ft + t)
    ev = rel.evaluate_interval(ft, ft, alpha=0.2, groups=gt)
    assert ev.n == 20
    with pytest.raises(InvalidInput, match="give the group of every row"):
        rel.predict_interval(ft, alpha=0.1)
    assert acct.verify().guarantees_recomputed == 1
