"""Red team 26, api2: inputs read once (a batch of reports: api F6), pandas inputs paired by
their index (api F9), and ``Ledger.verify`` saying which caps it did not check (ledger F10)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.storage.sessions import SessionReport


def _stored_bits(acct: Accountant, sid: int) -> list[bytes]:
    with acct.ledger.read() as s:
        return sorted(bytes(v) if not isinstance(v, str) else v.encode()
                      for v in s.scalars(select(SessionReport.value)
                                         .where(SessionReport.session_id == sid)))


def _mutate_in_tx(acct: Accountant, monkeypatch: Any, change: Any) -> None:
    """Another thread changing the caller's batch once its transaction has begun."""
    real = acct.ledger.lock_batch_session

    def lock(*a: Any, **k: Any) -> Any:
        change()
        return real(*a, **k)
    monkeypatch.setattr(acct.ledger, "lock_batch_session", lock)


@pytest.mark.parametrize("kind", ["numeric", "object"])
def test_f6_a_batch_changed_after_the_call_is_not_what_is_stored(
        accountant: Accountant, monkeypatch: Any, kind: str) -> None:
    """submit_reports reads its values and rounds once, at its top: a caller's array changed
    by another thread while the batch is written (here: after the idempotency digest, before
    the parse) must not be stored under the digest of what was given — it was: the reports
    stored were the changed ones, bound to a key whose digest is another batch's."""
    accountant.create_dataset("d", epsilon=1, subject_epsilon=5)
    info = S.open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=1.5,
                          rounds=3, group_size=4)
    values = np.ones(4, dtype=np.int64) if kind == "numeric" else np.array([1] * 4, dtype=object)
    rounds = np.zeros(4, dtype=np.int64)

    def change() -> None:
        values[:] = 0
        rounds[:] = 7  # no round of the session: every row malformed if re-read
    _mutate_in_tx(accountant, monkeypatch, change)
    res = S.submit_reports(accountant, info.id, ["a", "b", "c", "d"], values, rounds,
                           idempotency_key="k1")
    monkeypatch.undo()
    assert res.accepted == 4
    assert _stored_bits(accountant, info.id) == [b"1"] * 4
    # the key binds what was stored: the same batch as given replays it
    again = S.submit_reports(accountant, info.id, ["a", "b", "c", "d"], [1, 1, 1, 1],
                             [0, 0, 0, 0], idempotency_key="k1")
    assert again.replayed
    accountant.verify()


# ------------------------------------------------------------------ F9: pandas indexes
def _charges(acct: Accountant) -> tuple[Any, ...]:
    from sqlalchemy import func

    from privcal.storage.models import Charge, ReleaseRow

    with acct.ledger.read() as s:
        return (acct.ledger.head(), s.scalar(select(func.count()).select_from(Charge)),
                s.scalar(select(func.count()).select_from(ReleaseRow)))


def _classification(n: int = 400, k: int = 3) -> tuple[Any, Any]:
    pd = pytest.importorskip("pandas")
    g = np.random.default_rng(0)
    y = g.integers(0, k, n)
    p = np.full((n, k), 0.1)
    p[np.arange(n), y] = 0.8
    probs = pd.DataFrame(p, index=np.arange(n))
    labels = pd.Series(y, index=np.arange(n)).sample(frac=1, random_state=1)  # other order
    return probs, labels


def test_f9_pandas_inputs_indexed_differently_are_refused_before_any_charge(
        accountant: Accountant) -> None:
    """A probs DataFrame and a labels Series holding the same (row, label) pairs by index but
    in another order were paired by position, silently: each label with another row's
    probabilities (threshold 0.9 instead of 0.2). Refused now, one line, nothing charged."""
    from privcal.errors import InvalidInput

    accountant.create_dataset("d", rho=10, allow_nonprivate=True)
    probs, labels = _classification()
    before = _charges(accountant)
    with pytest.raises(InvalidInput, match="different indexes") as e:
        accountant.calibrate("split", dataset="d", probs=probs, labels=labels, alpha=0.1,
                             score="lac")
    assert "\n" not in str(e.value)
    assert _charges(accountant) == before
    # aligned (same index, same order) is fine, and equals the plain arrays' release
    a = accountant.calibrate("split", dataset="d", probs=probs, labels=labels.loc[probs.index],
                             alpha=0.1, score="lac")
    b = accountant.calibrate("split", dataset="d", probs=probs.to_numpy(),
                             labels=labels.loc[probs.index].to_numpy(), alpha=0.1, score="lac")
    assert a.threshold == b.threshold


