"""Red team 5, more findings. Each test is an attack that used to record a false statement,
charge a budget without a release, or double-charge; it passes when the attack fails.

- precomputed scores dropped ``score``/``score_options``: raps scores with λ = 0 were
  recorded without a score, read back as raps with λ = 0.01, k_reg = 5, and covered 0.894
  against a recorded ≥ 0.9;
- ``ldp-label`` dropped ``score_options`` and recorded the defaults;
- ``rng=42`` (or a NumPy Generator) was charged, then crashed inside the calibrator;
- a class name with a lone surrogate was charged, then crashed in the release's JSON;
- the estimator's n×k×L sets drew the randomized scores once per level: not nested;
- a caller's key ``KEY#central`` was taken by a non-private run;
- a shuffled session's central charge took no idempotency key in the library: a crash
  between its commit and the service's record double-charged on retry;
- stale texts (a dry run's central cost printed as a raw dict).
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal.calibrators.prediction_sets import prediction_sets
from privcal.calibrators.scores import label_scores
from privcal.costs import PureDP
from privcal.errors import InvalidInput
from tests.cli_env import CliEnv
from tests.seeded import Seeded


def _written(acct: Any) -> tuple[int, ...]:
    """Charges, audit entries, releases and sessions in the ledger."""
    with acct.ledger.engine.connect() as conn:
        return tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar())
                     for t in ("charges", "audit_log", "releases", "collection_sessions"))


def _cls(seed: int, n: int, k: int = 6) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    p = g.dirichlet(np.ones(k), n)
    y = (p.cumsum(1) > g.random((n, 1))).argmax(1)
    return p, y


def _env(ledger_url: str, tmp_path: Path) -> CliEnv:
    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    return env


RAPS0 = {"randomized": True, "lam": 0.0, "k_reg": 5}


# ------------------------------------------------ 1. precomputed scores keep their score
def test_precomputed_scores_record_the_named_score_with_every_option(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    p, y = _cls(0, 600)
    s = label_scores("raps", p[:300], y[:300], rng=Seeded(1), lam=0.0)
    rel = acct.calibrate("split", dataset="d", scores=s, score="raps",
                         score_options={"lam": 0.0}, alpha=0.1)
    assert rel.diagnostics["score"] == {"name": "raps", "options": RAPS0}
    # predict uses those options (λ = 0), not raps' defaults (λ = 0.01, k_reg = 5)
    got = rel.predict_set(p[300:], rng=Seeded(7))
    want = prediction_sets("raps", p[300:], rel.threshold, rng=Seeded(7), **RAPS0)
    assert np.array_equal(got, want)
    with pytest.raises(InvalidInput, match="calibrated on score 'raps', not 'aps'"):
        rel.predict_set(p[300:], score_name="aps")


def test_precomputed_score_options_are_checked_before_anything_is_written(accountant: Any
                                                                          ) -> None:
    acct = accountant
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    s = np.random.default_rng(0).random(200)
    before = _written(acct)
    for kw, match in (({"score_options": {"lam": 0.0}}, "need the score"),
                      ({"score": "raps", "score_options": {"lam": -1.0}}, "λ"),
                      ({"score": "aps", "score_options": {"lam": 0.1}}, "does not take"),
                      ({"score": "nope"}, "unknown score")):
        with pytest.raises(InvalidInput, match=match):
            acct.calibrate("split", dataset="d", scores=s, alpha=0.1, **kw)
        with pytest.raises(InvalidInput, match=match):  # the dry run refuses it too
            acct.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=0.1, **kw)
    assert _written(acct) == before


def test_cli_precomputed_scores_record_the_score_and_predict_uses_it(ledger_url: str,
                                                                     tmp_path: Path) -> None:
    env = _env(ledger_url, tmp_path)
    assert env.run("dataset", "create", "d", "--rho", "1", "--allow-nonprivate").exit_code == 0
    p, y = _cls(1, 600)
    np.save(env.f("s.npy"), label_scores("raps", p[:300], y[:300], rng=Seeded(2),
                                         lam=0.0))
    np.save(env.f("p.npy"), p[300:])
    doc = env.json("calibrate", "split", "--dataset", "d", "--alpha", "0.1", "--scores",
                   env.f("s.npy"), "--score", "raps", "--score-option", "lam=0")
    assert doc["release"]["diagnostics"]["score"] == {"name": "raps", "options": RAPS0}
    res = env.run("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
                  "--scores", env.f("s.npy"), "--score", "raps", "--score-option", "lam=-1",
                  "--dry-run")
    assert res.exit_code == 1 and res.stderr.count("\n") == 1 and "λ" in res.stderr


# --------------------------------------------------------- 2. ldp-label's score options
def test_ldp_label_refuses_score_options_it_would_not_use(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("l", epsilon=100, subject_epsilon=100)
    p, y = _cls(2, 400, k=3)
    kw = dict(dataset="l", probs=p, labels=y, score="raps", alpha=0.1, epsilon=4.0,
              subjects=[f"x{i}" for i in range(400)], rng=Seeded(0))
    before = _written(acct)
    with pytest.raises(InvalidInput, match=r"ldp-label .*default options"):
        acct.calibrate("ldp-label", score_options={"lam": 0.7, "k_reg": 0}, **kw)
    with pytest.raises(InvalidInput, match="does not take"):
        acct.calibrate("ldp-label", score_options={"nope": 1}, **kw)
    assert _written(acct) == before
    # the defaults, spelled out, are what it uses: accepted and recorded
    rel = acct.calibrate("ldp-label", score_options={"lam": 0.01}, **kw)
    assert rel.diagnostics["score"] == {"name": "raps", "options": {
        "randomized": True, "lam": 0.01, "k_reg": 5}}


# ------------------------------------------------------------- 3. a bad rng: no charge
class _Model:
    classes_ = np.array([0, 1])

    def predict_proba(self, X: Any) -> np.ndarray:
        q = 1 / (1 + np.exp(-np.asarray(X, dtype=float)))
        return np.column_stack([1 - q, q])


@pytest.mark.parametrize("bad", [5, np.random.default_rng(0)], ids=["int", "generator"])
def test_a_bad_rng_is_refused_before_anything_is_charged(accountant: Any, bad: Any) -> None:
    from privcal import PrivateConformalClassifier
    from privcal.calibrators import registry
    from privcal.calibrators.base import CalibrationInput

    acct = accountant
    acct.create_dataset("d", rho=1)
    s = np.random.default_rng(0).random(500)
    before = _written(acct)
    with pytest.raises(InvalidInput, match=r"rng must be a random\.Random .*Random\(seed\)"):
        acct.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=0.1, rng=bad)
    with pytest.raises(InvalidInput, match=r"rng must be a random\.Random"):
        acct.run(registry.get("pcoqs").calibrator, {"alpha": 0.1, "rho": 0.1},
                 CalibrationInput(scores=s), dataset="d", rng=bad)
    with pytest.raises(InvalidInput, match=r"rng must be a random\.Random"):
        PrivateConformalClassifier(_Model(), accountant=acct, dataset="d", rho=0.1, rng=bad)
    clf = PrivateConformalClassifier(_Model(), accountant=acct, dataset="d", rho=0.1)
    clf.rng = bad  # set after construction (scikit-learn style)
    with pytest.raises(InvalidInput, match=r"rng must be a random\.Random"):
        clf.conformalize(s, (s > 0.5).astype(int))
    assert _written(acct) == before
    assert acct.budget("d").spent == {"rho": 0}
    rel = acct.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=0.1)
    with pytest.raises(InvalidInput, match=r"rng must be a random\.Random"):
        rel.predict_set(np.full((2, 2), 0.5), score_name="aps", rng=bad)


# ------------------------------------------------------ 4. class names that are not text
@pytest.mark.parametrize("name", ["a\ud800", "a\x00", "a" * 201],
                         ids=["surrogate", "nul", "long"])
def test_unstorable_class_names_are_refused_before_the_charge(accountant: Any,
                                                              name: str) -> None:
    acct = accountant
    acct.create_dataset("d", rho=1)
    p, y = _cls(3, 300, k=3)
    before = _written(acct)
    with pytest.raises(InvalidInput, match="classes: the name of column 0"):
        acct.calibrate("pcoqs", dataset="d", probs=p, labels=y, classes=[name, "b", "c"],
                       score="lac", alpha=0.1, rho=0.1)
    assert _written(acct) == before


def test_cli_class_name_with_a_non_utf8_byte_is_one_line_and_charges_nothing(
        ledger_url: str, tmp_path: Path) -> None:
    env = _env(ledger_url, tmp_path)
    assert env.run("dataset", "create", "d", "--rho", "1").exit_code == 0
    p, y = _cls(4, 300, k=4)
    np.save(env.f("p.npy"), p)
    np.save(env.f("y.npy"), y)
    # argv decoded with surrogateescape: the byte 0xff becomes the lone surrogate U+DCFF
    res = env.run("calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
                  "--probs", env.f("p.npy"), "--labels", env.f("y.npy"), "--score", "lac",
                  "--classes", "a\udcff,b,c,d")
    assert res.exit_code == 1 and res.stderr.count("\n") == 1
    assert "not valid Unicode" in res.stderr
    assert env.json("budget", "show", "d")["charges"] == 0


# --------------------------------------------------- 5. the estimator's sets are nested
def test_the_estimators_several_level_sets_are_nested(accountant: Any) -> None:
    from privcal import PrivateConformalClassifier

    acct = accountant
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    p, y = _cls(5, 4000, k=3)
    rel = acct.calibrate("split", dataset="d", probs=p[:1000], labels=y[:1000], score="aps",
                         alpha=[0.1, 0.15], rng=Seeded(0))

    class Identity:
        classes_ = np.arange(3)

        def predict_proba(self, X: Any) -> np.ndarray:
            return np.asarray(X)

    clf = PrivateConformalClassifier.from_release(Identity(), rel)
    clf.rng = random.Random(1)
    _, S = clf.predict_set(p[1000:])
    assert S.shape == (3000, 3, 2)
    assert not (S[:, :, 1] & ~S[:, :, 0]).any()  # the 0.85 set ⊆ the 0.9 set, every row
    _, T = clf.predict_set(p[1000:], confidence_level=[0.85, 0.9])  # asked in another order
    assert not (T[:, :, 0] & ~T[:, :, 1]).any()
    with pytest.raises(InvalidInput, match="no level"):
        clf.predict_set(p[1000:], confidence_level=[0.9, 0.8])


# ------------------------------------------------ 6. the reserved '#central' key suffix
def test_a_non_private_run_refuses_the_reserved_key_suffix(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    before = _written(acct)
    with pytest.raises(InvalidInput, match="reserved"):
        acct.calibrate("split", dataset="d", scores=np.random.default_rng(0).random(100),
                       alpha=0.1, idempotency_key="job#central")
    assert _written(acct) == before


# ------------------------------------------- 7. a shuffled session's key, in the library
OPEN = dict(alpha=0.2, epsilon=1.0, rounds=2, group_size=500, shuffled=True)


def _shuffled_dataset(acct: Any) -> None:
    acct.create_dataset("a", approx_epsilon=5, approx_delta=1e-5, subject_epsilon=10)


def test_open_session_replays_its_central_charge_by_key(accountant: Any) -> None:
    from privcal.accountant.sessions import open_session

    acct = accountant
    _shuffled_dataset(acct)
    first = open_session(acct, "ldp-score", dataset="a", idempotency_key="open-1", **OPEN)
    assert first.central_charge_id is not None
    spent = acct.budget("a").spent
    written = _written(acct)
    again = open_session(acct, "ldp-score", dataset="a", idempotency_key="open-1", **OPEN)
    assert again.id == first.id and again.central_charge_id == first.central_charge_id
    assert acct.budget("a").spent == spent and _written(acct) == written
    # the same key for another request (one that charges nothing too): refused
    with pytest.raises(InvalidInput, match="idempotency key 'open-1' was already used"):
        open_session(acct, "ldp-score", dataset="a", idempotency_key="open-1",
                     **{**OPEN, "alpha": 0.3})
    acct.charge("a", PureDP(eps="0.01"), idempotency_key="charge-1")
    written = _written(acct)
    with pytest.raises(InvalidInput, match="idempotency key 'charge-1' was already used"):
        open_session(acct, "ldp-score", dataset="a", idempotency_key="charge-1", **OPEN)
    with pytest.raises(InvalidInput, match="idempotency key 'open-1' was already used"):
        open_session(acct, "ldp-score", dataset="a", idempotency_key="open-1",
                     **{**OPEN, "shuffled": False})
    with pytest.raises(InvalidInput, match="reserved"):
        open_session(acct, "ldp-score", dataset="a", idempotency_key="x#central", **OPEN)
    assert _written(acct) == written
    acct.verify()


def test_cli_session_open_takes_an_idempotency_key(ledger_url: str, tmp_path: Path) -> None:
    env = _env(ledger_url, tmp_path)
    assert env.run("dataset", "create", "a", "--approx-epsilon", "5", "--approx-delta", "1e-5",
                   "--subject-epsilon", "10").exit_code == 0
    args = ("session", "open", "ldp-score", "--dataset", "a", "--alpha", "0.2", "--epsilon",
            "1", "--rounds", "2", "--group-size", "500", "--shuffled", "--idempotency-key", "k")
    one, two = env.json(*args), env.json(*args)
    assert one["id"] == two["id"]
    assert env.json("budget", "show", "a")["charges"] == 1


def test_service_retry_after_a_crash_before_its_record_charges_once(
        ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's own record of the request is written after the library's commit: a
    crash in between (here: the record's write fails, and the retry takes over the request
    left pending) must be answered by the library's replay, not by a second charge."""
    pytest.importorskip("fastapi")
    import httpx

    import privcal.storage.tokens as tokens
    from tests.service.conftest import serve

    crashed: list[bool] = []
    finish = tokens.finish_idempotent

    def crash_once(*args: Any, **kw: Any) -> None:
        if not crashed:
            crashed.append(True)
            raise RuntimeError("the service died before recording its answer")
        finish(*args, **kw)

    monkeypatch.setattr(tokens, "finish_idempotent", crash_once)
    monkeypatch.setattr(tokens, "PENDING_TTL", timedelta(0))
    with serve(ledger_url) as live:
        _shuffled_dataset(live.accountant)
        tok = live.token("analyst", name="ann-a", datasets=["a"])
        body = {"method": "ldp-score", **OPEN}
        with live.client(token=tok) as c:  # the server drops the connection (or 500s)
            try:
                r1 = c.post("/v1/datasets/a/sessions", json=body,
                            headers={"Idempotency-Key": "open-a"})
                assert r1.status_code == 500
            except httpx.HTTPError:
                pass
        assert crashed
        with live.client(token=tok) as c:
            r2 = c.post("/v1/datasets/a/sessions", json=body,
                        headers={"Idempotency-Key": "open-a"})
            # the library's replay: 200 and Idempotent-Replayed (red team 25, service F1; it
            # was answered 201 as a new session)
            assert r2.status_code == 200, r2.text
            assert r2.headers.get("Idempotent-Replayed") == "true"
        budget = live.accountant.budget("a")
        assert budget.charges == 1, budget
        assert r2.json()["id"] == 1 and r2.json()["central_charge_id"] is not None


