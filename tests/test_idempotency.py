"""Idempotency keys bind the whole request (issue 16 item 1, issue 14 item 5), on both backends:
a key reused for another request is an error naming it and writes nothing; concurrent retries
with one key all get the one result."""

from __future__ import annotations

import multiprocessing as mp
import threading
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.costs import ZCDP, PureDP
from privcal.errors import InvalidInput
from privcal.storage.models import Charge, ReleaseRow, SubjectSpend

SCORES = np.random.default_rng(0).uniform(0, 1, 500)


def _counts(acct: Accountant) -> tuple[Any, ...]:
    with acct.ledger.read() as s:
        counts = [s.scalar(select(func.count()).select_from(t))
                  for t in (Charge, ReleaseRow, SubjectSpend)]
        return (acct.ledger.head(), *counts)


def test_key_of_an_external_charge_cannot_pay_for_a_calibration(accountant: Accountant) -> None:
    # the reproduction: charge A --rho 0.2 --key job-42, then calibrate with job-42
    accountant.create_dataset("A", rho=1)
    accountant.charge("A", ZCDP(rho=0.2), idempotency_key="job-42")
    before = _counts(accountant)
    with pytest.raises(InvalidInput, match="idempotency key 'job-42'"):
        accountant.calibrate("pcoqs", dataset="A", scores=SCORES, alpha=0.1, rho=0.2,
                             idempotency_key="job-42")
    assert _counts(accountant) == before and accountant.releases() == []
    assert accountant.budget("A").spent == {"rho": Decimal("0.2")}


def test_calibrate_key_binds_method_params_and_shape(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1)
    kw: dict[str, Any] = dict(dataset="d", idempotency_key="k")
    first = accountant.calibrate("pcoqs", scores=SCORES, alpha=0.1, rho=0.2, **kw)
    assert accountant.calibrate("pcoqs", scores=SCORES, alpha=0.1, rho=0.2, **kw).id == first.id
    before = _counts(accountant)
    for other in (dict(scores=SCORES, alpha=0.2, rho=0.2),       # another parameter
                  dict(scores=SCORES[:400], alpha=0.1, rho=0.2)):  # another public shape
        with pytest.raises(InvalidInput, match="idempotency key 'k'"):
            accountant.calibrate("pcoqs", **other, **kw)
    with pytest.raises(InvalidInput, match="idempotency key 'k'"):  # another method
        accountant.calibrate("exponq", scores=SCORES, alpha=0.1, epsilon=0.2, **kw)
    with pytest.raises(InvalidInput, match="idempotency key 'k'"):  # the key of a release
        accountant.charge("d", ZCDP(rho=0.2), idempotency_key="k")
    assert _counts(accountant) == before


def test_charge_key_binds_purpose_and_cost(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=5)
    accountant.charge("d", PureDP(eps=1), purpose="histogram", idempotency_key="k")
    assert accountant.charge("d", PureDP(eps=1), purpose="histogram",
                             idempotency_key="k").replayed
    # another requester's key is never its replay (red team 20, service F3)
    with pytest.raises(InvalidInput, match="idempotency key 'k'"):
        accountant.charge("d", PureDP(eps=1), purpose="histogram", idempotency_key="k",
                          requester="someone else")
    with pytest.raises(InvalidInput, match="idempotency key 'k'"):
        accountant.charge("d", PureDP(eps=1), purpose="a mean", idempotency_key="k")


def test_subject_batch_key_binds_the_subjects(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, subject_epsilon=1)
    accountant.charge_subjects("d", 0.5, ["a", "b"], idempotency_key="k")
    before = _counts(accountant)
    with pytest.raises(InvalidInput, match="idempotency key 'k'"):
        accountant.charge_subjects("d", 0.5, ["a", "c"], idempotency_key="k")
    with pytest.raises(InvalidInput, match="idempotency key 'k'"):
        accountant.charge_subjects("d", 0.5, ["b", "a"], idempotency_key="k")
    assert _counts(accountant) == before
    again = accountant.charge_subjects("d", 0.5, ["a", "b"], idempotency_key="k")
    # the replay recovers who was charged from the stored pseudonyms
    assert again.replayed and again.accepted_mask is not None and again.accepted_mask.all()
    assert accountant.subject_spend("d", "c") == 0
    # the request digest is keyed: it is not a plain hash of the ids
    with accountant.ledger.read() as s:
        digest = s.scalar(select(Charge.request_digest).where(Charge.idempotency_key == "k"))
    assert digest is not None and len(digest) == 64


