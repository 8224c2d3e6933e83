"""Bad input through the Python API is a privcal error, on both backends (issue 15).

A corpus of malformed calls — wrong types, ids as str/float/huge ints, NUL bytes and lone
surrogates in names, amounts no decimal context holds, None where data belongs — goes
through the public API (:class:`Accountant`, :class:`Ledger`, the collection sessions) on
SQLite and on PostgreSQL. Each call must raise the expected :class:`PrivcalError`
subclass (``InvalidInput``, ``NotFound`` or ``AlreadyExists``) with a one-line message —
never a driver error, ``OverflowError``, ``decimal.InvalidOperation``, ``AttributeError``
or ``TypeError`` — and must write nothing: the audit head, every table's row count and
every dataset's spent totals are unchanged after it.

The ledger is shared by all cases of one backend (module scope), so each refusal is
checked against a ledger that already holds datasets, charges, releases and a session.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from sqlalchemy import func, select

from privcal import Accountant, Ledger
from privcal.accountant import sessions as S
from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.calibrators.registry import get as get_calibrator
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import AlreadyExists, InvalidInput, NotFound, PrivcalError
from privcal.storage.models import Base, Dataset

RNG = np.random.default_rng(15)
N = 300
SCORES = RNG.beta(2, 5, N)
PROBS = RNG.dirichlet(np.ones(3), N)
LABELS = RNG.integers(0, 3, N)
AGENTS = np.repeat(np.arange(6), N // 6)
SURROGATE = "\ud800"
HUGE = 2**70
HEAD64 = "0" * 64


@dataclass
class World:
    acct: Accountant
    release_id: int
    session_id: int


def _pg_url() -> str | None:
    return os.environ.get("PRIVCAL_TEST_DATABASE_URL")


@pytest.fixture(scope="module",
                params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('corpus')}/ledger.sqlite"
    else:
        admin = _pg_url()
        if admin is None:
            pytest.skip("PRIVCAL_TEST_DATABASE_URL not set")
        import psycopg

        schema = f"privcal_c_{uuid.uuid4().hex[:16]}"
        dsn = admin.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in admin else "?"
        url = f"{admin}{sep}options={quote(f'-csearch_path={schema}')}"
    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("d", rho=10, subject_epsilon=5, allow_nonprivate=True)
    acct.create_dataset("a", approx_epsilon=5, approx_delta=1e-5, subject_epsilon=5)
    acct.create_dataset("p", epsilon=5, subject_epsilon=5)
    rel = acct.calibrate("pcoqs", dataset="d", probs=PROBS, labels=LABELS, score="lac",
                         alpha=0.1, rho=0.1)
    acct.charge("d", ZCDP(rho=0.05), purpose="outside")
    acct.charge_subjects("d", 1, ["u1", "u2"])
    sess = S.open_session(acct, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=2,
                          group_size=50)
    S.submit_reports(acct, sess.id, ["r1", "r2"], [0, 1], [0, 0])
    yield World(acct, rel.id, sess.id)
    led.close()
    if schema is not None:
        import psycopg

        dsn = _pg_url().replace("postgresql+psycopg://", "postgresql://", 1)  # type: ignore[union-attr]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _snapshot(acct: Accountant) -> tuple[Any, ...]:
    with acct.ledger.read() as s:
        counts = tuple(s.scalar(select(func.count()).select_from(t))
                       for t in Base.metadata.sorted_tables)
        spent = tuple(s.execute(select(
            Dataset.name, Dataset.spent_pure_eps, Dataset.spent_pure_rho, Dataset.spent_zcdp_rho,
            Dataset.spent_approx_eps, Dataset.spent_approx_delta, Dataset.charge_count,
            Dataset.allow_nonprivate).order_by(Dataset.name)).all())
    return acct.ledger.head(), counts, spent


Call = Callable[[World], Any]
PC: dict[str, Any] = {"dataset": "d", "alpha": 0.1, "rho": 0.1}
LS: dict[str, Any] = {"dataset": "d", "alpha": 0.1, "epsilon": 1, "scores": SCORES}


def cal(method: Any, **kw: Any) -> Call:
    return lambda w: w.acct.calibrate(method, **kw)


def ds_create(name: Any = "new", **kw: Any) -> Call:
    kw = kw or {"rho": 1}
    return lambda w: w.acct.create_dataset(name, **kw)


INV, NF, AE = InvalidInput, NotFound, AlreadyExists

# case id → (expected error class, the call)
CASES: dict[str, tuple[type[PrivcalError], Call]] = {
    # ---- datasets
    "create: name None": (INV, ds_create(None)),
    "create: name int": (INV, ds_create(123)),
    "create: name empty": (INV, ds_create("")),
    "create: name spaces": (INV, ds_create("  x ")),
    "create: name NUL": (INV, ds_create("a\x00b")),
    "create: name lone surrogate": (INV, ds_create(SURROGATE)),
    "create: name too long": (INV, ds_create("x" * 201)),
    "create: taken": (AE, ds_create("d")),
    "create: eps text": (INV, ds_create(epsilon="abc")),
    "create: eps negative": (INV, ds_create(epsilon=-1)),
    "create: eps zero": (INV, ds_create(epsilon=0)),
    "create: eps bool": (INV, ds_create(epsilon=True)),
    "create: eps 1e16": (INV, ds_create(epsilon=1e16)),
    "create: eps underscore": (INV, ds_create(epsilon="1_0")),
    "create: eps nan": (INV, ds_create(epsilon=float("nan"))),
    "create: eps inf": (INV, ds_create(epsilon=float("inf"))),
    "create: rho list": (INV, ds_create(rho=[1])),
    "create: two budgets": (INV, ds_create(epsilon=1, rho=1)),
    "create: approx delta 1.5": (INV, ds_create(approx_epsilon=1, approx_delta=1.5)),
    "create: approx eps only": (INV, ds_create(approx_epsilon=1)),
    "create: subject eps text": (INV, ds_create(rho=1, subject_epsilon="x")),
    "create: allow_nonprivate 'no'": (INV, ds_create(rho=1, allow_nonprivate="no")),
    "create: allow_nonprivate 1": (INV, ds_create(rho=1, allow_nonprivate=1)),
    "create: description int": (INV, ds_create(rho=1, description=123)),
    "create: description NUL": (INV, ds_create(rho=1, description="a\x00")),
    "create: reporting delta 2": (INV, ds_create(rho=1, delta=2)),
    "dataset: int": (INV, lambda w: w.acct.dataset(123)),  # type: ignore[arg-type]
    "dataset: None": (INV, lambda w: w.acct.dataset(None)),  # type: ignore[arg-type]
    "dataset: NUL": (INV, lambda w: w.acct.dataset("d\x00")),
    "dataset: surrogate": (INV, lambda w: w.acct.dataset(SURROGATE)),
    "dataset: missing": (NF, lambda w: w.acct.dataset("missing")),
    "budget: int": (INV, lambda w: w.acct.budget(123)),  # type: ignore[arg-type]
    "budget: missing": (NF, lambda w: w.acct.budget("missing")),
    "subject_summary: list": (INV, lambda w: w.acct.subject_summary(["d"])),  # type: ignore[arg-type]
    "subject_spend: None id": (INV, lambda w: w.acct.subject_spend("d", None)),
    "subject_spend: float id": (INV, lambda w: w.acct.subject_spend("d", 1.5)),
    "subject_spend: NUL id": (INV, lambda w: w.acct.subject_spend("d", "a\x00")),
    "subject_spend: empty id": (INV, lambda w: w.acct.subject_spend("d", "")),
    "subject_spend: missing dataset": (NF, lambda w: w.acct.subject_spend("missing", "u1")),
    # ---- charges
    "charge: rho 1e16": (INV, lambda w: w.acct.charge("d", ZCDP(rho=1e16))),
    "charge: eps 1e16": (INV, lambda w: w.acct.charge("p", PureDP(eps=1e16))),
    "charge: cost text": (INV, lambda w: w.acct.charge("d", "abc")),  # type: ignore[arg-type]
    "charge: cost None": (INV, lambda w: w.acct.charge("d", None)),  # type: ignore[arg-type]
    "charge: cost dict": (INV, lambda w: w.acct.charge("d", {"rho": 1})),  # type: ignore[arg-type]
    "charge: local cost": (INV, lambda w: w.acct.charge("d", LocalDP(eps0=1))),  # type: ignore[arg-type]
    "charge: delta rounds to 1": (INV, lambda w: w.acct.charge(
        "a", ApproxDP(eps=1, delta="0.9999999999999"))),
    "charge: dataset int": (INV, lambda w: w.acct.charge(123, ZCDP(rho=0.1))),  # type: ignore[arg-type]
    "charge: dataset NUL": (INV, lambda w: w.acct.charge("d\x00", ZCDP(rho=0.1))),
    "charge: dataset surrogate": (INV, lambda w: w.acct.charge(SURROGATE, ZCDP(rho=0.1))),
    "charge: dataset missing": (NF, lambda w: w.acct.charge("missing", ZCDP(rho=0.1))),
    "charge: purpose int": (INV, lambda w: w.acct.charge("d", ZCDP(rho=0.1), purpose=123)),  # type: ignore[arg-type]
    "charge: purpose NUL": (INV, lambda w: w.acct.charge("d", ZCDP(rho=0.1), purpose="\x00")),
    "charge: requester surrogate": (INV, lambda w: w.acct.charge(
        "d", ZCDP(rho=0.1), requester=SURROGATE)),
    "charge: key int": (INV, lambda w: w.acct.charge("d", ZCDP(rho=0.1), idempotency_key=5)),  # type: ignore[arg-type]
    "charge: key NUL": (INV, lambda w: w.acct.charge("d", ZCDP(rho=0.1), idempotency_key="k\x00")),
    "subjects: float ids": (INV, lambda w: w.acct.charge_subjects("d", 1, [1.5, 2.5])),
    "subjects: float array": (INV, lambda w: w.acct.charge_subjects("d", 1, np.array([1.0, 2.0]))),
    "subjects: None id": (INV, lambda w: w.acct.charge_subjects("d", 1, ["a", None])),
    "subjects: empty id": (INV, lambda w: w.acct.charge_subjects("d", 1, ["a", ""])),
    "subjects: NUL id": (INV, lambda w: w.acct.charge_subjects("d", 1, ["a\x00"])),
    "subjects: surrogate id": (INV, lambda w: w.acct.charge_subjects("d", 1, [SURROGATE])),
    "subjects: bool id": (INV, lambda w: w.acct.charge_subjects("d", 1, [True, "x"])),
    "subjects: one string": (INV, lambda w: w.acct.charge_subjects("d", 1, "abc")),
    "subjects: empty list": (INV, lambda w: w.acct.charge_subjects("d", 1, [])),
    "subjects: 2-D": (INV, lambda w: w.acct.charge_subjects("d", 1, [[1, 2], [3, 4]])),
    "subjects: id too long": (INV, lambda w: w.acct.charge_subjects("d", 1, ["x" * 201])),
    "subjects: eps0 text": (INV, lambda w: w.acct.charge_subjects("d", "x", ["a"])),
    "subjects: eps0 negative": (INV, lambda w: w.acct.charge_subjects("d", -1, ["a"])),
    "subjects: eps0 1e16": (INV, lambda w: w.acct.charge_subjects("d", 1e16, ["a"])),
    "subjects: eps0 underscore": (INV, lambda w: w.acct.charge_subjects("d", "1_0", ["a"])),
    "subjects: dataset int": (INV, lambda w: w.acct.charge_subjects(5, 1, ["a"])),  # type: ignore[arg-type]
    "subjects: dataset missing": (NF, lambda w: w.acct.charge_subjects("missing", 1, ["a"])),
    "subjects: central cost text": (INV, lambda w: w.acct.charge_subjects(
        "a", 1, ["a"], central_cost="x")),  # type: ignore[arg-type]
    # ---- releases
    "release: str id": (INV, lambda w: w.acct.release("1")),  # type: ignore[arg-type]
    "release: 2**70": (NF, lambda w: w.acct.release(HUGE)),
    "release: 2**63": (NF, lambda w: w.acct.release(2**63)),
    "release: negative": (NF, lambda w: w.acct.release(-1)),
    "release: zero": (NF, lambda w: w.acct.release(0)),
    "release: None": (INV, lambda w: w.acct.release(None)),  # type: ignore[arg-type]
    "release: float": (INV, lambda w: w.acct.release(1.0)),  # type: ignore[arg-type]
    "release: bool": (INV, lambda w: w.acct.release(True)),
    "release: unknown": (NF, lambda w: w.acct.release(987654)),
    "ledger.release: str id": (INV, lambda w: w.acct.ledger.release("1")),  # type: ignore[arg-type]
    "ledger.release: 2**70": (NF, lambda w: w.acct.ledger.release(HUGE)),
    "releases: dataset int": (INV, lambda w: w.acct.releases(dataset=123)),  # type: ignore[arg-type]
    "releases: dataset NUL": (INV, lambda w: w.acct.releases(dataset="d\x00")),
    "releases: dataset missing": (NF, lambda w: w.acct.releases(dataset="missing")),
    "ledger.releases: dataset int": (INV, lambda w: w.acct.ledger.releases(dataset=123)),  # type: ignore[arg-type]
    "predict_set: other k": (INV, lambda w: w.acct.release(w.release_id).predict_set(
        np.full((4, 5), 0.2))),
    "record_release: threshold text": (INV, lambda w: w.acct.record_release(
        "d", method="x", calibrator_version="1", threshold="x", params={}, shape={},  # type: ignore[arg-type]
        coverage={"target": 0.9, "lower": 0.9, "over": "x", "statement": "x"}, privacy={})),
    "record_release: charge id text": (INV, lambda w: w.acct.record_release(
        "d", method="x", calibrator_version="1", threshold=0.5, params={}, shape={},
        coverage={"target": 0.9, "lower": 0.9, "over": "x", "statement": "x"}, privacy={},
        charge_ids=["a"])),
    "record_release: charge id 2**70": (NF, lambda w: w.acct.record_release(
        "d", method="x", calibrator_version="1", threshold=0.5, params={}, shape={},
        coverage={"target": 0.9, "lower": 0.9, "over": "x", "statement": "x"}, privacy={},
        charge_ids=[HUGE])),
    # ---- verify
    "verify: expect_head int": (INV, lambda w: w.acct.verify(expect_head=123)),  # type: ignore[arg-type]
    "verify: expect_head text": (INV, lambda w: w.acct.verify(expect_head="abc")),
    "verify: expect_head bad hex": (INV, lambda w: w.acct.verify(expect_head="1:zz")),
    "verify: expect_head negative": (INV, lambda w: w.acct.verify(expect_head=f"-1:{HEAD64}")),
    "verify: expect_head NUL": (INV, lambda w: w.acct.verify(expect_head="\x00")),
    "ledger.verify: expect_head list": (INV, lambda w: w.acct.ledger.verify(expect_head=[1])),  # type: ignore[arg-type]
    # ---- calibrate
    "calibrate: method None": (INV, cal(None, **PC, scores=SCORES)),
    "calibrate: method int": (INV, cal(123, **PC, scores=SCORES)),
    "calibrate: method unknown": (NF, cal("nope", **PC, scores=SCORES)),
    "calibrate: params list": (INV, lambda w: w.acct.calibrate("pcoqs", [1], **PC, scores=SCORES)),  # type: ignore[arg-type]
    "calibrate: dataset int": (INV, cal("pcoqs", dataset=123, alpha=0.1, rho=0.1, scores=SCORES)),
    "calibrate: dataset None": (INV, cal("pcoqs", dataset=None, alpha=0.1, rho=0.1,
                                         scores=SCORES)),
    "calibrate: dataset NUL": (INV, cal("pcoqs", dataset="d\x00", alpha=0.1, rho=0.1,
                                        scores=SCORES)),
    "calibrate: dataset missing": (NF, cal("pcoqs", dataset="missing", alpha=0.1, rho=0.1,
                                           scores=SCORES)),
    "calibrate: no data": (INV, cal("pcoqs", **PC)),
    "calibrate: scores None": (INV, cal("pcoqs", **PC, scores=None)),
    "calibrate: scores text": (INV, cal("pcoqs", **PC, scores="abc")),
    "calibrate: scores 2-D": (INV, cal("pcoqs", **PC, scores=[[0.1, 0.2], [0.3, 0.4]])),
    "calibrate: scores ragged": (INV, cal("pcoqs", **PC, scores=[[0.1], [0.2, 0.3]])),
    "calibrate: scores NaN": (INV, cal("pcoqs", **PC, scores=[0.1, float("nan"), 0.3])),
    "calibrate: scores objects": (INV, cal("pcoqs", **PC, scores=[object(), object()])),
    "calibrate: alpha text": (INV, cal("pcoqs", dataset="d", alpha="x", rho=0.1, scores=SCORES)),
    "calibrate: alpha 2": (INV, cal("pcoqs", dataset="d", alpha=2, rho=0.1, scores=SCORES)),
    "calibrate: rho 1e16": (INV, cal("pcoqs", dataset="d", alpha=0.1, rho=1e16, scores=SCORES)),
    "calibrate: rho negative": (INV, cal("pcoqs", dataset="d", alpha=0.1, rho=-1,
                                         scores=SCORES)),
    "calibrate: unknown parameter": (INV, cal("pcoqs", **PC, scores=SCORES, foo=1)),
    "calibrate: score int": (INV, cal("pcoqs", **PC, probs=PROBS, labels=LABELS, score=5)),
    "calibrate: score unknown": (INV, cal("pcoqs", **PC, probs=PROBS, labels=LABELS,
                                          score="nope")),
    "calibrate: score_options text": (INV, cal("pcoqs", **PC, probs=PROBS, labels=LABELS,
                                               score="lac", score_options="x")),
    "calibrate: probs 1-D": (INV, cal("pcoqs", **PC, probs=PROBS[:, 0], labels=LABELS,
                                      score="lac")),
    "calibrate: labels out of range": (INV, cal("pcoqs", **PC, probs=PROBS, labels=LABELS + 3,
                                                score="lac")),
    "calibrate: labels short": (INV, cal("pcoqs", **PC, probs=PROBS, labels=LABELS[:-1],
                                         score="lac")),
    "calibrate: subjects on central": (INV, cal("pcoqs", **PC, scores=SCORES,
                                                subjects=np.arange(N))),
    "calibrate: shuffled text": (INV, cal("ldp-score", **LS, shuffled="yes")),
    "calibrate: shuffled central": (INV, cal("pcoqs", **PC, scores=SCORES, shuffled=True)),
    "calibrate: shuffled ldp-label": (INV, cal("ldp-label", dataset="a", alpha=0.1, epsilon=1,
                                               k=3, probs=PROBS, labels=LABELS, shuffled=True)),
    "calibrate: shuffled ldp-label assumed": (INV, cal(
        "ldp-label", dataset="a", alpha=0.1, epsilon=1, k=3, probs=PROBS, labels=LABELS,
        shuffled=True, assume_unlinkable_features=True)),
    "calibrate: shuffled fedcp2-qq": (INV, cal("fedcp2-qq", dataset="a", alpha=0.1, epsilon=8,
                                               scores=SCORES, agents=AGENTS, shuffled=True)),
    "calibrate: assumption unshuffled": (INV, cal("ldp-score", **LS,
                                                  assume_unlinkable_features=True)),
    "calibrate: subjects float": (INV, cal("ldp-score", **LS, subjects=np.arange(N) + 0.5)),
    "calibrate: subjects integral floats": (INV, cal("ldp-score", **LS,
                                                     subjects=np.arange(N, dtype=float))),
    "calibrate: subjects None id": (INV, cal("ldp-score", **LS,
                                             subjects=[None] + [str(i) for i in range(N - 1)])),
    "calibrate: subjects empty id": (INV, cal("ldp-score", **LS,
                                              subjects=[""] + [str(i) for i in range(N - 1)])),
    "calibrate: subjects NUL id": (INV, cal("ldp-score", **LS,
                                            subjects=["\x00"] + [str(i) for i in range(N - 1)])),
    "calibrate: subjects short": (INV, cal("ldp-score", **LS, subjects=np.arange(N - 1))),
    "calibrate: subjects 2-D": (INV, cal("ldp-score", **LS, subjects=np.arange(N).reshape(-1, 2))),
    "calibrate: subjects scalar": (INV, cal("ldp-score", **LS, subjects=7)),
    "calibrate: agents float": (INV, cal("fedcp2-qq", dataset="d", alpha=0.1, epsilon=8,
                                         scores=SCORES, agents=AGENTS.astype(float))),
    "calibrate: agents missing": (INV, cal("fedcp2-qq", dataset="d", alpha=0.1, epsilon=8,
                                           scores=SCORES)),
    "calibrate: agents None id": (INV, cal("fedcp2-qq", dataset="d", alpha=0.1, epsilon=8,
                                           scores=SCORES, agents=[None] * N)),
    "calibrate: requester int": (INV, cal("pcoqs", **PC, scores=SCORES, requester=5)),
    "calibrate: key list": (INV, cal("pcoqs", **PC, scores=SCORES, idempotency_key=["x"])),
    "calibrate: key surrogate": (INV, cal("pcoqs", **PC, scores=SCORES,
                                          idempotency_key=SURROGATE)),
    "run: not a calibrator": (INV, lambda w: w.acct.run(
        None, {}, CalibrationInput(scores=SCORES), dataset="d")),  # type: ignore[arg-type]
    "run: data not an input": (INV, lambda w: w.acct.run(
        get_calibrator("pcoqs").calibrator, {"alpha": 0.1, "rho": 0.1}, SCORES,  # type: ignore[arg-type]
        dataset="d")),
    "dry_run: dataset missing": (NF, lambda w: w.acct.dry_run(
        get_calibrator("pcoqs").calibrator, {"alpha": 0.1, "rho": 0.1}, DataShape(n=100),
        "missing")),
    "dry_run: params text": (INV, lambda w: w.acct.dry_run(
        get_calibrator("pcoqs").calibrator, "x", DataShape(n=100), "d")),
    # ---- sessions
    "open: method None": (INV, lambda w: S.open_session(w.acct, None, dataset="d", alpha=0.1)),  # type: ignore[arg-type]
    "open: method unknown": (INV, lambda w: S.open_session(w.acct, "nope", dataset="d",
                                                           alpha=0.1)),
    "open: dataset int": (INV, lambda w: S.open_session(
        w.acct, "ldp-score", dataset=5, alpha=0.1, epsilon=1, rounds=2, group_size=10)),  # type: ignore[arg-type]
    "open: dataset missing": (NF, lambda w: S.open_session(
        w.acct, "ldp-score", dataset="missing", alpha=0.1, epsilon=1, rounds=2, group_size=10)),
    "open: alpha text": (INV, lambda w: S.open_session(
        w.acct, "ldp-score", dataset="d", alpha="x", epsilon=1, rounds=2, group_size=10)),  # type: ignore[arg-type]
    "open: rounds float": (INV, lambda w: S.open_session(
        w.acct, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=1.5, group_size=10)),  # type: ignore[arg-type]
    "open: no epsilon": (INV, lambda w: S.open_session(
        w.acct, "ldp-score", dataset="d", alpha=0.1, rounds=2, group_size=10)),
    "open: shuffled text": (INV, lambda w: S.open_session(
        w.acct, "ldp-score", dataset="a", alpha=0.1, epsilon=1, rounds=2, group_size=10,
        shuffled="yes")),  # type: ignore[arg-type]
    "open: shuffled fedcp2-qq": (INV, lambda w: S.open_session(
        w.acct, "fedcp2-qq", dataset="a", alpha=0.1, epsilon=8, agents=50, local_n=100,
        shuffled=True)),
    "open: requester NUL": (INV, lambda w: S.open_session(
        w.acct, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=2, group_size=10,
        requester="\x00")),
    "submit: session text": (INV, lambda w: S.submit_reports(w.acct, "abc", ["a"], [1])),
    "submit: session 2**70": (NF, lambda w: S.submit_reports(w.acct, HUGE, ["a"], [1])),
    "submit: session None": (INV, lambda w: S.submit_reports(w.acct, None, ["a"], [1])),  # type: ignore[arg-type]
    "submit: float ids": (INV, lambda w: S.submit_reports(w.acct, w.session_id, [1.5], [1])),
    "submit: None id": (INV, lambda w: S.submit_reports(w.acct, w.session_id, [None], [1])),
    "submit: empty id": (INV, lambda w: S.submit_reports(w.acct, w.session_id, [""], [1])),
    "submit: surrogate id": (INV, lambda w: S.submit_reports(w.acct, w.session_id, [SURROGATE],
                                                             [1])),
    "submit: empty batch": (INV, lambda w: S.submit_reports(w.acct, w.session_id, [], [])),
    "submit: lengths differ": (INV, lambda w: S.submit_reports(w.acct, w.session_id, ["a"],
                                                               [1, 0])),
    "submit: ldp-score without rounds": (INV, lambda w: S.submit_reports(
        w.acct, w.session_id, ["new"], [1])),
    "status: None": (INV, lambda w: S.session_status(w.acct, None)),  # type: ignore[arg-type]
    "status: 2**70": (NF, lambda w: S.session_status(w.acct, HUGE)),
    "status: negative": (NF, lambda w: S.session_status(w.acct, -3)),
    "status: float": (INV, lambda w: S.session_status(w.acct, 1.5)),  # type: ignore[arg-type]
    "close: text": (INV, lambda w: S.close_session(w.acct, "x")),  # type: ignore[arg-type]
    "close: 2**70": (NF, lambda w: S.close_session(w.acct, HUGE)),
    "release_of: float": (INV, lambda w: S.release_of(w.acct, 1.5)),  # type: ignore[arg-type]
}


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 100


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_api_call_is_a_privcal_error_and_writes_nothing(world: World,
                                                                  case: str) -> None:
    expected, call = CASES[case]
    before = _snapshot(world.acct)
    with pytest.raises(PrivcalError) as err:
        call(world)
    assert type(err.value) is expected or (expected is INV and isinstance(err.value, INV)), (
        f"{case}: expected {expected.__name__}, got {type(err.value).__name__}: {err.value}")
    message = str(err.value)
    assert message and "\n" not in message, f"{case}: not one line: {message!r}"
    assert _snapshot(world.acct) == before, f"{case}: the ledger changed"