def test_f9_run_and_estimator_and_batch_refuse_misaligned_pandas(accountant: Accountant) -> None:
    """The same rule at Accountant.run (a CalibrationInput), the estimator's conformalize
    (X_conf DataFrame, y_conf Series) and a session batch (subject ids and values)."""
    from privcal.calibrators import registry
    from privcal.calibrators.base import CalibrationInput
    from privcal.errors import InvalidInput
    from privcal.estimators import PrivateConformalRegressor

    pd = pytest.importorskip("pandas")
    accountant.create_dataset("d", rho=10, allow_nonprivate=True, subject_epsilon=5)
    g = np.random.default_rng(1)
    scores = pd.Series(g.uniform(0, 1, 50), index=np.arange(50))
    subjects = pd.Series([f"s{i}" for i in range(50)], index=np.arange(50)[::-1])
    before = _charges(accountant)
    with pytest.raises(InvalidInput, match="different indexes"):
        accountant.run(registry.get("split").calibrator, {"alpha": 0.1},
                       CalibrationInput(scores=scores, subjects=subjects), dataset="d")

    class Model:
        def predict(self, X: Any) -> Any:
            return np.asarray(X)[:, 0]
    X = pd.DataFrame({"x": g.uniform(0, 1, 50)}, index=np.arange(50))
    y = pd.Series(g.uniform(0, 1, 50), index=np.arange(50)[::-1])
    reg = PrivateConformalRegressor(Model(), "split", 0.9, accountant=accountant, dataset="d",
                                    score="absolute")
    with pytest.raises(InvalidInput, match="X_conf and y_conf are pandas objects"):
        reg.conformalize(X, y)
    assert _charges(accountant) == before
    reg.conformalize(X, y.loc[X.index])  # aligned: calibrated
    info = S.open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=1.5,
                          rounds=3, group_size=4)
    ids = pd.Series(["a", "b", "c", "d"], index=[0, 1, 2, 3])
    with pytest.raises(InvalidInput, match="subject ids and values"):
        S.submit_reports(accountant, info.id, ids, pd.Series([1, 0, 1, 1], index=[3, 2, 1, 0]),
                         [0, 0, 0, 0])
    assert _stored_bits(accountant, info.id) == []
    res = S.submit_reports(accountant, info.id, ids, pd.Series([1, 0, 1, 1], index=[0, 1, 2, 3]),
                           [0, 0, 0, 0])
    assert res.accepted == 4


# ------------------------------------------------------------------ ledger F10
def test_f10_ledger_verify_says_which_approx_caps_it_did_not_check(tmp_path: Any) -> None:
    """``Ledger.verify()`` without ``cap_check`` cannot check an (ε, δ) cap's Rényi filter:
    a ledger overspent past one (a cap raised around a charge and put back: 1.8 of ε ≤ 1
    spent) verified, and its report did not say its caps were not checked. The report now
    counts them (``caps_unchecked``); with the accountant's check (Accountant.verify, the
    CLI, the service) nothing is left unchecked, and the overspend is an AuditFailed."""
    import sqlite3
    from decimal import Decimal

    from privcal.accountant import verification
    from privcal.costs import ApproxDP
    from privcal.errors import AuditFailed

    db = tmp_path / "l.sqlite"
    acct = Accountant(f"sqlite:///{db}")
    acct.create_dataset("ad", approx_epsilon=1, approx_delta=Decimal("1e-6"))
    acct.create_dataset("pure", epsilon=1)

    def set_cap(cap: str) -> None:
        acct.ledger.close()
        with sqlite3.connect(db) as c:
            c.execute("UPDATE datasets SET cap_epsilon = ? WHERE name = 'ad'", (cap,))
    assert acct.ledger.verify().caps_unchecked == 1  # the pure-ε cap is the storage's own
    assert acct.ledger.verify(cap_check=verification.check_cap).caps_unchecked == 0
    acct.charge("ad", ApproxDP(Decimal("0.9"), Decimal("1e-7")))
    set_cap("5")
    acct.charge("ad", ApproxDP(Decimal("0.9"), Decimal("1e-7")))  # under the raised cap
    set_cap("1")
    rep = acct.ledger.verify()
    assert rep.caps_unchecked == 1
    with pytest.raises(AuditFailed, match="more than the cap's filter allows"):
        acct.ledger.verify(cap_check=verification.check_cap)
    with pytest.raises(AuditFailed, match="more than the cap's filter allows"):
        acct.verify()
    acct.close()


