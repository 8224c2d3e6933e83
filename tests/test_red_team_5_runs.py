"""Red team, session 5 (the calibration runs): each test reproduces one finding and passes when
the attack fails.

R1 ``PrivateConformalClassifier(method="ldp-label").conformalize(X, y)`` passed the *true*
   labels to LDP-CP-L as the users' k-RR labels: a release deterministic in y, recorded as
   ε-local DP. The wrapper now simulates the devices' k-RR (or takes labels the devices
   randomized, ``labels_randomized=True``).
R2 string labels without ``classes=``: a private method took its class names from the
   labels (a rare label in the release; a refusal, uncharged, when a class had no record).
R3 a dry run of a shuffled run priced ε0 only and said "allowed" where the run is refused
   for its amplified central (ε, δ).
R4 parameters accepted by their bounds whose cost, guarantee or plan fails in floating point
   (ε = 5e-324, ε = 1e308, raps k_reg = 10³⁰) raised ZeroDivisionError/OverflowError (500s
   over HTTP), and the dry run said "allowed".
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from click.testing import CliRunner

from privcal import Accountant, PrivateConformalClassifier
from privcal.accountant import calibration as C
from privcal.accountant.sessions import open_session
from privcal.calibrators.base import numpy_rng
from privcal.client import krr_many
from privcal.errors import BudgetRefused, InvalidInput
from tests.seeded import Seeded

NAMES = np.array(["cat", "dog", "bird"])


class Softmax:
    """A fitted three-class model: ``predict_proba`` and string ``classes_``."""

    classes_ = NAMES

    def predict_proba(self, X: Any) -> np.ndarray:
        x = np.asarray(X, dtype=float)
        z = np.column_stack([-x, 0 * x, x])
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


def _class_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    X = g.normal(size=n)
    return X, NAMES[np.digitize(X + g.normal(size=n), [-0.5, 0.5])]


class Recording:
    """An accountant that records the labels each calibration is given."""

    def __init__(self, acct: Accountant) -> None:
        self.acct, self.labels = acct, []  # type: ignore[var-annotated]

    def calibrate(self, method: str, **kw: Any) -> Any:
        self.labels.append(np.asarray(kw["labels"]).copy())
        return self.acct.calibrate(method, **kw)


def _state(acct: Accountant, dataset: str = "d") -> tuple[Any, ...]:
    b = acct.budget(dataset)
    return b.spent, b.charges, b.releases, acct.ledger.head()


# ------------------------------------------------------------------ R1: the ldp-label wrapper
def test_estimator_ldp_label_randomizes_the_true_labels(accountant: Accountant) -> None:
    """The calibration sees the devices' k-RR of y (the client's randomizer at the run's ε,
    from the wrapper's rng), not y: two runs on the same data differ, as the noise does."""
    accountant.create_dataset("d", epsilon=1, subject_epsilon=50)
    n, eps = 4000, 2.0
    X, y = _class_data(n)
    truth = np.array([list(NAMES).index(v) for v in y])  # each label's column in classes_
    rec = Recording(accountant)
    thresholds = []
    for seed in (1, 2):
        clf = PrivateConformalClassifier(Softmax(), method="ldp-label", confidence_level=0.9,
                                         accountant=rec, dataset="d", epsilon=eps,
                                         rng=Seeded(seed))
        clf.conformalize(X, y, subjects=[f"s{seed}-{i}" for i in range(n)])
        thresholds.append(clf.release_.threshold)
        assert clf.release_.privacy["statement"].startswith("2-local DP")
    # the labels as class names (red team 23, coverage F2), each the name of its column
    sent = [np.array([list(NAMES).index(v) for v in s]) for s in rec.labels]
    # exactly what the devices' k-RR sends, drawn from the wrapper's rng
    expected = krr_many(truth, 3, eps, numpy_rng(random.Random(1)))
    np.testing.assert_array_equal(sent[0], expected)
    flipped = float(np.mean(sent[0] != truth))
    assert abs(flipped - 2 / (np.e**2 + 2)) < 0.03  # (k−1)/(e^ε+k−1) at ε = 2, k = 3
    assert not np.array_equal(sent[0], sent[1])
    assert np.isfinite(thresholds).all() and thresholds[0] != thresholds[1]


