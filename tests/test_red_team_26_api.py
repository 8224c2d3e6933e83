"""Red team 26, api: what an embedding program can pass that the CLI cannot.

F1: the run read the caller's containers again after the charge; F2: a predictable random
source passed as the CSPRNG; F3: a ``str`` subclass passed the reserved-key checks; F4: a
cost subclass was charged one amount and recorded another. Each test fails on the code
before its fix (checked by reverting the fix)."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privcal import ZCDP, Accountant, PureDP
from privcal.accountant import calibration_run
from privcal.calibrators import registry
from privcal.calibrators.base import CalibrationInput
from privcal.errors import InvalidInput

N = 400


def _acct(tmp_path: Path, **cap: Any) -> Accountant:
    acct = Accountant(f"sqlite:///{tmp_path}/ledger.db")
    acct.create_dataset("d", **cap)
    return acct


def _after_the_charge(monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
    """Run ``act`` right after the run's subject charge commits: what another thread of the
    embedding program can do at that moment, made deterministic."""
    for name in ("charge_subjects", "charge_parts"):
        charge = getattr(calibration_run, name)

        def charged_then(*args: Any, charge: Any = charge, **kwargs: Any) -> Any:
            out = charge(*args, **kwargs)
            act()
            return out

        monkeypatch.setattr(calibration_run, name, charged_then)


def _spy(monkeypatch: pytest.MonkeyPatch, method: str) -> tuple[Any, list[int]]:
    """The calibrator of ``method``, and the number of rows its ``calibrate`` is given."""
    cal = registry.get(method).calibrator
    seen: list[int] = []
    calibrate = type(cal).calibrate

    def spy(self: Any, data: CalibrationInput, p: Any, rng: random.Random) -> Any:
        seen.append(int(np.shape(data.scores)[0]))
        return calibrate(self, data, p, rng)

    monkeypatch.setattr(type(cal), "calibrate", spy)
    return cal, seen


def test_f1_rows_added_after_the_charge_are_not_calibrated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F1: ``Accountant.run`` with lists a producer thread extends after the charge. Before:
    ldp-score calibrated 4 400 rows, 4 000 of them of subjects never charged, under a
    release recorded for n = 400."""
    acct = _acct(tmp_path, epsilon=10, subject_epsilon=1)
    gen = np.random.default_rng(0)
    scores = list(gen.uniform(size=N))
    subjects = [f"u{i}" for i in range(N)]

    def producer() -> None:
        scores.extend(gen.uniform(size=10 * N))
        subjects.extend(f"v{i}" for i in range(10 * N))

    _after_the_charge(monkeypatch, producer)
    cal, seen = _spy(monkeypatch, "ldp-score")
    rel = acct.run(cal, {"alpha": 0.1, "epsilon": 1.0},
                   CalibrationInput(scores=scores, subjects=subjects), dataset="d")
    assert seen == [N] and rel.shape["n"] == N
    assert acct.subject_summary("d").subjects == N
    assert acct.subject_spend("d", "v0") == 0


class _Shifty:
    """An array-like whose ``__array__`` answers with more rows once ``grown`` is set."""

    def __init__(self) -> None:
        self.grown = False

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.linspace(0.0, 1.0, 10 * N if self.grown else N)


class _SelfCopy(np.ndarray):
    """An ndarray subclass whose ``copy`` is itself (a copy another thread still writes)."""

    def copy(self, order: Any = "C") -> Any:
        return self


@pytest.mark.parametrize("kind", ["__array__", "ndarray subclass"])
def test_f1_the_data_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  kind: str) -> None:
    """F1: a P-COQS run reads its scores once — an ``__array__`` answering 10·n rows after
    the charge, or an ndarray subclass (its ``copy`` itself) resized after it, is calibrated
    on the n rows checked and recorded (before: 4 000 rows under a release for n = 400)."""
    acct = _acct(tmp_path, rho=10)
    if kind == "__array__":
        scores: Any = _Shifty()

        def change() -> None:
            scores.grown = True
    else:
        scores = _SelfCopy((N,))  # owning its data, as resize needs
        scores[:] = np.linspace(0.0, 1.0, N)

        def change() -> None:
            scores.flags.writeable = True
            scores.resize((10 * N,), refcheck=False)
            scores[N:] = 0.5

    _after_the_charge(monkeypatch, change)
    cal, seen = _spy(monkeypatch, "pcoqs")
    rel = acct.run(cal, {"alpha": 0.1, "rho": 0.5}, CalibrationInput(scores=scores),
                   dataset="d")
    assert seen == [N] and rel.shape["n"] == N