def test_local_dp_run_recovers_after_a_crash(accountant: Any, fake_calibrator: Any) -> None:
    from privcal.calibrators.base import CalibrationInput
    from privcal.costs import LocalDP

    accountant.create_dataset("d", rho=1, subject_epsilon=1)
    accountant.charge_subjects("d", 1, ["s0"])  # s0 is exhausted: its row is dropped
    data = CalibrationInput(scores=np.linspace(0, 1, 10),
                            subjects=np.array([f"s{i}" for i in range(10)]))
    with pytest.raises(RuntimeError, match="crashed"):
        accountant.run(fake_calibrator(LocalDP(eps0=0.5), fail=True), {"alpha": 0.2}, data,
                       dataset="d", idempotency_key="job")
    cal = fake_calibrator(LocalDP(eps0=0.5))
    rel = accountant.run(cal, {"alpha": 0.2}, data, dataset="d", idempotency_key="job")
    assert cal.seen_n == [9] and rel.shape["n"] == 9  # the same 9 rows as the charged batch
    assert accountant.run(cal, {"alpha": 0.2}, data, dataset="d", idempotency_key="job").id \
        == rel.id and cal.calls == 1
    assert accountant.subject_spend("d", "s1") == Decimal("0.5")


def test_session_batch_idempotency(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=5)
    info = S.open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=1.5,
                          rounds=3, group_size=3)
    first = S.submit_reports(accountant, info.id, ["a", "b"], [1, 0], [0, 0],
                             idempotency_key="b1")
    before = _counts(accountant)
    again = S.submit_reports(accountant, info.id, ["a", "b"], [1, 0], [0, 0],
                             idempotency_key="b1")
    assert again.replayed and not first.replayed
    assert (again.accepted, again.charge_id, again.reasons) == \
        (first.accepted, first.charge_id, first.reasons)
    assert _counts(accountant) == before
    for subjects, bits in ((["a", "c"], [1, 0]), (["a", "b"], [1, 1])):
        with pytest.raises(InvalidInput, match="idempotency key 'b1'"):
            S.submit_reports(accountant, info.id, subjects, bits, [0, 0], idempotency_key="b1")
    assert _counts(accountant) == before
    assert accountant.subject_spend("d", "a") == Decimal("1.5")
    accountant.verify()


# ------------------------------------------------------------------ concurrent retries
WORKERS = 8


def _calibrate_once(url: str, out: Any) -> None:
    acct = Accountant(url)
    try:
        rel = acct.calibrate("pcoqs", dataset="race", scores=SCORES, alpha=0.1, rho=0.2,
                             idempotency_key="job-1")
        out.put(("ok", rel.id))
    except Exception as exc:  # anything else is a failure of the test
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        acct.ledger.close()


def _check_one_result(acct: Accountant, results: list[tuple[str, Any]]) -> None:
    assert all(kind == "ok" for kind, _ in results), results
    assert len({rid for _, rid in results}) == 1
    assert acct.budget("race").spent == {"rho": Decimal("0.2")}
    assert len(acct.releases("race")) == 1 and acct.budget("race").charges == 1
    acct.verify()


def test_concurrent_retries_in_threads_get_the_one_release(accountant: Accountant,
                                                          ledger_url: str) -> None:
    accountant.create_dataset("race", rho=1)
    results: list[tuple[str, Any]] = []
    lock = threading.Lock()

    class Out:
        def put(self, item: tuple[str, Any]) -> None:
            with lock:
                results.append(item)

    threads = [threading.Thread(target=_calibrate_once, args=(ledger_url, Out()))
               for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) == WORKERS
    _check_one_result(accountant, results)


def test_concurrent_retries_in_processes_get_the_one_release(accountant: Accountant,
                                                            ledger_url: str) -> None:
    accountant.create_dataset("race", rho=1)
    accountant.ledger.engine.dispose()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_calibrate_once, args=(ledger_url, q)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    _check_one_result(accountant, results)


def test_cli_key_reuse_across_charge_and_calibrate(accountant: Accountant, ledger_url: str,
                                                   tmp_path: Any) -> None:
    # the commands, through the CLI: a one-line error naming the key, nothing written
    from click.testing import CliRunner

    from privcal.cli import main

    scores = tmp_path / "scores.npy"
    np.save(scores, SCORES)

    def run(*args: str) -> Any:
        return CliRunner().invoke(main, ["--db-url", ledger_url, *args])

    assert run("dataset", "create", "A", "--rho", "1").exit_code == 0
    assert run("charge", "A", "--rho", "0.2", "--idempotency-key", "job-42").exit_code == 0
    before = _counts(accountant)
    r = run("calibrate", "pcoqs", "--dataset", "A", "--scores", str(scores), "--alpha", "0.1",
            "--rho", "0.2", "--idempotency-key", "job-42")
    assert r.exit_code == 1 and "idempotency key 'job-42'" in r.stderr
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1
    assert _counts(accountant) == before
