"""Red team 6 (trust in participants): the coverage guarantees of the distributed methods
assume that every device or agent follows the protocol, and no recorded sentence said so.
One FedCP-QQ agent sending −1e300 set the released threshold (the plan's k was 1) under a
recorded "coverage ≥ 0.9"; 30% of LDP-CP-S devices always answering 1 gave 0.875 under a
recorded ≥ 0.9 at probability 0.999. privcal cannot check a randomized report, so the
recorded guarantee (``over`` and ``statement``) now states the assumption; the calibrator
versions were bumped (ldp-score 3, ldp-label 3, fedcp-qq and fedcp2-qq 1.1.0), and releases
of the previous versions, worded as they were, still verify by their numbers (their
sentences counted as not compared).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from privcal.accountant import sessions as S
from privcal.accountant.releases import record_release
from privcal.calibrators.federated_agent import fedcp2_qq_message, fedcp_qq_message
from privcal.calibrators.fedplan import Fed2Plan, FedPlan
from privcal.calibrators.participation import UNSELECTED_LABELS, UNSELECTED_SCORES
from privcal.costs import LocalDP, parse_cost
from privcal.errors import AuditFailed
from tests.seeded import Seeded

DEVICES = ("every device following the protocol (each report its randomizer's output on its "
           "own score; no Byzantine participants)")
USERS = ("every user following the protocol (each label its own k-RR output with this ε on "
         "its true label; no Byzantine participants)")
AGENTS = "every agent following the protocol (its message computed from its own data as specified)"
SHUFFLE = ("provided the round's other reports are their subjects' randomizer outputs, unknown "
           "to the adversary (no colluding or Byzantine participants)")
#: the installed versions, and the ones before the assumption was stated
NEW = {"ldp-score": "5", "ldp-label": "4", "fedcp-qq": "1.4.0", "fedcp2-qq": "1.6.0"}
OLD = {"ldp-score": "2", "ldp-label": "2", "fedcp-qq": "1.0.0", "fedcp2-qq": "1.0.0"}
PHRASE = {"ldp-score": DEVICES, "ldp-label": USERS, "fedcp-qq": AGENTS, "fedcp2-qq": AGENTS}


def _cov(rel: Any) -> dict[str, Any]:
    return rel.coverage if isinstance(rel.coverage, dict) else rel.coverage.model_dump(mode="json")


def _fed_session(acct: Any, method: str, malicious: float | None = None) -> Any:
    """A federated session of 10 agents with 100 U(0, 1) scores each; agent 0 sends
    ``malicious`` instead of its message when given."""
    kw: dict[str, Any] = (dict(epsilon=5.0, bins=50, lower=0, upper=1)
                          if method == "fedcp2-qq" else {})
    info = S.open_session(acct, method, dataset="h", alpha=0.1, agents=10, local_n=100, **kw)
    plan = (FedPlan.model_validate(info.plan) if method == "fedcp-qq"
            else Fed2Plan.model_validate(info.plan))
    g = np.random.default_rng(0)
    vals = []
    for j in range(10):
        s = g.uniform(size=100)
        v = (fedcp_qq_message(s, plan) if method == "fedcp-qq"  # type: ignore[arg-type]
             else fedcp2_qq_message(s, plan, random.Random(j)))  # type: ignore[arg-type]
        vals.append(malicious if j == 0 and malicious is not None else v)
    res = S.submit_reports(acct, info.id, [f"{method}-agent{j}" for j in range(10)], vals)
    assert res.accepted == 10
    return S.release_of(acct, info.id)


def _releases(acct: Any) -> dict[str, Any]:
    """One release of each method (ldp-score twice: plain and shuffled), on datasets h
    (federated, non-private allowed), z (local) and s (shuffled, an (ε, δ) cap)."""
    acct.create_dataset("h", epsilon=1, subject_epsilon=10, allow_nonprivate=True)
    acct.create_dataset("z", rho=10, subject_epsilon=100)
    acct.create_dataset("s", approx_epsilon=20, approx_delta=1e-5, delta=1e-7,
                        subject_epsilon=6)
    s = np.random.default_rng(2).beta(2, 5, 3000)
    r = Seeded(0)
    out = {m: _fed_session(acct, m) for m in ("fedcp-qq", "fedcp2-qq")}
    out["ldp-score"] = acct.calibrate("ldp-score", dataset="z", scores=s, alpha=0.1, epsilon=2,
                                      rng=r, subjects=[f"u{i}" for i in range(3000)])
    probs = np.random.default_rng(3).dirichlet(np.ones(4), 3000)
    labels = np.random.default_rng(4).integers(0, 4, 3000)
    out["ldp-label"] = acct.calibrate("ldp-label", dataset="z", probs=probs, labels=labels,
                                      alpha=0.1, epsilon=2, rng=r,
                                      subjects=[f"v{i}" for i in range(3000)])
    out["shuffled"] = acct.calibrate("ldp-score", dataset="s", scores=s, alpha=0.1, epsilon=2,
                                     rng=r, shuffled=True,
                                     subjects=[f"w{i}" for i in range(3000)])
    return out


def test_a_malicious_agent_release_states_the_assumption_it_breaks(accountant: Any) -> None:
    """The repro: one FedCP-QQ agent's −1e300 is the threshold (k = 1); the release may
    stand only because its guarantee says it holds if every agent follows the protocol."""
    acct = accountant
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    rel = _fed_session(acct, "fedcp-qq", malicious=-1e300)
    assert rel.threshold == -1e300 and rel.coverage.rank == 1
    assert AGENTS in rel.coverage.over and AGENTS in rel.coverage.statement
    assert rel.calibrator_version == NEW["fedcp-qq"]


def test_every_distributed_guarantee_states_honest_participants(accountant: Any) -> None:
    acct = accountant
    rels = _releases(acct)
    for method, rel in rels.items():
        name = "ldp-score" if method == "shuffled" else method
        cov = _cov(rel)
        assert PHRASE[name] in cov["over"], method
        assert PHRASE[name] in cov["statement"], method
        assert rel.calibrator_version == NEW[name], method
    assert SHUFFLE in rels["shuffled"].privacy["statement"]
    assert SHUFFLE not in rels["ldp-score"].privacy["statement"]  # not shuffled: no blanket
    rep = acct.verify()
    assert (rep.guarantees_recomputed, rep.statements_not_compared) == (len(rels), 0)


def _as_old(acct: Any, rel: Any, name: str, *, lower: float | None = None) -> int:
    """Re-record ``rel`` as a release of the previous calibrator version, worded as that
    version wrote it (the assumption removed from its sentences), paid by charges of its
    own; past the public API, which refuses a version other than the installed one."""
    cov = dict(_cov(rel))
    for key in ("over", "statement"):
        assert f", {PHRASE[name]}" in cov[key]
        # (and red team 15's clause on which reports arrive, which came later still)
        for later in (UNSELECTED_SCORES, UNSELECTED_LABELS):
            cov[key] = cov[key].replace(f"; {later}", "")
        cov[key] = cov[key].replace(f", {PHRASE[name]}", "")
    if lower is not None:
        cov["lower"] = lower
    if name == "fedcp2-qq":  # as 1.0.0 and 1.1.0 worded an agent's ε (red team 7)
        cov["details"] = {**cov["details"], "privacy": f"each agent {rel.params['epsilon']:g}"
                          "-DP w.r.t. its own scores (local DP at agent level)"}
    privacy = dict(rel.privacy)
    privacy["statement"] = privacy["statement"].replace(f", {SHUFFLE}", "")
    cost = parse_cost(privacy["cost"]) if privacy.get("cost") is not None else None
    ids: list[int] = []
    if isinstance(cost, LocalDP):
        used = len(rel.shape.get("group_sizes") or ()) or rel.shape["n"]
        central = privacy.get("central_cost")
        paid = acct.charge_subjects(
            rel.dataset, cost, [f"old{rel.id}-{i}" for i in range(used)],
            central_cost=parse_cost(central) if central is not None else None)
        ids = [paid.charge_id] + ([paid.central.charge_id] if paid.central is not None else [])
    return record_release(
        acct.ledger, rel.dataset, _as_computed=True, method=rel.method,
        calibrator_version=OLD[name], threshold=rel.threshold, params=rel.params,
        shape=rel.shape, coverage=cov, privacy=privacy, diagnostics=rel.diagnostics,
        charge_ids=ids).id


def test_releases_of_the_previous_versions_still_verify(ledger_url: str) -> None:
    """A release written by the previous version (its wording, without the assumption) is
    recomputed by the same formula: its numbers are compared, its sentences counted as not
    compared (two coverage sentences each; the shuffled one's privacy statement too)."""
    from privcal import Accountant, Ledger

    acct = Accountant(Ledger(ledger_url))
    acct.ledger.upgrade()
    rels = _releases(acct)
    for method, rel in rels.items():
        _as_old(acct, rel, "ldp-score" if method == "shuffled" else method)
    rep = acct.verify()
    assert rep.guarantees_recomputed == 2 * len(rels)
    assert rep.statements_not_compared == 2 * len(rels) + 1
    assert "not compared" in rep.summary
    # their numbers still are: an old release claiming more than its formula gives fails
    bad = _as_old(acct, rels["fedcp-qq"], "fedcp-qq", lower=0.95)
    with pytest.raises(AuditFailed, match=f"release {bad} .*coverage.lower"):
        acct.verify()


def test_a_new_release_without_the_assumption_does_not_verify(accountant: Any) -> None:
    """The installed version's sentences are compared: a release of version 1.1.0 worded
    like 1.0.0 (no assumption) is a false record, and verify names it."""
    acct = accountant
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    rel = _fed_session(acct, "fedcp-qq")
    cov = dict(_cov(rel))
    cov["statement"] = cov["statement"].replace(f", {AGENTS}", "")
    bad = record_release(acct.ledger, "h", _as_computed=True, method=rel.method,
                         calibrator_version=NEW["fedcp-qq"], threshold=rel.threshold,
                         params=rel.params, shape=rel.shape, coverage=cov,
                         privacy=rel.privacy, diagnostics=rel.diagnostics).id
    with pytest.raises(AuditFailed, match=f"release {bad} .*coverage.statement"):
        acct.verify()
