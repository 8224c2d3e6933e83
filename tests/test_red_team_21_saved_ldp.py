"""Red team 21, readme F1: ``Release.load`` refuses a saved file whose threshold its own
diagnostics contradict — the README says so — but checked only P-COQS, ExponQ and FedCP²-QQ:
an ldp-label file recording ``trivial`` (its target above 1: only +∞ can be released) and an
ldp-score file whose rounds never asked about its threshold both loaded with an edited
threshold of 0.05 under their recorded coverage 0.9."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from privcal import Accountant, Ledger, Release
from privcal.errors import InvalidInput


@pytest.fixture(scope="module")
def acct() -> Accountant:
    a = Accountant(Ledger("sqlite://"))
    a.create_dataset("d", epsilon=1, subject_epsilon=10)
    return a


def _edited(rel: Release, **changes: Any) -> str:
    doc = json.loads(rel.model_dump_json())
    for key, value in changes.items():
        if key.startswith("diagnostics."):
            doc["diagnostics"][key.split(".", 1)[1]] = value
        else:
            doc[key] = value
    return json.dumps(doc)


def test_ldp_label(acct: Accountant) -> None:
    g = np.random.default_rng(0)
    trivial = acct.calibrate("ldp-label", dataset="d", probs=g.dirichlet(np.ones(10), 300),
                             labels=g.integers(0, 10, 300), score="lac", alpha=0.1, epsilon=2,
                             subjects=[f"u{i}" for i in range(300)])
    assert trivial.threshold == math.inf and trivial.diagnostics["trivial"] is True
    assert Release.load(trivial.model_dump_json()) == trivial  # as saved: loads
    with pytest.raises(InvalidInput, match=r"exceeds 1 .* so the threshold is \+inf"):
        Release.load(_edited(trivial, threshold=0.05))
    with pytest.raises(InvalidInput, match=r"diagnostics.trivial"):
        Release.load(_edited(trivial, **{"diagnostics.trivial": False}))
    with pytest.raises(InvalidInput, match=r"diagnostics.calibration_target: recorded 0.9"):
        Release.load(_edited(trivial, threshold=0.05,
                             **{"diagnostics.trivial": False,
                                "diagnostics.calibration_target": 0.9}))
    finite = acct.calibrate("ldp-label", dataset="d", probs=g.dirichlet(np.ones(3), 20000),
                            labels=g.integers(0, 3, 20000), score="lac", alpha=0.2,
                            epsilon=4, subjects=[f"w{i}" for i in range(20000)])
    assert finite.threshold < math.inf
    assert Release.load(finite.model_dump_json()) == finite
    with pytest.raises(InvalidInput, match=r"diagnostics.trivial"):
        Release.load(_edited(finite, threshold=math.inf))


def test_ldp_score(acct: Accountant) -> None:
    g = np.random.default_rng(0)
    rel = acct.calibrate("ldp-score", dataset="d", scores=g.random(20000), alpha=0.1,
                         epsilon=2, subjects=[f"v{i}" for i in range(20000)])
    assert rel.threshold < math.inf
    assert Release.load(rel.model_dump_json()) == rel
    queries = [h["query"] for h in rel.diagnostics["history"]]
    assert 0.05 not in queries
    with pytest.raises(InvalidInput, match=r"is not the one diagnostics.history releases"):
        Release.load(_edited(rel, threshold=0.05))
    other = next(q for q in queries if q != rel.threshold)  # asked, but not released
    with pytest.raises(InvalidInput, match=r"is not the one diagnostics.history releases"):
        Release.load(_edited(rel, threshold=other))
