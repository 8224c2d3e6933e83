"""Regression calibration through the library (issue 12): scores computed from predictions
and targets, the public score range made explicit and recorded, intervals, evaluation,
saving and loading a release (in a fresh process), and bad input changing nothing."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from privcal import Accountant, InvalidInput, Release
from privcal.calibrators.intervals import evaluate_intervals
from privcal.calibrators.prediction_sets import outside_threshold
from privcal.calibrators.score_range import OUTSIDE_RANGE, parse_score_range
from privcal.calibrators.scores import label_scores, regression_scores, score_interval
from tests.seeded import Seeded


def _data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, n)
    return x, x + rng.normal(0, 0.1 + x, n)  # heteroscedastic noise


def test_regression_scores_match_label_scores_and_name_what_is_missing() -> None:
    f, y = _data(0, 50)
    np.testing.assert_array_equal(regression_scores("absolute", y, preds=f),
                                  label_scores("absolute", f, y))
    lo, hi = f - 0.3, f + 0.2
    np.testing.assert_array_equal(
        regression_scores("cqr", y, lower_preds=lo, upper_preds=hi),
        label_scores("cqr", np.column_stack([lo, hi]), y))
    np.testing.assert_array_equal(
        regression_scores("cqr", y, preds=np.column_stack([lo, hi])),
        np.maximum(lo - y, y - hi))
    for call, msg in [
        (lambda: regression_scores("absolute", y), "needs the predictions"),
        (lambda: regression_scores("absolute", y, lower_preds=lo, upper_preds=hi), "not --lower"),
        (lambda: regression_scores("cqr", y, lower_preds=lo), "both --lower-preds"),
        (lambda: regression_scores("cqr", y, preds=f), r"shape \(n, 2\)"),
        (lambda: regression_scores("cqr", y, preds=f, upper_preds=hi), "not both"),
        (lambda: regression_scores("cqr", y, lower_preds=lo, upper_preds=hi[:-1]), "length"),
        (lambda: regression_scores("absolute", y[:-1], preds=f), "length"),
        (lambda: regression_scores("lac", y, preds=f), "classification score"),
        (lambda: regression_scores("absolute", y, preds=np.r_[f[:-1], np.nan]),
         "predictions: row 49"),
    ]:
        with pytest.raises(InvalidInput, match=msg):
            call()


def test_parse_score_range() -> None:
    assert parse_score_range("-1.5,2") == (-1.5, 2.0)
    assert parse_score_range((0, 3)) == (0.0, 3.0)
    for bad in ("1", "a,b", "2,1", "0,inf", (1,), None):
        with pytest.raises(InvalidInput):
            parse_score_range(bad)


@pytest.mark.parametrize(("method", "cost"), [
    ("split", {}), ("pcoqs", {"rho": 1.0}), ("exponq", {"epsilon": 2.0}),
])
def test_absolute_release_gives_intervals_and_records_its_range(
    accountant: Accountant, method: str, cost: dict[str, float]
) -> None:
    cap = {"epsilon": 100} if method == "exponq" else {"rho": 100}
    accountant.create_dataset("d", allow_nonprivate=True, **cap)
    f, y = _data(1, 3000)
    ranged = {} if method == "split" else {"score_range": (0, 6)}
    rel = accountant.calibrate(method, dataset="d", preds=f[:2000], targets=y[:2000],
                               score="absolute", alpha=0.1, rng=Seeded(3),
                               **ranged, **cost)  # fmt: skip
    assert rel.diagnostics["score"] == {"name": "absolute", "options": {}}
    if method == "split":
        assert "score_range" not in rel.diagnostics
        assert rel.threshold == np.sort(np.abs(y[:2000] - f[:2000]))[1800]  # r = ⌈2001·0.9⌉
    else:
        assert rel.diagnostics["score_range"] == {
            "lower": 0.0, "upper": 6.0, "source": "score_range", "outside": OUTSIDE_RANGE}
        assert (rel.params["lower"], rel.params["upper"]) == (0.0, 6.0)
    t = rel.threshold
    assert math.isfinite(t)
    iv = rel.predict_interval(f[2000:])
    low, high = score_interval(f[2000:], f[2000:], t)
    np.testing.assert_array_equal(iv, np.column_stack([low, high]))
    ev = rel.evaluate_interval(y[2000:], f[2000:])
    inside = (low <= y[2000:]) & (y[2000:] <= high)
    assert ev.n == 1000 and ev.coverage == inside.mean()
    assert ev.mean_length == pytest.approx(2 * t) and ev.infinite_count == 0
    assert ev.guaranteed_lower == rel.coverage.lower


def test_cqr_release_and_the_method_default_range_is_recorded(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=100)
    f, y = _data(2, 2000)
    lo, hi = f - 0.5, f + 0.5
    rel = accountant.calibrate("pcoqs", dataset="d", lower_preds=lo, upper_preds=hi,
                               targets=y, score="cqr", alpha=0.2, rho=1.0,
                               rng=Seeded(0))  # fmt: skip
    rec = rel.diagnostics["score_range"]
    assert (rec["lower"], rec["upper"], rec["source"]) == (0.0, 1.0, "method default")
    iv = rel.predict_interval(lower_preds=lo[:5], upper_preds=hi[:5])
    t = rel.threshold
    np.testing.assert_array_equal(iv, np.column_stack(score_interval(lo[:5], hi[:5], t)))
    np.testing.assert_array_equal(iv, rel.predict_interval(np.column_stack([lo[:5], hi[:5]])))
    with pytest.raises(InvalidInput, match="calibrated on score 'cqr', not 'absolute'"):
        rel.predict_interval(f, score_name="absolute")
    with pytest.raises(InvalidInput, match="needs both"):
        rel.predict_interval(lower_preds=lo)


def test_an_infinite_threshold_gives_infinite_intervals_counted_and_said(
    accountant: Accountant,
) -> None:
    """Residuals far above a tiny public range: pcoqs releases +∞, never the range's top."""
    accountant.create_dataset("d", rho=100)
    f, y = _data(3, 1000)
    rel = accountant.calibrate("pcoqs", dataset="d", preds=f, targets=y, score="absolute",
                               alpha=0.1, rho=1.0, score_range=(0, 0.01), tol=1e-4,
                               rng=Seeded(0))  # fmt: skip
    assert rel.threshold == math.inf
    iv = rel.predict_interval(f[:4])
    assert (iv[:, 0] == -math.inf).all() and (iv[:, 1] == math.inf).all()
    ev = rel.evaluate_interval(y, f)
    assert ev.coverage == 1.0 and ev.mean_length == math.inf and ev.infinite_count == 1000
    assert ev.mean_finite_length is None and "1000 of 1000 intervals are (−∞, +∞)" in ev.note


