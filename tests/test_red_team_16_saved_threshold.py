"""Red team 16, F6: a saved P-COQS release whose threshold alone was edited (to 0.5, its
``diagnostics.interval`` still ending at the real one) loaded and covered 0.50 against 0.9;
an ExponQ threshold (a grid point the release's bins and bin index give) was not checked
either. A threshold its own diagnostics contradict is now refused in one line naming the
field, for P-COQS, ExponQ, FedCP²-QQ (the k-th smallest of its recorded messages) and each
run of a levels or Mondrian wrapper of them. A threshold edited together with the
diagnostics that give it (another grid point and its bin) stays consistent and loads: a
copy is not checked against its ledger (the module docstring of saved_release)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from privcal import Release
from privcal.errors import InvalidInput
from tests.seeded import Seeded
from tests.test_red_team_6_trust import _fed_session


def _load_edited(rel: Any, edit: Any) -> Any:
    doc = json.loads(rel.model_dump_json())
    edit(doc)
    return Release.load(json.dumps(doc))


def _refused(rel: Any, edit: Any, field: str) -> None:
    with pytest.raises(InvalidInput, match="not a consistent saved release: ") as e:
        _load_edited(rel, edit)
    assert "\n" not in str(e.value)
    assert field in str(e.value), str(e.value)


def _set(key: str, value: Any) -> Any:
    return lambda d: d.__setitem__(key, value)


def _diag(key: str, value: Any) -> Any:
    return lambda d: d["diagnostics"].__setitem__(key, value)


@pytest.fixture
def scores() -> np.ndarray:
    return np.random.default_rng(0).beta(2, 5, 3000)


def test_pcoqs_threshold_must_be_its_intervals_right_end(accountant: Any,
                                                         scores: np.ndarray) -> None:
    accountant.create_dataset("d", rho=10)
    rel = accountant.calibrate("pcoqs", dataset="d", scores=scores, alpha=0.1, rho=1,
                               rng=Seeded(0))
    left, right = rel.diagnostics["interval"]
    assert rel.threshold == right and rel.diagnostics["backed"] is True
    assert Release.load(rel.model_dump_json()) == rel
    _refused(rel, _set("threshold", 0.5), "threshold 0.5 is not the one diagnostics.interval")
    _refused(rel, _set("threshold", math.inf), "diagnostics.interval")  # unbacked, yet backed
    _refused(rel, _set("threshold", left), "diagnostics.interval")
    _refused(rel, _diag("target_rank", 10), "diagnostics.target_rank: recorded 10")
    _refused(rel, _diag("N", 3), "diagnostics.N")
    _refused(rel, _diag("backed", False), "diagnostics.backed")
    _refused(rel, _diag("interval", None), "diagnostics.interval")
    _refused(rel, lambda d: d["diagnostics"].pop("interval"), "diagnostics.interval")
    # the threshold and the interval edited together, off the search's grid: refused
    width = right - left

    def off_grid(d: dict[str, Any]) -> None:  # 0.5 itself is a grid point on [0, 1]
        d["threshold"] = 0.5 + width / 3
        d["diagnostics"]["interval"] = [0.5 + width / 3 - width, 0.5 + width / 3]
    _refused(rel, off_grid, "is not a cell of the search's grid")
    # onto another cell of the grid (its left end's neighbour below): consistent, loads
    lo = float(rel.params["lower"])
    cell = rel.diagnostics["interval"]
    below = [cell[0] - width, cell[0]] if cell[0] - width >= lo else None
    assert below is not None

    def consistent(d: dict[str, Any]) -> None:
        d["threshold"] = below[1]
        d["diagnostics"]["interval"] = below
    assert _load_edited(rel, consistent).threshold == below[1]


def test_pcoqs_infinite_release_records_no_interval(accountant: Any) -> None:
    accountant.create_dataset("d", rho=10)
    rel = accountant.calibrate("pcoqs", dataset="d", scores=np.random.default_rng(1).random(30),
                               alpha=0.05, rho=0.01, rng=Seeded(0))
    assert rel.threshold == math.inf and rel.diagnostics["interval"] is None
    assert Release.load(rel.model_dump_json()) == rel
    _refused(rel, _set("threshold", 0.5), "the threshold is +inf")


def test_exponq_threshold_must_be_its_grid_point(accountant: Any, scores: np.ndarray) -> None:
    from privcal.calibrators.mechanisms.exponential import grid

    accountant.create_dataset("d", epsilon=10)
    rel = accountant.calibrate("exponq", dataset="d", scores=scores, alpha=0.1, epsilon=1,
                               rng=Seeded(0))
    d = rel.diagnostics
    points = grid(rel.params["lower"], rel.params["upper"], d["bins"])
    assert rel.threshold == points[d["bin"]] and not d["top_bin"]
    assert Release.load(rel.model_dump_json()) == rel
    _refused(rel, _set("threshold", 0.5), f"threshold 0.5 is not grid point {d['bin']}")
    _refused(rel, _set("threshold", math.inf), "is not grid point")
    _refused(rel, _diag("bin", d["bin"] + 1), "is not grid point")
    _refused(rel, _diag("bin", d["bins"]), "diagnostics.bin")
    _refused(rel, _diag("top_bin", True), "diagnostics.top_bin")
    _refused(rel, _diag("bins", d["bins"] * 2), "diagnostics.bins")
    _refused(rel, lambda doc: doc["diagnostics"].pop("bin"), "diagnostics.bin")

    def consistent(doc: dict[str, Any]) -> None:  # another grid point and its bin: loads
        doc["threshold"] = float(points[d["bin"] - 5])
        doc["diagnostics"]["bin"] = d["bin"] - 5
    assert _load_edited(rel, consistent).threshold == points[d["bin"] - 5]


def test_fedcp2_qq_threshold_must_be_its_kth_message(accountant: Any) -> None:
    accountant.create_dataset("h", epsilon=1, subject_epsilon=10, allow_nonprivate=True)
    rel = _fed_session(accountant, "fedcp2-qq")
    msgs, k = rel.diagnostics["messages"], rel.diagnostics["k"]
    assert Release.load(rel.model_dump_json()) == rel
    assert rel.threshold in (sorted(msgs)[k - 1], math.inf)
    _refused(rel, _set("threshold", -1.0), "is not the k = ")
    _refused(rel, _diag("messages", "none"), "diagnostics")


def test_wrapped_runs_are_checked(accountant: Any, scores: np.ndarray) -> None:
    accountant.create_dataset("d", rho=10)
    lv = accountant.calibrate("pcoqs", dataset="d", scores=scores, alpha=[0.2, 0.1], rho=1,
                              rng=Seeded(0))
    assert lv.method == "levels:pcoqs"
    assert Release.load(lv.model_dump_json()) == lv

    def raw(doc: dict[str, Any]) -> None:  # the largest level's raw and nested thresholds
        level = doc["diagnostics"]["levels"][1]
        level["threshold_raw"] = level["threshold"] = 0.01
    alpha = lv.diagnostics["levels"][1]["alpha"]
    _refused(lv, raw, f"level α = {alpha}: threshold 0.01 is not the one diagnostics.interval")
    probs = np.random.default_rng(3).dirichlet(np.ones(3), 3000)
    labels = np.random.default_rng(4).integers(0, 3, 3000)
    mo = accountant.calibrate("pcoqs", dataset="d", probs=probs, labels=labels, score="lac",
                              alpha=0.1, rho=1, mondrian="label", public_groups=True,
                              rng=Seeded(1))
    assert mo.method == "mondrian:pcoqs"
    assert Release.load(mo.model_dump_json()) == mo

    def group(doc: dict[str, Any]) -> None:
        groups = doc["diagnostics"]["groups"]
        groups[0]["threshold"] = 0.01
    _refused(mo, group, f"group {mo.diagnostics['groups'][0]['group']}: threshold 0.01")


def test_a_search_narrower_than_a_float_step_still_loads(accountant: Any) -> None:
    """Review R1: past ~2.3e5 at the default tol the search's interval collapses to a point
    ([x, x]: mid rounds to an end), which is no dyadic cell; such releases were refused as
    edited. The check follows the search in floats; an edited threshold is still refused."""
    acct = accountant
    acct.create_dataset("d", rho=1)
    g = np.random.default_rng(0)
    f = g.uniform(1e6, 9e6, 3000)
    y = f + g.normal(0, 5e6, 3000)
    rel = acct.calibrate("pcoqs", dataset="d", preds=f, targets=y, score="absolute", alpha=0.1,
                         rho=0.2, score_range=(0, 20_000_000), rng=Seeded(0))
    left, right = rel.diagnostics["interval"]
    assert left == right == rel.threshold  # collapsed
    assert Release.load(rel.model_dump_json()) == rel
    _refused(rel, _set("threshold", rel.threshold + 1), "threshold")
    _refused(rel, lambda d: d["diagnostics"].__setitem__("interval", [left - 1, right]),
             "diagnostics.interval")