def test_f1_a_value_written_after_the_checks_is_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F1: ``Accountant.calibrate`` kept the caller's float64 array itself; a NaN written
    into it after the charge made ldp-score refuse then — 400 subjects charged ε0, no
    release. The run reads its own copy: the release is recorded for the data checked."""
    acct = _acct(tmp_path, epsilon=10, subject_epsilon=1)
    s = np.random.default_rng(1).uniform(size=N)

    def writer() -> None:
        s[5] = np.nan

    _after_the_charge(monkeypatch, writer)
    rel = acct.calibrate("ldp-score", dataset="d", scores=s, alpha=0.1, epsilon=1.0,
                         subjects=[f"u{i}" for i in range(N)])
    assert rel.shape["n"] == N and len(acct.releases("d")) == 1
    assert acct.subject_summary("d").subjects == N


def test_f1_the_copy_keeps_what_the_checks_refuse(tmp_path: Path) -> None:
    """The run's copy of the data keeps a masked array's mask (refused, red team 11) and a
    ragged list is still one line; nothing charged."""
    acct = _acct(tmp_path, rho=1)
    cal = registry.get("pcoqs").calibrator
    masked = np.ma.array(np.linspace(0, 1, N), mask=[i == 3 for i in range(N)])
    for data, said in ((CalibrationInput(scores=masked), "masked"),
                       (CalibrationInput(scores=[[0.1], [0.2, 0.3]]), "not an array")):
        with pytest.raises(InvalidInput, match=said):
            acct.run(cal, {"alpha": 0.1, "rho": 0.1}, data, dataset="d")
    assert acct.budget("d").charges == 0


class _Predictable(random.SystemRandom):
    """A CSPRNG in type only: its draws are ``random.Random(42)``'s."""

    def __init__(self) -> None:
        self._stream = random.Random(42)
        super().__init__()

    def random(self) -> float:
        return self._stream.random()

    def getrandbits(self, k: int) -> int:
        return self._stream.getrandbits(k)


def test_f2_a_systemrandom_subclass_is_refused_for_private_noise(tmp_path: Path) -> None:
    """F2: two P-COQS runs (ρ = 1) given a SystemRandom subclass drawing random.Random(42)'s
    stream released the same threshold, each recorded as 1-zCDP. Refused, nothing charged,
    for a run and for the estimator's simulated devices (ldp-label)."""
    acct = _acct(tmp_path, rho=10, subject_epsilon=5)
    s = np.random.default_rng(2).uniform(size=N)
    with pytest.raises(InvalidInput, match="noise no one can predict"):
        acct.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=1.0,
                       rng=_Predictable())
    from privcal.estimators import PrivateConformalClassifier

    class Model:
        classes_ = np.array([0, 1, 2])

        def predict_proba(self, X: Any) -> np.ndarray:
            return np.full((len(X), 3), 1 / 3)

    est = PrivateConformalClassifier(Model(), "ldp-label", 0.9, accountant=acct, dataset="d",
                                     epsilon=2, rng=_Predictable())
    with pytest.raises(InvalidInput, match="noise no one can predict"):
        est.conformalize(np.zeros((N, 2)), np.arange(N) % 3,
                         subjects=[f"u{i}" for i in range(N)])
    assert acct.budget("d").charges == 0 and acct.releases("d") == []


def test_f2_a_systemrandom_is_never_drawn_from_by_a_private_run(tmp_path: Path) -> None:
    """F2: a ``random.SystemRandom()`` whose ``random``/``getrandbits`` were replaced by a
    seeded generator's passed as the CSPRNG; a private run now draws from privcal's own
    (the caller's replaced methods are never called)."""
    acct = _acct(tmp_path, rho=10)
    calls: list[str] = []
    r = random.SystemRandom()
    stream = random.Random(7)
    r.random = lambda: calls.append("random") or stream.random()  # type: ignore[method-assign]
    r.getrandbits = lambda k: calls.append("bits") or stream.getrandbits(k)  # type: ignore[method-assign]
    s = np.random.default_rng(3).uniform(size=N)
    acct.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=1.0, rng=r)
    assert calls == [] and len(acct.releases("d")) == 1


class _Liar(str):
    def endswith(self, *args: Any) -> bool:  # type: ignore[override]
        return False

    def startswith(self, *args: Any) -> bool:  # type: ignore[override]
        return False

    def strip(self, *args: Any) -> str:  # type: ignore[override]
        return "x"


@pytest.mark.parametrize(("key", "said"), [
    ("job#central", "reserved for privcal's own central"),
    ("   ", "idempotency key is empty"),
    ("http:1:abc", "reserved for the keys privcal's HTTP service"),
])
def test_f3_a_str_subclass_passes_no_key_check(tmp_path: Path, key: str, said: str) -> None:
    """F3: a str subclass answering ``endswith``/``startswith``/``strip`` falsely was stored
    as a reserved (or blank) idempotency key; the checks read its characters."""
    acct = _acct(tmp_path, epsilon=10)
    with pytest.raises(InvalidInput, match=said):
        acct.charge("d", PureDP(0.1), idempotency_key=_Liar(key))
    assert acct.budget("d").charges == 0