def test_evaluate_intervals_counts_infinite_rows_apart() -> None:
    iv = np.array([[0.0, 1.0], [-math.inf, math.inf], [2.0, 4.0], [1.0, 0.0]])
    ev = evaluate_intervals(iv, [0.5, 9.0, 5.0, 0.5], 0.5)
    assert ev.coverage == 0.5 and ev.infinite_count == 1 and ev.mean_length == math.inf
    assert ev.mean_finite_length == pytest.approx((1 + 2 + 0) / 3)
    assert ev.empty_fraction == 0.25 and ev.meets_guarantee
    with pytest.raises(InvalidInput, match="length mismatch"):
        evaluate_intervals(iv, [0.0], 0.5)


def test_a_classification_release_gives_no_intervals(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs = np.full((20, 2), 0.5)
    rel = accountant.calibrate("split", dataset="d", probs=probs, labels=[0, 1] * 10,
                               score="lac", alpha=0.2)
    with pytest.raises(InvalidInput, match="classification score 'lac'"):
        rel.predict_interval(np.zeros(3))
    scored = accountant.calibrate("split", dataset="d", scores=np.arange(20.0), alpha=0.2)
    with pytest.raises(InvalidInput, match="precomputed scores"):
        scored.predict_interval(np.zeros(3))
    iv = scored.predict_interval(np.zeros(3), score_name="absolute")
    # the score named only at predict: the threshold with the slack of scores privcal did
    # not compute (red team 25, coverage F4)
    lo_hi = score_interval(np.zeros(3), np.zeros(3), outside_threshold(scored.threshold))
    assert iv.tolist() == np.column_stack(lo_hi).tolist()
    assert iv[0, 0] <= -scored.threshold and iv[0, 1] >= scored.threshold


@pytest.mark.parametrize(("kwargs", "msg"), [
    ({"preds": "F", "targets": "Y"}, "name the score"),
    ({"preds": "F", "targets": "Y", "score": "lac"}, "classification score"),
    ({"preds": "F", "score": "absolute"}, "needs the true targets"),
    ({"preds": "F", "targets": "Y", "score": "absolute", "scores": "Y"}, "not several"),
    ({"preds": "F", "targets": "Y", "score": "absolute", "score_options": {"lam": 1}},
     "takes no options"),
    ({"preds": "F", "targets": "Y", "score": "absolute", "score_range": (0, 1)},
     "split assumes no score range"),
    ({"lower_preds": "F", "targets": "Y", "score": "cqr"}, "needs both"),
])
def test_bad_regression_requests_change_nothing(
    accountant: Accountant, kwargs: dict[str, object], msg: str
) -> None:
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    f, y = _data(4, 30)
    arrays = {"F": f, "Y": y}
    kw = {k: arrays.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(InvalidInput, match=msg):
        accountant.calibrate("split", dataset="d", alpha=0.1, **kw)
    assert accountant.releases() == []


def test_score_range_given_twice_or_backwards_is_refused(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=10, subject_epsilon=10)
    f, y = _data(5, 100)
    for extra, msg in [({"upper": 3.0}, "once"), ({"score_range": "3,1"}, "lo < hi")]:
        kw = {"score_range": (0, 2), **extra}
        with pytest.raises(InvalidInput, match=msg):
            accountant.calibrate("pcoqs", dataset="d", preds=f, targets=y, score="absolute",
                                 alpha=0.1, rho=0.1, **kw)
    with pytest.raises(InvalidInput, match="does not take regression"):
        accountant.calibrate("ldp-label", dataset="d", preds=f, targets=y, alpha=0.1,
                             epsilon=1.0)
    assert accountant.releases() == []
    assert accountant.budget("d").spent == {"rho": 0}


def test_federated_and_local_methods_take_regression_scores(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=100, subject_epsilon=100, allow_nonprivate=True)
    f, y = _data(6, 4000)
    agents = np.repeat(np.arange(20), 200)
    rel = accountant.calibrate("fedcp-qq", dataset="d", preds=f, targets=y, score="absolute",
                               agents=agents, alpha=0.1)
    assert math.isfinite(rel.threshold) and rel.diagnostics["score"]["name"] == "absolute"
    rel2 = accountant.calibrate("fedcp2-qq", dataset="d", preds=f, targets=y,
                                score="absolute", agents=agents, alpha=0.1, epsilon=5.0,
                                score_range="0,6", rng=Seeded(0))  # fmt: skip
    assert rel2.diagnostics["score_range"]["upper"] == 6.0 and rel2.params["upper"] == 6.0
    assert rel2.predict_interval(f[:2]).shape == (2, 2)
    rel3 = accountant.calibrate("ldp-score", dataset="d", preds=f, targets=y, score="absolute",
                                alpha=0.1, epsilon=2.0, score_range=(0, 6),
                                rng=Seeded(0),
                                subjects=[f"u{i}" for i in range(4000)])  # fmt: skip
    assert rel3.diagnostics["score_range"]["source"] == "score_range"
    assert rel3.predict_interval(f[:2]).shape == (2, 2)
    # the records (the score range included) verify
    assert accountant.verify().guarantees_recomputed == 3


def test_a_session_release_gives_intervals_for_the_score_its_clients_used(
    accountant: Accountant,
) -> None:
    """Agents compute their own regression scores (privcal.client) and send FedCP-QQ
    messages; the session's release records no score, so predict names it."""
    from privcal.accountant import sessions
    from privcal.calibrators.fedplan import plan_fedcp_qq
    from privcal.client import fedcp_qq_message, regression_scores

    accountant.create_dataset("d", epsilon=1, allow_nonprivate=True)
    f, y = _data(9, 2000)
    info = sessions.open_session(accountant, "fedcp-qq", dataset="d", alpha=0.1, agents=10,
                                 local_n=200)
    plan = plan_fedcp_qq(10, 200, 0.1)
    msgs = [fedcp_qq_message(regression_scores("absolute", y[200 * j:200 * (j + 1)],
                                               preds=f[200 * j:200 * (j + 1)]), plan)
            for j in range(10)]
    r = sessions.submit_reports(accountant, info.id, [f"a{j}" for j in range(10)], msgs)
    rel = accountant.release(r.session.release_id)
    with pytest.raises(InvalidInput, match="precomputed scores"):
        rel.predict_interval(f[:3])
    iv = rel.predict_interval(f[:3], score_name="absolute")
    np.testing.assert_array_equal(iv, np.column_stack(score_interval(  # red team 25, F4
        f[:3], f[:3], outside_threshold(rel.threshold))))


def test_saved_release_loads_in_a_fresh_process_with_identical_intervals(
    accountant: Accountant, tmp_path: Path
) -> None:
    accountant.create_dataset("d", rho=100)
    f, y = _data(7, 1500)
    rel = accountant.calibrate("pcoqs", dataset="d", preds=f[:1000], targets=y[:1000],
                               score="absolute", alpha=0.1, rho=1.0, score_range=(0, 6),
                               rng=Seeded(0))  # fmt: skip
    inf_rel = accountant.calibrate("pcoqs", dataset="d", preds=f[:1000], targets=y[:1000],
                                   score="absolute", alpha=0.1, rho=1.0,
                                   score_range=(0, 0.01), tol=1e-4,
                                   rng=Seeded(0))  # fmt: skip
    assert inf_rel.threshold == math.inf
    np.save(tmp_path / "f.npy", f[1000:])
    for i, r in enumerate((rel, inf_rel)):
        (tmp_path / f"r{i}.json").write_text(r.model_dump_json())
        assert Release.load(r.model_dump_json()) == r
    code = (
        "import sys, numpy as np\n"
        "from privcal import Release\n"
        "f = np.load(sys.argv[1] + '/f.npy')\n"
        "for i in (0, 1):\n"
        "    r = Release.load(sys.argv[1] + f'/r{i}.json')\n"
        "    np.save(sys.argv[1] + f'/iv{i}.npy', r.predict_interval(f))\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    np.testing.assert_array_equal(np.load(tmp_path / "iv0.npy"), rel.predict_interval(f[1000:]))
    iv1 = np.load(tmp_path / "iv1.npy")
    assert (iv1[:, 0] == -math.inf).all() and (iv1[:, 1] == math.inf).all()
    assert json.loads((tmp_path / "r1.json").read_text().replace("Infinity", "1e999"))[
        "threshold"] == math.inf


def test_release_load_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no release file"):
        Release.load(tmp_path / "missing.json")
    with pytest.raises(InvalidInput, match="is not a saved release"):
        Release.load('{"id": 1}')
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(InvalidInput, match=r"bad\.json is not a saved release"):
        Release.load(str(tmp_path / "bad.json"))
    with pytest.raises(InvalidInput, match="JSON string or a file path"):
        Release.load(42)


def test_levels_and_mondrian_group_releases_give_each_rows_interval(
    accountant: Accountant,
) -> None:
    accountant.create_dataset("d", rho=10, allow_nonprivate=True)
    f, y = _data(8, 2000)
    g = np.where(f < 0.5, "low", "high")
    rel = accountant.calibrate("split", dataset="d", preds=f, targets=y, score="absolute",
                               alpha=[0.1, 0.2])
    t = {a: r["threshold"] for r in rel.thresholds() for a in [r["alpha"]]}
    iv = rel.predict_interval(f[:5], alpha=0.2)
    np.testing.assert_array_equal(iv, np.column_stack(score_interval(f[:5], f[:5], t[0.2])))
    with pytest.raises(InvalidInput, match="choose one"):
        rel.predict_interval(f[:5])
    assert rel.evaluate_interval(y, f, alpha=0.1).guaranteed_lower == 0.9
    mon = accountant.calibrate("split", dataset="d", preds=f, targets=y, score="absolute",
                               alpha=0.1, groups=g, public_groups=True)
    tg = {r["group"]: r["threshold"] for r in mon.thresholds()}
    assert tg["low"] < tg["high"]  # the noise grows with x
    iv = mon.predict_interval(f[:6], groups=g[:6])
    want = np.array([tg[k] for k in g[:6]])
    np.testing.assert_array_equal(iv, np.column_stack(score_interval(f[:6], f[:6], want)))
    with pytest.raises(InvalidInput, match="give the group of every row"):
        mon.predict_interval(f[:6])
    with pytest.raises(InvalidInput, match="no Mondrian groups"):
        rel.predict_interval(f[:6], alpha=0.1, groups=g[:6])
