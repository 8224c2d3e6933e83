"""Red team 9: ledgers written by older privcal versions, upgraded (and downgraded) by this
one (review r9b). Each test states the attack and what is true now."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import text

from privcal import Accountant, Ledger
from privcal.costs import ZCDP
from privcal.errors import BudgetRefused, InvalidInput, LedgerError
from tests.seeded import Seeded


def _revision(ledger: Ledger) -> str:
    with ledger.engine.connect() as conn:
        return str(conn.execute(text("SELECT version_num FROM alembic_version")).scalar())


def _tables(ledger: Ledger) -> dict[str, Any]:
    from sqlalchemy import inspect

    names = sorted(inspect(ledger.engine).get_table_names())
    with ledger.engine.connect() as conn:
        return {n: sorted(map(tuple, conn.execute(text(f'SELECT * FROM "{n}"'))), key=repr)
                for n in names}


# ------------------------------------------------------------ F1: a downgrade below 0005
@pytest.mark.parametrize("target", ["0004", "0001"])
def test_a_downgrade_below_0005_that_would_lose_subjects_is_refused(
        ledger_url: str, target: str) -> None:
    """Attack: charge subject alice her whole cap (1), downgrade to 0004 and upgrade again:
    0005's downgrade dropped the ledger's subject secret and the charges' digests, its
    upgrade keyed the stored pseudonyms again under a new secret — alice's spend read 0
    and she was charged 1 more (2 against a cap of 1), and ``audit verify`` failed for
    good ("row edited"). Now the downgrade is refused in one line before anything
    changes: the revision, every table's rows and the verification are as they were."""
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct = Accountant(ledger)
    acct.create_dataset("s", rho=10, subject_epsilon=1)
    acct.charge_subjects("s", "1", ["alice"])
    before, rev = _tables(ledger), _revision(ledger)
    with pytest.raises(LedgerError) as err:
        ledger.downgrade(target)
    msg = str(err.value)
    assert "\n" not in msg and "below 0005" in msg and "per-subject spends" in msg
    assert "nothing was changed" in msg
    assert _revision(ledger) == rev and _tables(ledger) == before
    assert acct.verify().entries > 0
    with pytest.raises(BudgetRefused):
        acct.charge_subjects("s", "1", ["alice"])
    ledger.close()


def test_a_downgrade_below_0005_of_a_ledger_without_subject_rows_still_runs(
        ledger_url: str) -> None:
    """What 0005 added is empty (plain charges, no idempotency key): nothing is lost, the
    round trip is allowed and verifies (as tests/test_filter_reporting.py's does)."""
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct = Accountant(ledger)
    acct.create_dataset("z", rho=1)
    acct.charge("z", ZCDP(rho="0.1"))
    ledger.downgrade("0004")
    assert _revision(ledger) == "0004"
    ledger.upgrade()
    assert acct.verify().charges == 1
    ledger.close()


# ------------------------------------------------- F2: a pre-0005 local-DP batch's replay
def _as_before_0005(ledger: Ledger, *, members: bool) -> None:
    """The charges as a ledger written before 0005 holds them: no request digest (and,
    unless ``members``, no record of who a batch charged)."""
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE charges SET request_digest = NULL"))
        if not members:
            conn.execute(text("UPDATE charges SET members_digest = NULL"))
            conn.execute(text("DELETE FROM charge_members"))


def test_a_pre_0005_batch_key_reused_for_other_subjects_is_not_a_replay(
        accountant: Any) -> None:
    """Attack: on a ledger written before 0005 (no request digest, no members), reuse a
    local-DP batch's key with other ids: the replay matched its scope and ε0 only and
    answered "replayed, accepted 3" for ``["alice", "zed"]`` — zed never charged, so a
    caller releasing zed's data past his cap believed it paid for. Now refused in one line,
    nothing charged, whatever the ids (who it charged is unknown)."""
    acct = accountant
    acct.create_dataset("l", rho=1, subject_epsilon=10)
    acct.charge_subjects("l", "0.5", ["alice", "bob", "carl"], idempotency_key="k")
    _as_before_0005(acct.ledger, members=False)
    for ids in (["alice", "zed"], [f"x{i}" for i in range(10)], ["zed", "zed"],
                ["alice", "bob", "carl"]):
        with pytest.raises(InvalidInput) as err:
            acct.charge_subjects("l", "0.5", ids, idempotency_key="k")
        assert "'k'" in str(err.value) and "\n" not in str(err.value)
    assert acct.subject_spend("l", "zed") == 0 and acct.subject_spend("l", "alice") == 0.5


