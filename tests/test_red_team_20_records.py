"""Red team 20, service F1: a whole number past ±(2⁵³ − 1), which JSON (and so the audit
log's RFC 8785 form) cannot hold exactly, reached the record unchecked — a raps λ of 2**60 or
a k_reg of 2**53 on a P-COQS run was *charged*, then failed to be recorded (a raw
IntegerDomainError; a 500 on the service), and a λ of 10**40 crashed the score with an
OverflowError. Each is now a one-line InvalidInput before anything is charged."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from privcal import Accountant, Ledger
from privcal.accountant.normalize import MAX_JSON_INT, json_safe, request_digest
from privcal.errors import InvalidInput


def _ledger() -> tuple[Accountant, np.ndarray, np.ndarray]:
    acct = Accountant(Ledger("sqlite://"))
    acct.create_dataset("d", rho=5, subject_epsilon=5, allow_nonprivate=True)
    g = np.random.default_rng(0)
    return acct, g.dirichlet(np.ones(10), size=200), g.integers(0, 10, 200)


@pytest.mark.parametrize(("options", "said"), [
    ({"lam": 2**60}, "is a whole number past 2**53 − 1"),
    ({"lam": 10**40}, "= 1e+40 is a whole number past 2**53 − 1"),
    ({"k_reg": 2**53}, "raps k_reg must be at most 2**53 − 1"),
])
@pytest.mark.parametrize("method", ["pcoqs", "split"])
def test_a_score_option_json_cannot_record_is_refused_before_the_charge(
        method: str, options: dict[str, Any], said: str) -> None:
    acct, probs, labels = _ledger()
    params: dict[str, Any] = {"rho": 0.1} if method == "pcoqs" else {}
    with pytest.raises(InvalidInput, match=re.escape(said)):
        acct.calibrate(method, dataset="d", alpha=0.1, probs=probs, labels=labels,
                       score="raps", score_options=options, **params)
    assert acct.budget("d").charges == 0 and acct.releases("d") == []


def test_the_largest_recordable_options_run_and_are_recorded_as_given() -> None:
    """At the edge itself: λ = 2**53 − 1 (as an integer) and k_reg = 2**53 − 1 run, are
    recorded exactly and verify; λ as an integer scores as the same λ as a float does."""
    acct, probs, labels = _ledger()
    rel = acct.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.1, probs=probs,
                         labels=labels, score="raps",
                         score_options={"lam": MAX_JSON_INT, "k_reg": 9})
    assert rel.diagnostics["score"]["options"]["lam"] == MAX_JSON_INT
    wide = acct.calibrate("split", dataset="d", alpha=0.1, probs=probs, labels=labels,
                          score="raps", score_options={"k_reg": MAX_JSON_INT})
    assert wide.diagnostics["score"]["options"]["k_reg"] == MAX_JSON_INT
    fixed = {"k_reg": 1, "randomized": False}
    as_int, as_float = (acct.calibrate(
        "split", dataset="d", alpha=0.1, probs=probs, labels=labels, score="raps",
        score_options={**fixed, "lam": lam}) for lam in (2**40, float(2**40)))
    assert as_int.threshold == as_float.threshold > 2**40
    assert acct.verify().releases == 4


def test_json_safe_refuses_what_json_cannot_hold_and_keeps_the_rest() -> None:
    assert json_safe({"a": [MAX_JSON_INT, -MAX_JSON_INT]}) == {"a": [MAX_JSON_INT,
                                                                   -MAX_JSON_INT]}
    for big in (MAX_JSON_INT + 1, -MAX_JSON_INT - 1, 10**40):
        with pytest.raises(InvalidInput, match=r"past ±\(2\*\*53 − 1\)"):
            json_safe({"params": {"x": big}})
        with pytest.raises(InvalidInput):  # an idempotency digest: one line, not a 500
            request_digest({"x": big})


def test_another_requesters_key_is_never_its_replay() -> None:
    """Red team 20, service F3: two requesters on one ledger who pick the same idempotency
    key — bob's charge was answered with alice's receipt (replayed, nothing recorded: the
    budget short by bob's run), and bob's calibration on his own scores with alice's
    release (covering 46 % of his data against its recorded 0.9). The key now binds the
    requester too: bob is refused, and alice's own retry still replays."""
    from privcal.costs import ZCDP, LocalDP

    acct, _, _ = _ledger()
    first = acct.charge("d", ZCDP(rho="0.1"), purpose="p", requester="alice",
                        idempotency_key="job-42")
    with pytest.raises(InvalidInput, match="idempotency key 'job-42' was already used"):
        acct.charge("d", ZCDP(rho="0.1"), purpose="p", requester="bob",
                    idempotency_key="job-42")
    again = acct.charge("d", ZCDP(rho="0.1"), purpose="p", requester="alice",
                        idempotency_key="job-42")
    assert again.replayed and again.charge_id == first.charge_id
    scores = np.random.default_rng(1).random(300)
    rel = acct.calibrate("exponq", dataset="d", alpha=0.1, epsilon=0.5, scores=scores / 2,
                         requester="alice", idempotency_key="cal-1")
    with pytest.raises(InvalidInput, match="idempotency key 'cal-1' was already used"):
        acct.calibrate("exponq", dataset="d", alpha=0.1, epsilon=0.5, scores=scores,
                       requester="bob", idempotency_key="cal-1")
    assert acct.calibrate("exponq", dataset="d", alpha=0.1, epsilon=0.5, scores=scores / 2,
                          requester="alice", idempotency_key="cal-1").id == rel.id
    assert acct.budget("d").charges == 2
    ids = [f"u{i}" for i in range(50)]
    acct.charge_subjects("d", LocalDP(eps0=1), ids,
                         requester="alice", idempotency_key="batch")
    with pytest.raises(InvalidInput, match="idempotency key 'batch' was already used"):
        acct.charge_subjects("d", LocalDP(eps0=1), ids,
                             requester="bob", idempotency_key="batch")


def test_a_private_run_refuses_a_seeded_generator_before_the_charge() -> None:
    """Red team 20, privacy F2: with ``rng=random.Random(1)`` (as the README's example had
    it) P-COQS released one threshold when the substituted record was ≤ 0.9 and another
    when ≥ 0.91, every time — the two neighbours told apart with certainty, beside a
    recorded (3.54, 1e-6)-DP. Now refused, nothing charged; the CSPRNG and any
    SystemRandom are taken; a non-private run still takes a seeded generator."""
    import random
    import secrets

    acct, probs, labels = _ledger()
    scores = np.random.default_rng(0).random(500)
    for method, params in (("pcoqs", {"rho": 0.1}), ("exponq", {"epsilon": 0.5})):
        with pytest.raises(InvalidInput, match="a private run needs noise no one can predict"):
            acct.calibrate(method, dataset="d", alpha=0.1, scores=scores,
                           rng=random.Random(1), **params)
    with pytest.raises(InvalidInput, match="a private run needs noise no one can predict"):
        acct.calibrate("ldp-label", dataset="d", alpha=0.1, epsilon=2, probs=probs,
                       labels=labels, subjects=[f"u{i}" for i in range(200)],
                       rng=random.Random(1))
    assert acct.budget("d").charges == 0 and acct.releases("d") == []
    acct.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.1, scores=scores,
                   rng=secrets.SystemRandom())
    acct.calibrate("split", dataset="d", alpha=0.1, scores=scores, rng=random.Random(1))
    assert acct.budget("d").charges == 1 and len(acct.releases("d")) == 2