# ------------------------------------------------------------------ F4: ids read once
def test_f4_subject_ids_checked_are_the_ids_charged(accountant: Accountant,
                                                      monkeypatch: Any) -> None:
    """``id_strings`` checked a NumPy array of strings and returned the caller's array itself:
    charge_subjects (and every caller) then read it again — an id changed by another thread
    after the checks (here to ``"NaN"``, a missing value that is refused as an id) was
    charged as a subject. The ids are copied before the first check now."""
    from decimal import Decimal

    from privcal.calibrators import validation

    accountant.create_dataset("d", epsilon=1, subject_epsilon=5)
    ids = np.array(["alice", "bob"])
    real = validation._check_spelling

    def check(items: Any, what: str) -> None:
        real(items, what)
        ids[0] = "NaN"  # another thread, once the ids are checked
    monkeypatch.setattr(validation, "_check_spelling", check)
    accountant.charge_subjects("d", "0.5", ids)
    monkeypatch.undo()
    assert accountant.subject_spend("d", "alice") == Decimal("0.5")
    assert accountant.subject_spend("d", "bob") == Decimal("0.5")
    out = validation.id_strings(ids, "ids")
    assert not np.shares_memory(out, ids)


# ------------------------------------------------------------------ F5: a device's score
def test_f5_a_reporter_reads_a_float_subclass_score_once() -> None:
    """``Reporter.report`` checked a score with ``value != value`` (NaN) and then compared it
    with ``value <= q``: a float subclass whose ``!=`` said "not NaN" passed a NaN on to be
    randomized and sent (as "score above q"). The score is read once as a plain number now:
    the NaN is refused before anything is asked of the server (no server here: before the fix
    the call went on to the network)."""
    from privcal.client import Reporter
    from privcal.errors import InvalidInput

    class F(float):
        def __ne__(self, other: object) -> bool:
            return False

    with pytest.raises(InvalidInput, match="not NaN"):
        Reporter("http://127.0.0.1:9", "pcd_unused").report(F("nan"))


# ------------------------------------------------------------------ F7: a recorded threshold
def test_f7_record_release_reads_a_float_subclass_threshold_once(accountant: Accountant) -> None:
    """``record_release`` checked a threshold for NaN by its float value (``math.isnan``) and
    recorded ``float(threshold)`` — a subclass's ``__float__``: NaN there was a ValueError
    traceback from the storage (and any other value recorded in place of the value checked).
    The threshold is read once as a plain float: the value given (0.5) is recorded."""
    accountant.create_dataset("d", rho=10, allow_nonprivate=True)
    r = accountant.calibrate("split", dataset="d", alpha=0.1,
                             scores=np.random.default_rng(0).random(100))

    class F(float):
        def __float__(self) -> float:
            return float("nan")

    shape = r.shape if isinstance(r.shape, dict) else r.shape.model_dump(mode="json")
    rel = accountant.record_release(
        "d", threshold=F(0.5), method=r.method, calibrator_version=r.calibrator_version,
        params=r.params, shape=shape, coverage=r.coverage, privacy=r.privacy)
    assert rel.threshold == 0.5
    accountant.verify()