def test_a_pre_0005_batch_with_members_replays_only_its_own_request(accountant: Any) -> None:
    """With who it charged known (members) but no request digest: the same ids replay (who
    was charged recovered); fewer or other ids are refused (their count, or a charged
    subject missing from them)."""
    acct = accountant
    acct.create_dataset("l", rho=1, subject_epsilon=10)
    first = acct.charge_subjects("l", "0.5", ["alice", "bob", "carl"], idempotency_key="k")
    _as_before_0005(acct.ledger, members=True)
    again = acct.charge_subjects("l", "0.5", ["alice", "bob", "carl"], idempotency_key="k")
    assert again.replayed and again.charge_id == first.charge_id
    assert again.accepted == 3 and again.rejected_over_cap == 0
    assert again.accepted_mask is not None and again.accepted_mask.all()
    for ids in (["alice", "zed"], ["alice", "bob", "zed"], ["alice", "bob", "carl", "dan"]):
        with pytest.raises(InvalidInput, match="already used for a different"):
            acct.charge_subjects("l", "0.5", ids, idempotency_key="k")
    assert acct.subject_spend("l", "zed") == 0 and acct.subject_spend("l", "dan") == 0


# ------------------------------- r9a F2: a several-level Mondrian release with a tiny group
@pytest.mark.parametrize("method", ["split", "pcoqs"])
def test_a_group_too_small_to_run_has_its_bound_at_every_level(method: str) -> None:
    """Attack (review r9a): a Mondrian release at several levels in which one group has a
    single record (too few for the method: +inf, the set of every label): its bound read
    NaN in ``thresholds()`` at every level, the release's overall bound became NaN, and
    ``evaluate`` called every such release "BELOW and inconsistent" (a coverage of 1.0
    a failure). Its recorded bound (1: +inf covers) holds at every level now."""
    import math

    import numpy as np

    acct = Accountant(Ledger("sqlite://"))
    acct.create_dataset("d", rho=4, allow_nonprivate=True)
    g = np.random.default_rng(0)
    probs = g.dirichlet(np.ones(3), size=400)
    labels = np.array([g.choice(3, p=p) for p in probs])
    site = np.where(np.arange(400) == 0, "tiny", "big")
    kw = {"rho": 0.5} if method == "pcoqs" else {}
    rel = acct.calibrate(method, dataset="d", probs=probs, labels=labels, score="lac",
                         alpha=[0.1, 0.2], groups=site, public_groups=True,
                         rng=Seeded(1), **kw)
    tiny = [r for r in rel.thresholds() if r["group"] == "tiny"]
    assert [(r["alpha"], r["threshold"], r["lower"]) for r in tiny] == [
        (0.1, math.inf, 1.0), (0.2, math.inf, 1.0)]
    big = [r for r in rel.thresholds() if r["group"] == "big"]
    assert all(0 < r["lower"] < 1 for r in big)
    for a in (0.1, 0.2):
        ev = rel.evaluate(probs, labels, alpha=a, groups=site)
        want = min(r["lower"] for r in big if r["alpha"] == a)
        assert ev.guaranteed_lower == want
        (small,) = [b for b in ev.by_group if b.group == "tiny"]
        assert small.guaranteed_lower == 1.0 and small.meets_guarantee