def test_f4_a_cost_subclass_is_not_charged(tmp_path: Path) -> None:
    """F4: a ZCDP subclass answering ``rho`` = 1e-12 to the filter while its fields (the
    record) said 0.9: two charges accepted against ρ ≤ 1, 2e-12 spent. Refused."""

    class Cheap(ZCDP):
        def __getattribute__(self, name: str) -> Any:
            return Decimal("1e-12") if name == "rho" else super().__getattribute__(name)

    acct = _acct(tmp_path, rho=1)
    with pytest.raises(InvalidInput, match="not a subclass"):
        acct.charge("d", Cheap(0.9))
    assert acct.budget("d").charges == 0
    acct.charge("d", ZCDP(0.9))
    with pytest.raises(Exception, match="budget"):
        acct.charge("d", ZCDP(0.9))


class _Says(float):
    """A float whose ``__float__`` is not its value (``float(x)`` and pydantic disagree)."""

    def __float__(self) -> float:
        return 0.0 if self == 5.0 else 50.0


def test_f7_the_devices_randomize_at_the_epsilon_recorded(tmp_path: Path) -> None:
    """F7: the estimator's simulated devices ran k-RR at ``float(ε)`` (50: every label sent
    as it was) and the release recorded ε's value (0.5-LDP, ε0 = 0.5 charged). ε is read
    once: here 50, refused against the per-subject cap 5 — nothing charged."""
    from privcal.errors import BudgetRefused
    from privcal.estimators import PrivateConformalClassifier

    class Model:
        classes_ = np.array([0, 1, 2])

        def predict_proba(self, X: Any) -> np.ndarray:
            return np.full((len(X), 3), 1 / 3)

    acct = _acct(tmp_path, epsilon=1, subject_epsilon=5)
    est = PrivateConformalClassifier(Model(), "ldp-label", 0.9, accountant=acct, dataset="d",
                                     epsilon=_Says(0.5))
    with pytest.raises(BudgetRefused, match="ε0=50"):
        est.conformalize(np.zeros((N, 2)), np.arange(N) % 3,
                         subjects=[f"u{i}" for i in range(N)])
    assert acct.releases("d") == []


def _probs_labels(seed: int, n: int, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    return gen.dirichlet(np.ones(k), size=n), gen.integers(0, k, n)


def test_f8_a_score_option_is_computed_with_the_value_recorded(tmp_path: Path) -> None:
    """F8: raps λ = ``_Says(5.0)`` (``__float__`` 0): the scores were computed with λ = 0,
    the release recorded λ = 5, and its row and audit entry disagreed (``release`` and
    ``verify`` raised AuditFailed). Now the λ = 5 release exactly, which verifies."""
    acct = _acct(tmp_path, rho=1, allow_nonprivate=True)
    p, y = _probs_labels(0, N)
    opts = {"k_reg": 1, "randomized": False}
    odd = acct.calibrate("split", dataset="d", probs=p, labels=y, alpha=0.1, score="raps",
                         score_options={**opts, "lam": _Says(5.0)})
    plain = acct.calibrate("split", dataset="d", probs=p, labels=y, alpha=0.1, score="raps",
                           score_options={**opts, "lam": 5.0})
    assert odd.threshold == plain.threshold
    assert acct.release(odd.id).diagnostics["score"] == plain.diagnostics["score"]
    assert acct.verify().releases == 2


def test_f8_an_odd_number_in_a_record_leaves_the_log_verifiable(tmp_path: Path) -> None:
    """F8: ``json_safe`` stored a float subclass as it was: the release row and its audit
    entry serialized it differently, and every later ``verify`` failed blaming an edit."""
    acct = _acct(tmp_path, rho=1)
    cal = registry.get("pcoqs").calibrator
    rel = acct.run(cal, {"alpha": 0.1, "rho": 0.5},
                   CalibrationInput(scores=np.linspace(0.0, 1.0, N)), dataset="d",
                   extra_diagnostics={"note": _Says(5.0)})
    assert acct.release(rel.id).diagnostics["note"] == 5.0
    assert acct.verify().releases == 1


class _LoudDecimal(Decimal):
    def __str__(self) -> str:
        return "1000"


class _LoudStr(str):
    def __str__(self) -> str:
        return "1000"


@pytest.mark.parametrize("amount", [_LoudDecimal("1"), _LoudStr("1")])
def test_f5_an_amount_is_its_value_not_its_str(tmp_path: Path, amount: Any) -> None:
    """F5: a cap or a cost given as a Decimal or str subclass was read through its own
    ``__str__`` ("1000": a dataset capped at ε ≤ 1000 for ε = 1). Its value is taken."""
    acct = Accountant(f"sqlite:///{tmp_path}/ledger.db")
    acct.create_dataset("d", epsilon=amount)
    assert acct.budget("d").cap == {"epsilon": Decimal("1")}
    cost = PureDP(amount)
    assert type(cost.eps) is Decimal and cost.eps == 1
    acct.charge("d", cost)
    assert acct.budget("d").remaining == {"epsilon": Decimal("0")}
