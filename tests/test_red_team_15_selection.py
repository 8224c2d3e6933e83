"""Red team 15 (local-DP sessions): every report honest, the recorded guarantee still fails
when *which* reports arrive depends on the data — users that do not answer when their score
is high, a round of LDP-CP-S filled by whoever answers on seeing the query, a forwarder
dropping 0-reports, a collector of LDP-CP-L dropping rows whose label the model finds
implausible (~0.80 coverage against a recorded 0.9). privcal cannot see why a report is
missing, so from LDP-CP-S 5 and LDP-CP-L 4 on the recorded guarantee states it
(``privcal.calibrators.participation``); releases of the earlier versions verify as they
were worded, and a new one without the clause does not.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from privcal import Release
from privcal.accountant import sessions as S
from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.calibrators.ldp_label import LDPLabel, LDPLabelParams
from privcal.calibrators.participation import UNSELECTED_LABELS, UNSELECTED_SCORES
from privcal.client import krr_many
from privcal.costs import parse_cost
from privcal.errors import AuditFailed
from tests.seeded import Seeded

CLAUSE = {"ldp-score": UNSELECTED_SCORES, "ldp-label": UNSELECTED_LABELS}


def _local(acct: Any) -> dict[str, Any]:
    acct.create_dataset("z", rho=10, subject_epsilon=100)
    s = np.random.default_rng(2).beta(2, 5, 3000)
    r = Seeded(0)
    probs = np.random.default_rng(3).dirichlet(np.ones(4), 3000)
    labels = np.random.default_rng(4).integers(0, 4, 3000)
    out = {
        "ldp-score": acct.calibrate("ldp-score", dataset="z", scores=s, alpha=0.1, epsilon=2,
                                    rng=r, subjects=[f"u{i}" for i in range(3000)]),
        "ldp-label": acct.calibrate("ldp-label", dataset="z", probs=probs, labels=labels,
                                    alpha=0.1, epsilon=2, rng=r,
                                    subjects=[f"v{i}" for i in range(3000)]),
    }
    # and a release made by a collection session: the case the red team measured
    info = S.open_session(acct, "ldp-score", dataset="z", alpha=0.1, epsilon=2, rounds=2,
                          group_size=20, lower=0, upper=1)
    for rnd in range(2):
        ids = [f"d{rnd}-{i}" for i in range(20)]
        S.submit_reports(acct, info.id, ids, [i % 2 for i in range(20)], [rnd] * 20)
    out["session"] = S.release_of(acct, info.id)
    return out


def test_every_local_release_states_that_which_reports_arrive_is_not_chosen_by_their_data(
        accountant: Any) -> None:
    acct = accountant
    rels = _local(acct)
    for what, rel in rels.items():
        name = "ldp-score" if what == "session" else what
        assert rel.calibrator_version == {"ldp-score": "5", "ldp-label": "4"}[name]
        for key in ("over", "statement"):
            assert CLAUSE[name] in getattr(rel.coverage, key), (what, key)
        assert Release.load(rel.model_dump_json()) == rel
    rep = acct.verify()
    assert (rep.guarantees_recomputed, rep.statements_not_compared) == (3, 0)


@pytest.mark.parametrize("name", ["ldp-score", "ldp-label"])
def test_the_previous_version_verifies_as_worded_and_a_new_one_without_the_clause_does_not(
        accountant: Any, name: str) -> None:
    from privcal.accountant.releases import record_release

    acct = accountant
    rel = _local(acct)[name]
    cov = rel.coverage.model_dump(mode="json")
    old = {**cov, **{k: cov[k].replace(f"; {CLAUSE[name]}", "") for k in ("over", "statement")}}
    assert old != cov
    def again(version: str) -> int:  # paid by charges of its own, as every local release
        paid = acct.charge_subjects("z", parse_cost(rel.privacy["cost"]),
                                    [f"{version}-{i}" for i in range(rel.shape["n"])])
        return record_release(acct.ledger, "z", _as_computed=True, method=name,
                              calibrator_version=version, threshold=rel.threshold,
                              params=rel.params, shape=rel.shape, coverage=old,
                              privacy=rel.privacy, diagnostics=rel.diagnostics,
                              charge_ids=[paid.charge_id]).id

    again({"ldp-score": "4", "ldp-label": "3"}[name])
    rep = acct.verify()  # its wording is the previous version's: compared, and it matches
    assert rep.statements_not_compared == 0
    bad = again(rel.calibrator_version)
    with pytest.raises(AuditFailed, match=f"release {bad} .*coverage.(over|statement)"):
        acct.verify()


def test_a_collector_that_drops_rows_by_their_data_breaks_the_label_guarantee() -> None:
    """Why the clause: LDP-CP-L with every label honest k-RR (k = 5, ε = 3, n = 20 000,
    α = 0.1, δ = 0.001), a calibrated model. The rows kept at random: every run covers its
    recorded 0.9. A collector dropping 40 % of the rows whose noisy label's score is above
    the median (label cleaning): the mean coverage over 12 seeded runs falls below 0.9 by
    more than five of its standard errors. Coverage is exact: E_x Σ_y P(y|x)·1{1−P(y|x) ≤ q}
    over 200 000 test points."""
    k, n, eps = 5, 20_000, 3.0

    def population(m: int, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        p = np.exp(gen.normal(0, 1.5, (m, k)))
        p /= p.sum(1, keepdims=True)
        return p, (p.cumsum(1) > gen.random((m, 1))).argmax(1)

    test, _ = population(200_000, np.random.default_rng(99))

    def coverage(q: float) -> float:
        return 1.0 if not math.isfinite(q) else float((test * (1 - test <= q)).sum(1).mean())

    cal, params = LDPLabel(), LDPLabelParams(alpha=0.1, epsilon=eps)
    lower = cal.guarantee(params, DataShape(n=n, k=k)).lower
    gen, rng = np.random.default_rng(31), random.Random(3)
    honest, cleaned = [], []
    for _ in range(12):
        p, y = population(2 * n, gen)
        noisy = krr_many(y, k, eps, gen)
        s = 1 - p[np.arange(p.shape[0]), noisy]
        drop = (s > np.median(s)) & (gen.random(p.shape[0]) < 0.4)
        for out, keep in ((honest, np.ones(p.shape[0], bool)), (cleaned, ~drop)):
            data = CalibrationInput(probs=p[keep][:n], labels=noisy[keep][:n])
            out.append(coverage(cal.calibrate(data, params, rng).threshold))
    assert min(honest) >= lower
    se = np.std(cleaned, ddof=1) / math.sqrt(len(cleaned))
    assert np.mean(cleaned) < lower - 5 * se
