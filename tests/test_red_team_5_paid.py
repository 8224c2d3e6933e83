"""Red team 5, second review: "every release is paid for", closed for real.

F1: a local-DP release was "paid for" by a per-subject charge on one subject (only ε0 was
compared): its per-subject charges must have charged as many subjects as it used reports.
F2: a new release could switch the sentence comparison off (no ``neighbouring``, or an
older ``calibrator_version``): ``record_release`` refuses a version other than the
installed one and sentences other than those the installed code recomputes. F3: which
release a charge paid for is the table ``release_charges`` (primary key on the charge),
checked by verify against the releases' ``charge_ids``. S1: a charge an open collection
session made cannot pay for another release.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal.accountant import releases
from privcal.accountant import sessions as S
from privcal.accountant.verification import check_release
from privcal.costs import ZCDP
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage.audit import release_doc, threshold_str

N = 60


def _local_release(acct: Any) -> Any:
    acct.create_dataset("a", epsilon=10, subject_epsilon=20)
    scores = np.random.default_rng(1).beta(2, 5, N)
    return acct.calibrate("ldp-score", dataset="a", scores=scores, subjects=np.arange(N),
                          alpha=0.1, epsilon=2)


def _again(acct: Any, rel: Any, dataset: str, charge_ids: list[int], **over: Any) -> Any:
    kw: dict[str, Any] = dict(
        method=rel.method, calibrator_version=rel.calibrator_version,
        threshold=float(rel.threshold), params=rel.params, shape=rel.shape,
        coverage=rel.coverage, privacy=rel.privacy, diagnostics=rel.diagnostics,
        distribution=rel.distribution, distribution_version=rel.distribution_version,
        charge_ids=charge_ids)
    kw.update(over)
    return acct.record_release(dataset, **kw)


def test_a_local_release_needs_a_charge_for_every_report_it_used(accountant: Any) -> None:
    acct = accountant
    rel = _local_release(acct)
    assert rel.shape["n"] == N
    acct.create_dataset("b", epsilon=10, subject_epsilon=20)
    one = acct.charge_subjects("b", 2, ["only-one-subject"]).charge_id
    with pytest.raises(InvalidInput, match=f"used {N} reports, one per subject, but its "
                                           r"per-subject charges \[\d+\] charged 1 subjects"):
        _again(acct, rel, "b", [one])
    assert len(acct.ledger.releases("b")) == 0
    many = acct.charge_subjects("b", 2, [f"s{i}" for i in range(N)]).charge_id
    _again(acct, rel, "b", [many])
    assert acct.verify().guarantees_recomputed == 2


def test_verify_finds_a_local_release_paid_by_too_few_subjects(accountant: Any) -> None:
    """Written past record_release (an older privcal's row): the storage's check and the
    recomputation both report it."""
    acct = accountant
    rel = _local_release(acct)
    one = acct.charge_subjects("a", 2, ["x"]).charge_id
    fields = {k: getattr(rel, k) for k in ("method", "calibrator_version", "distribution",
                                           "distribution_version", "params", "shape",
                                           "privacy", "diagnostics", "requester")}
    fields["coverage"] = rel.coverage.model_dump(mode="json")
    fields["threshold"] = threshold_str(float(rel.threshold))

    def tx(s: Any) -> int:
        ds = acct.ledger.lock_dataset(s, "a")
        row = acct.ledger.insert_release(s, ds.id, fields, [one])
        acct.ledger.append_audit(s, "release", release_doc(row, ds.name))
        return int(row.id)

    rid = acct.ledger.write(tx)
    with pytest.raises(AuditFailed, match=f"release {rid} used {N} reports"):
        acct.ledger.verify()
    bad = check_release(acct, acct.ledger.release(rid))
    assert any(f"used {N} reports" in p for p in bad.problems)


def _pcoqs(acct: Any) -> Any:
    acct.create_dataset("z", rho=1)
    return acct.calibrate("pcoqs", dataset="z", scores=np.random.default_rng(1).beta(2, 5, 500),
                          alpha=0.1, rho=0.1)


def test_record_release_refuses_sentences_the_installed_code_does_not_state(
        accountant: Any) -> None:
    acct = accountant
    rel = _pcoqs(acct)
    cov = rel.coverage.model_dump(mode="json")
    cov["statement"] = "with probability 1, at least 99.99% of test points are covered"
    priv = copy.deepcopy(rel.privacy)
    priv["statement"] = "(0.0001, 0)-DP: essentially no privacy cost"
    priv.pop("neighbouring")
    for over, what in (({"coverage": cov}, "coverage.statement"),
                       ({"privacy": priv}, "privacy.statement"),
                       ({"calibrator_version": "2.1.0"}, "calibrator version 2.1.0 is not"),
                       ({"method": "no-such-method"}, "cannot be recomputed")):
        ch = acct.charge("z", ZCDP("0.1")).charge_id
        with pytest.raises(InvalidInput, match=what):
            _again(acct, rel, "z", [ch], **over)
    ch = acct.charge("z", ZCDP("0.1")).charge_id
    _again(acct, rel, "z", [ch])  # what the installed code states: recorded
    rep = acct.verify()
    assert rep.guarantees_recomputed == 2 and rep.statements_not_compared == 0


def test_release_charges_enforce_and_verify_one_release_per_charge(accountant: Any) -> None:
    acct = accountant
    rel = _pcoqs(acct)
    with acct.ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT charge_id, release_id FROM release_charges")).all()
    assert [tuple(r) for r in rows] == [(rel.charge_ids[0], rel.id)]
    ch = acct.charge("z", ZCDP("0.1")).charge_id
    with pytest.raises(InvalidInput, match="already has a release"):
        _again(acct, rel, "z", [rel.charge_ids[0]])
    _again(acct, rel, "z", [ch])
    acct.verify()
    with acct.ledger.engine.begin() as conn:
        conn.execute(text("DELETE FROM release_charges WHERE charge_id = :c"), {"c": ch})
    with pytest.raises(AuditFailed, match=rf"release_charges: charge {ch} pays for release "
                                          r"\d+ \(its charge_ids\) but has no "
                                          "release_charges row"):
        acct.ledger.verify()
    with acct.ledger.engine.begin() as conn:
        conn.execute(text("INSERT INTO release_charges (charge_id, release_id) VALUES (:c, :r)"),
                     {"c": ch, "r": rel.id})
    with pytest.raises(AuditFailed, match=f"charge {ch} is recorded as paying for release "
                                          f"{rel.id}"):
        acct.ledger.verify()


def test_a_charge_of_an_open_session_cannot_pay_for_another_release(accountant: Any) -> None:
    """Named in record_release first, the batch charge made the session's own release fail
    verify for good (and now fail at its insert): refused up front, one line."""
    acct = accountant
    acct.create_dataset("d", rho=10, subject_epsilon=5)
    sess = S.open_session(acct, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=1,
                          group_size=2)
    S.submit_reports(acct, sess.id, ["r1"], [0], [0])
    with acct.ledger.read() as s:
        batch = sorted(acct.ledger.open_session_charges(s, acct.ledger.get_dataset(s, "d").id))
    assert len(batch) == 1
    cov = {"target": 0.9, "lower": 0.9, "over": "x", "statement": "s"}
    with pytest.raises(InvalidInput, match=f"charge {batch[0]} was made by collection "
                                           f"session {sess.id} \\(open"):
        releases.record_release(acct.ledger, "d", method="ldp-score", calibrator_version="x",
                                threshold=0.1, params={}, shape={"n": 1}, coverage=cov,
                                privacy={}, charge_ids=batch, _as_computed=True)
    S.submit_reports(acct, sess.id, ["r2"], [1], [0])  # the session finishes: released
    assert len(acct.ledger.releases("d")) == 1
    assert acct.verify().guarantees_recomputed == 1


def test_a_charge_of_an_abandoned_session_cannot_pay_for_another_release(accountant: Any
                                                                         ) -> None:
    """An abandoned session keeps its reports and its charges: they paid for those reports,
    not for a release recorded later (second review of the fixes)."""
    acct = accountant
    rel = _local_release(acct)
    sess = S.open_session(acct, "ldp-score", dataset="a", alpha=0.1, epsilon=2, rounds=5,
                          group_size=12)
    S.submit_reports(acct, sess.id, [f"s{i}" for i in range(12)], [0] * 12, [0] * 12)
    with acct.ledger.read() as s:
        batch = sorted(acct.ledger.open_session_charges(s, acct.ledger.get_dataset(s, "a").id))
    S.close_session(acct, sess.id, abandon=True)
    more = acct.charge_subjects("a", 2, [f"t{i}" for i in range(N)]).charge_id
    with pytest.raises(InvalidInput, match=f"charge {batch[0]} was made by collection "
                                           f"session {sess.id}"):
        _again(acct, rel, "a", [*batch, more])


@pytest.mark.parametrize("n", [60.0, "60", 10**18, True])
def test_a_shape_that_is_not_integer_sizes_is_refused(accountant: Any, n: Any) -> None:
    """``n = 60.0`` or ``"60"`` read as 60 in the recomputed guarantee but counted no report
    against the charges (one subject's charge paid for 60 reports); ``10**18`` kept the
    recomputation running for minutes under the dataset's lock."""
    acct = accountant
    rel = _local_release(acct)
    one = acct.charge_subjects("a", 2, ["only-one-subject"]).charge_id
    with pytest.raises(InvalidInput, match="shape sizes must be integers"):
        _again(acct, rel, "a", [one], shape={**rel.shape, "n": n})


def test_record_release_refuses_numbers_the_installed_code_does_not_compute(
        accountant: Any) -> None:
    acct = accountant
    rel = _pcoqs(acct)
    cov = rel.coverage.model_dump(mode="json")
    cov.update(lower=0.999, failure_probability=0.0)  # sentences untouched
    ch = acct.charge("z", ZCDP("0.1")).charge_id
    with pytest.raises(InvalidInput, match=r"coverage\.failure_probability"):
        _again(acct, rel, "z", [ch], coverage=cov)
    assert acct.verify().guarantees_recomputed == 1