# ------------------------------- r9a F1: evaluating one release against a marginal bound
def test_a_marginal_guarantee_is_not_called_contradicted_by_one_release() -> None:
    """Attack (review r9a): ``evaluate`` (API and CLI) compared one release's test-set
    coverage with a *marginal* bound — an average over calibration sets — and printed
    "BELOW and inconsistent with the recorded guarantee" for 37–52 % of honest split and
    P-COQS releases (20 000 test points each): one release's coverage is Beta(r, n+1−r)
    for split, below 1−α about half the time. Now the evaluation says its guarantee is
    marginal and the verdict that a shortfall is no evidence against it; a per-release
    bound (LDP-CP-L, LDP-CP-S: with probability ≥ 1−δ over the calibration data) keeps
    "BELOW and inconsistent"."""
    import numpy as np

    from privcal.calibrators.evaluation import evaluate_sets, is_marginal
    from privcal.cli.render import guarantee_verdict

    acct = Accountant(Ledger("sqlite://"))
    acct.create_dataset("d", epsilon=10, subject_epsilon=10, allow_nonprivate=True)
    g = np.random.default_rng(5)
    cal = g.dirichlet(np.ones(3), size=19)
    lucky = np.argmax(cal, axis=1)  # a calibration set whose labels were easy
    rel = acct.calibrate("split", dataset="d", probs=cal, labels=lucky, score="lac",
                         alpha=0.1)
    test = g.dirichlet(np.ones(3), size=20_000)
    y = np.array([g.choice(3, p=p) for p in test])
    ev = rel.evaluate(test, y)
    assert ev.marginal and is_marginal(rel.coverage)
    assert not ev.meets_guarantee and not ev.consistent_with_guarantee
    verdict = guarantee_verdict(ev)
    assert "inconsistent" not in verdict and "evidence against it" in verdict
    # Markov (red team 12) on the miss rate at some v < L, plus the binomial tail of the
    # test points at v (red team 19): at least (1 − L)/(1 − k/m); at most its value at the
    # 95% upper bound u, where that tail is 0.05
    low = (1 - ev.guaranteed_lower) / (1 - ev.coverage)
    high = (1 - ev.guaranteed_lower) / (1 - ev.coverage_upper_95) + 0.05
    said = float(re.search(r"probability at most (\S+) under it", verdict).group(1))
    assert "Markov's inequality" in verdict  # no release given: no rank to use
    assert 0.99 * min(1.0, low) <= said <= 1.01 * min(1.0, high)  # printed to 2 digits
    assert "marginal" in ev.note
    ldp = acct.calibrate("ldp-label", dataset="d", probs=test[:2000], labels=y[:2000],
                         subjects=np.arange(2000), alpha=0.1, epsilon=2,
                         rng=Seeded(3))
    assert not is_marginal(ldp.coverage)
    sets = np.zeros((100, 3), dtype=bool)
    sets[:, 0] = True
    labels = np.r_[np.zeros(50, int), np.ones(50, int)]
    per_release = evaluate_sets(sets, labels, 0.9, marginal=False)
    assert guarantee_verdict(per_release) == "BELOW and inconsistent with the recorded guarantee"
    assert "marginal" not in per_release.note


def test_an_interval_evaluation_knows_its_guarantee_is_marginal() -> None:
    import numpy as np

    from privcal.calibrators.evaluation import is_marginal
    from privcal.cli.render import guarantee_verdict

    acct = Accountant(Ledger("sqlite://"))
    acct.create_dataset("d", epsilon=10, allow_nonprivate=True)
    g = np.random.default_rng(2)
    preds = g.normal(size=19)
    rel = acct.calibrate("split", dataset="d", preds=preds, targets=preds + 0.1 * g.normal(
        size=19), score="absolute", alpha=0.1)
    tp = g.normal(size=5000)
    ev = rel.evaluate_interval(tp + g.normal(size=5000), tp)  # wider residuals than seen
    assert ev.marginal and is_marginal(rel.coverage) and not ev.consistent_with_guarantee
    assert "evidence against it" in guarantee_verdict(ev)
    assert "Markov's inequality" in guarantee_verdict(ev)