def test_estimator_takes_labels_the_devices_randomized(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=50)
    X, y = _class_data(1500, seed=3)
    rec = Recording(accountant)
    clf = PrivateConformalClassifier(Softmax(), method="ldp-label", accountant=rec,
                                     dataset="d", epsilon=2, rng=Seeded(0))
    clf.conformalize(X, y, subjects=[f"u{i}" for i in range(1500)], labels_randomized=True)
    np.testing.assert_array_equal(rec.labels[0], y)  # used as they are (as class names)
    before = _state(accountant)
    pc = PrivateConformalClassifier(Softmax(), method="pcoqs", accountant=accountant,
                                    dataset="d", rho=0.1)
    with pytest.raises(InvalidInput, match="labels_randomized applies to method='ldp-label'"):
        pc.conformalize(X, y, labels_randomized=True)
    no_eps = PrivateConformalClassifier(Softmax(), method="ldp-label", accountant=accountant,
                                        dataset="d")
    with pytest.raises(InvalidInput, match="ldp-label needs epsilon="):
        no_eps.conformalize(X, y, subjects=[f"v{i}" for i in range(1500)])
    assert _state(accountant) == before


# ------------------------------------------------------------- R2: class names of a private run
@pytest.mark.parametrize("method, extra", [
    ("pcoqs", {"score": "lac", "rho": 0.1}),
    ("exponq", {"score": "lac", "epsilon": 0.5}),
    ("ldp-label", {"epsilon": 2}),
])
def test_private_method_never_reads_class_names_from_labels(accountant: Accountant, method: str,
                                                            extra: dict[str, Any]) -> None:
    """Neighbouring datasets (one record's label a rare name, a common one, another rare
    one) get the same one-line refusal, before anything is charged; with ``classes=`` the
    same data calibrate, and the release records the given names."""
    accountant.create_dataset("d", rho=5, subject_epsilon=10)
    n = 600
    probs = np.random.default_rng(0).dirichlet(np.ones(3), size=n)
    labels = np.array(["cat", "dog"] * (n // 2), dtype=object)
    subjects = {"subjects": [f"u{i}" for i in range(n)]} if method == "ldp-label" else {}
    before = _state(accountant)
    for rare in ("bird", "cat", "emu"):
        lab = labels.copy()
        lab[0] = rare
        with pytest.raises(InvalidInput) as err:
            accountant.calibrate(method, dataset="d", probs=probs, labels=lab, alpha=0.1,
                                 **extra, **subjects)
        msg = str(err.value)
        assert msg.startswith(f"{method} is private: its class names are never read from the "
                              "labels") and "\n" not in msg and "--classes" in msg
        assert rare not in msg
    assert _state(accountant) == before
    lab = labels.copy()
    lab[0] = "bird"
    rel = accountant.calibrate(method, dataset="d", probs=probs, labels=lab, alpha=0.1,
                               classes=["bird", "cat", "dog"], rng=Seeded(1), **extra,
                               **subjects)
    assert rel.classes == ["bird", "cat", "dog"]


def test_private_method_class_names_on_the_cli(ledger_url: str, tmp_path: Path) -> None:
    from privcal.cli import main

    def run(*args: str) -> Any:
        return CliRunner().invoke(main, ["--db-url", ledger_url, *args], catch_exceptions=False)

    assert run("db", "upgrade").exit_code == 0
    assert run("dataset", "create", "d", "--rho", "5").exit_code == 0
    probs = np.random.default_rng(1).dirichlet(np.ones(3), size=300)
    y = np.array(["cat", "dog", "bird"] * 100)
    np.save(tmp_path / "p.npy", probs)
    pcsv.write_csv(pa.table({"y": y}), tmp_path / "y.csv")
    pcoqs = ("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.2",
             "--probs", str(tmp_path / "p.npy"), "--labels", str(tmp_path / "y.csv"),
             "--score", "lac")
    head = run("audit", "head", "--json").stdout
    res = run(*pcoqs)
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pcoqs is private" in lines[0] and "--classes" in lines[0]
    assert run("audit", "head", "--json").stdout == head  # nothing written
    assert run(*pcoqs, "--classes", "cat,dog,bird").exit_code == 0


def test_estimator_passes_the_model_classes(accountant: Accountant) -> None:
    """A fitted model's ``classes_`` are public metadata: a private method calibrates from
    string ``y`` without ``classes=``, and the release records them in column order."""
    accountant.create_dataset("d", rho=1)
    X, y = _class_data(800, seed=4)
    clf = PrivateConformalClassifier(Softmax(), method="pcoqs", accountant=accountant,
                                     dataset="d", rho=0.1, rng=Seeded(0))
    clf.conformalize(X, y)
    assert clf.release_.classes == list(NAMES)


# ------------------------------------------------------------ R3: the dry run of a shuffled run
@pytest.mark.parametrize("cap, allowed", [("0.1", False), ("5", True)])
def test_dry_run_prices_the_shuffled_central_cost(accountant: Accountant, cap: str,
                                                  allowed: bool) -> None:
    accountant.create_dataset("s", approx_epsilon=cap, approx_delta="1e-5", subject_epsilon=6)
    n = 20000
    kw: dict[str, Any] = {"dataset": "s", "scores": np.random.default_rng(0).random(n),
                          "subjects": [f"u{i}" for i in range(n)], "shuffled": True}
    params = {"alpha": 0.1, "epsilon": 2}
    before = _state(accountant, "s")
    dry = C.dry_run(accountant, "ldp-score", params, **kw)
    assert _state(accountant, "s") == before
    assert dry.allowed is allowed
    central = dry.cost["central_cost"]  # type: ignore[index]
    assert central["kind"] == "approx" and central["delta"] == "0.00001"
    if not allowed:
        assert dry.remaining_after is None and "budget refused" in dry.reason
        with pytest.raises(BudgetRefused):
            C.calibrate(accountant, "ldp-score", params, rng=Seeded(0), **kw)
        assert _state(accountant, "s") == before
        return
    rel = C.calibrate(accountant, "ldp-score", params, rng=Seeded(0), **kw)
    assert rel.privacy["central_cost"] == central  # priced as charged
    assert accountant.budget("s").remaining == dry.remaining_after


def test_dry_run_of_label_groups_by_class_name(accountant: Accountant) -> None:
    """Mondrian label groups with class-name labels: the dry run reads the groups as the run
    does (it refused them as "labels must be numeric" while the run accepted them)."""
    accountant.create_dataset("d", rho=1)
    probs = np.random.default_rng(0).dirichlet(np.ones(3), size=300)
    kw: dict[str, Any] = {"dataset": "d", "probs": probs, "labels": np.tile(NAMES, 100),
                          "classes": list(NAMES), "score": "lac", "mondrian": "label",
                          "public_groups": True}
    dry = C.dry_run(accountant, "pcoqs", {"alpha": 0.1, "rho": 0.1}, **kw)
    assert dry.allowed and dry.cost == {"kind": "zcdp", "rho": "0.1"}
    rel = C.calibrate(accountant, "pcoqs", {"alpha": 0.1, "rho": 0.1}, rng=Seeded(0),
                      **kw)
    assert rel.method == "mondrian:pcoqs"
    assert accountant.budget("d").remaining == dry.remaining_after


# ------------------------------------------------------ R4: numbers at the edge of the float range
S = np.arange(100) / 100
IDS = [str(i) for i in range(100)]
EDGE = [
    ("pcoqs rho 5e-324", "pcoqs", {"alpha": 0.1, "rho": 5e-324}, {"scores": S}),
    ("exponq epsilon 1e308", "exponq", {"alpha": 0.1, "epsilon": 1e308}, {"scores": S}),
    ("ldp-score epsilon 5e-324", "ldp-score", {"alpha": 0.1, "epsilon": 5e-324, "rounds": 2},
     {"scores": S, "subjects": IDS}),
    ("fedcp2-qq epsilon 5e-324", "fedcp2-qq", {"alpha": 0.2, "epsilon": 5e-324, "bins": 10},
     {"scores": S, "agents": [i % 5 for i in range(100)]}),
    ("ldp-label epsilon 5e-324", "ldp-label", {"alpha": 0.1, "epsilon": 5e-324},
     {"probs": [[0.5, 0.5]] * 50, "labels": [0, 1] * 25, "subjects": IDS[:50]}),
    ("raps k_reg 1e30", "split", {"alpha": 0.1},
     {"score": "raps", "probs": [[0.5, 0.5]] * 10, "labels": [0] * 10,
      "score_options": {"k_reg": 10**30}}),
    ("raps lam 10**400", "split", {"alpha": 0.1},
     {"score": "raps", "probs": [[0.5, 0.5]] * 10, "labels": [0] * 10,
      "score_options": {"lam": 10**400}}),
    ("raps lam 1e308", "split", {"alpha": 0.1},
     {"score": "raps", "probs": [[0.6, 0.3, 0.1]] * 10, "labels": [2] * 10,
      "score_options": {"lam": 1e308, "k_reg": 0}}),
]


@pytest.mark.parametrize("method, params, inputs", [c[1:] for c in EDGE],
                         ids=[c[0] for c in EDGE])
def test_edge_numbers_are_one_line_errors_in_run_and_dry_run(
        accountant: Accountant, method: str, params: dict[str, Any],
        inputs: dict[str, Any]) -> None:
    accountant.create_dataset("d", epsilon=5, subject_epsilon=10, allow_nonprivate=True)
    before = _state(accountant)
    with pytest.raises(InvalidInput) as dry:
        C.dry_run(accountant, method, params, dataset="d", **inputs)
    with pytest.raises(InvalidInput) as run:
        C.calibrate(accountant, method, params, dataset="d", rng=Seeded(0), **inputs)
    assert str(dry.value) == str(run.value)  # the dry run refuses what the run refuses
    assert "\n" not in str(run.value)
    assert _state(accountant) == before


def test_edge_numbers_shuffled_run_and_session_open(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=5, subject_epsilon=10)
    accountant.create_dataset("s", approx_epsilon=5, approx_delta="1e-5", subject_epsilon=10)
    before = (_state(accountant), _state(accountant, "s"))
    tiny = {"alpha": 0.1, "epsilon": 5e-324, "rounds": 2}
    for call in (
        lambda: C.calibrate(accountant, "ldp-score", tiny, dataset="s", scores=S, subjects=IDS,
                            shuffled=True),
        lambda: C.dry_run(accountant, "ldp-score", tiny, dataset="s", scores=S, subjects=IDS,
                          shuffled=True),
        lambda: open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=5e-324,
                             rounds=2, group_size=4),
        lambda: open_session(accountant, "ldp-score", dataset="s", alpha=0.1, epsilon=5e-324,
                             rounds=2, group_size=4, shuffled=True),
        lambda: open_session(accountant, "fedcp2-qq", dataset="d", alpha=0.2, epsilon=5e-324,
                             agents=5, local_n=20, bins=10),
    ):
        with pytest.raises(InvalidInput) as err:
            call()
        assert "\n" not in str(err.value)
    assert (_state(accountant), _state(accountant, "s")) == before


def test_edge_numbers_over_http_are_422(ledger_url: str) -> None:
    pytest.importorskip("fastapi")
    from tests.service.conftest import serve

    with serve(ledger_url) as lv:
        head = str(lv.accountant.ledger.head())
        with lv.client("analyst") as c:
            r = c.post("/v1/datasets/d/sessions", json={
                "method": "ldp-score", "alpha": 0.1, "epsilon": 5e-324, "rounds": 2,
                "group_size": 4})
            assert r.status_code == 422, r.text
            for _, method, params, inputs in EDGE[:6]:
                body = {"method": method, "params": params, **{
                    k: (v.tolist() if isinstance(v, np.ndarray) else v)
                    for k, v in inputs.items()}}
                for query in ({}, {"dry_run": "true"}):
                    r = c.post("/v1/datasets/d/calibrations", json=body, params=query)
                    assert r.status_code == 422, (method, query, r.text)
                    assert "\n" not in r.json()["detail"]
        assert str(lv.accountant.ledger.head()) == head