@pytest.mark.parametrize(("role", "binding", "said"), [
    ("admin", {"session": 1}, "an admin token takes no session"),
    ("auditor", {"datasets": ["d"]}, "an auditor token takes no dataset"),
    ("device", {"datasets": ["d"], "session": 1, "subject": "s"},
     "a device token takes no dataset"),
])
def test_a_roles_article_is_its_own(role: str, binding: dict[str, Any], said: str) -> None:
    """Red team 20, service F6: "a admin token takes no session"."""
    from privcal.storage.tokens import check_bindings

    kw: dict[str, Any] = {"datasets": [], "session": None, "subject": None, "agent": None,
                          **binding}
    with pytest.raises(InvalidInput, match=f"^{said}$"):
        check_bindings(role, **kw)


def test_a_request_recorded_before_the_requester_was_bound_still_replays_for_its_requester(
        tmp_path: Any) -> None:
    """The review of service F3: a keyed charge with a requester recorded by the privcal
    before (its digest without the requester), retried after the upgrade by the same
    requester, was told it was "a different charge or request"; it replays — and another
    requester is still refused."""
    import sqlite3

    from privcal.accountant.normalize import cost_json
    from privcal.costs import ZCDP

    path = tmp_path / "l.sqlite"
    acct = Accountant(Ledger(f"sqlite:///{path}"))
    acct.create_dataset("d", rho=1)
    cost = ZCDP(rho="0.1")
    first = acct.charge("d", cost, purpose="nightly", requester="etl", idempotency_key="job-7")
    acct.ledger.close()
    before = request_digest({"kind": "charge", "purpose": "nightly", "dataset": "d",
                             "cost": cost_json(cost)})  # what the earlier privcal stored
    with sqlite3.connect(path) as conn:
        conn.execute("update charges set request_digest = ? where id = ?",
                      (before, first.charge_id))
    acct = Accountant(Ledger(f"sqlite:///{path}"))
    again = acct.charge("d", cost, purpose="nightly", requester="etl", idempotency_key="job-7")
    assert again.replayed and again.charge_id == first.charge_id
    with pytest.raises(InvalidInput, match="idempotency key 'job-7' was already used"):
        acct.charge("d", cost, purpose="nightly", requester="other", idempotency_key="job-7")
    assert acct.budget("d").charges == 1