# ------------------------------------------------------------------- 8. stale texts
def test_a_shuffled_dry_run_prints_its_central_cost_like_a_cost(ledger_url: str,
                                                                 tmp_path: Path) -> None:
    env = _env(ledger_url, tmp_path)
    assert env.run("dataset", "create", "a", "--approx-epsilon", "3", "--approx-delta", "1e-5",
                   "--subject-epsilon", "20").exit_code == 0
    n = 1200
    np.save(env.f("s.npy"), np.random.default_rng(2).beta(2, 5, n))
    (tmp_path / "ids.csv").write_text("subject\n" + "".join(f"{i}\n" for i in range(n)))
    res = env.run("calibrate", "ldp-score", "--dataset", "a", "--alpha", "0.1", "--epsilon",
                  "2", "--simulate", "--shuffled", "--scores", env.f("s.npy"), "--subjects",
                  env.f("ids.csv"), "--dry-run")
    assert res.exit_code == 0, res.stderr
    assert "{" not in res.stdout and "central_cost" not in res.stdout
    assert "central     kind=approx, eps=" in res.stdout


def test_the_labels_and_classes_texts_say_private_methods_need_names() -> None:
    pytest.importorskip("fastapi")
    from privcal.cli.inputs import class_names
    from privcal.service.uploads import CalibrationBody

    desc = CalibrationBody.model_fields["labels"].description or ""
    assert "or all k present" not in desc and "non-private" in desc
    assert "private method" in (class_names.__doc__ or "")
    json.dumps(desc)
