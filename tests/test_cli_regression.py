"""``privcal calibrate … --preds/--targets``, ``predict`` and ``evaluate`` for regression
releases, end to end through the CLI (issue 12): intervals in every output format, ±inf
kept and said, the score range recorded, bad input refused with nothing written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from privcal.calibrators.scores import score_interval
from tests.cli_env import CliEnv


@pytest.fixture
def env(ledger_url: str, tmp_path: Path) -> CliEnv:
    e = CliEnv(ledger_url, tmp_path)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 3000)
    y = x + rng.normal(0, 0.1 + x, 3000)
    for name, a in {"f": x[:2000], "y": y[:2000], "ft": x[2000:], "yt": y[2000:],
                    "lo": x[:2000] - 0.5, "hi": x[:2000] + 0.5,
                    "lot": x[2000:] - 0.5, "hit": x[2000:] + 0.5}.items():
        np.save(tmp_path / f"{name}.npy", a)
    for args in (("db", "upgrade"), ("dataset", "create", "z", "--rho", "10", "--allow-nonprivate"),
                 ("dataset", "create", "e", "--epsilon", "10"),
                 ("dataset", "create", "fed", "--epsilon", "10", "--subject-epsilon", "10",
                  "--allow-nonprivate")):
        res = e.run(*args)
        assert res.exit_code == 0, res.stderr
    return e


def _state(env: CliEnv) -> tuple[object, ...]:
    return (env.json("audit", "head")["head"], len(env.json("release", "list")),
            json.dumps(env.json("budget", "show", "z")["spent"], sort_keys=True))


def test_absolute_calibrate_predict_evaluate(env: CliEnv) -> None:
    doc = env.json("calibrate", "pcoqs", "--dataset", "z", "--preds", env.f("f.npy"),
                   "--targets", env.f("y.npy"), "--score", "absolute", "--score-range", "0,6",
                   "--alpha", "0.1", "--rho", "0.5")
    rel = doc["release"]
    assert rel["diagnostics"]["score"] == {"name": "absolute", "options": {}}
    assert rel["diagnostics"]["score_range"]["source"] == "score_range"
    assert (rel["params"]["lower"], rel["params"]["upper"]) == (0.0, 6.0)
    t = rel["threshold"]
    f = np.load(env.f("ft.npy"))
    out = env.json("predict", "--release", str(rel["id"]), "--preds", env.f("ft.npy"))
    low, high = score_interval(f, f, t)  # the ends, a few ulps outward (red team 12)
    np.testing.assert_array_equal(np.array(out["intervals"]), np.column_stack([low, high]))
    assert out["infinite_count"] == 0
    for suffix in (".npy", ".npz", ".csv", ".parquet", ".json"):
        path = env.f("iv" + suffix)
        res = env.run("predict", "--release", str(rel["id"]), "--preds", env.f("ft.npy"),
                      "--out", path)
        assert res.exit_code == 0, res.stderr
        if suffix == ".npy":
            got = np.load(path)
        elif suffix == ".npz":
            got = np.load(path)["intervals"]
        elif suffix == ".json":
            got = np.array(json.loads(Path(path).read_text()))
        else:
            tab = (pq.read_table(path) if suffix == ".parquet"
                   else __import__("pyarrow.csv").csv.read_csv(path))
            assert tab.column_names == ["lower", "upper"]
            got = np.column_stack([tab["lower"].to_numpy(), tab["upper"].to_numpy()])
        np.testing.assert_allclose(got, np.column_stack([low, high]), rtol=0, atol=1e-12)
    ev = env.json("evaluate", "--release", str(rel["id"]), "--preds", env.f("ft.npy"),
                  "--targets", env.f("yt.npy"))
    yt = np.load(env.f("yt.npy"))
    assert ev["coverage"] == ((low <= yt) & (yt <= high)).mean()
    assert ev["mean_length"] == pytest.approx(2 * t) and ev["infinite_count"] == 0
    human = env.run("evaluate", "--release", str(rel["id"]), "--preds", env.f("ft.npy"),
                    "--targets", env.f("yt.npy")).stdout
    assert "coverage" in human and "mean length" in human


def test_cqr_with_an_infinite_threshold_is_said(env: CliEnv) -> None:
    res = env.run("calibrate", "pcoqs", "--dataset", "z", "--lower-preds", env.f("lo.npy"),
                  "--upper-preds", env.f("hi.npy"), "--targets", env.f("y.npy"), "--score",
                  "cqr", "--score-range=-1,0.01", "--tol", "0.001", "--alpha", "0.1",
                  "--rho", "0.5")
    assert res.exit_code == 0, res.stderr
    assert "+inf (every interval is (−inf, +inf))" in res.stdout
    assert "score range         [-1.0, 0.01] (--score-range)" in res.stdout
    out = env.json("predict", "--release", "1", "--lower-preds", env.f("lot.npy"),
                   "--upper-preds", env.f("hit.npy"))
    assert out["threshold"] == "Infinity" and out["infinite_count"] == 1000
    assert out["intervals"][0] == ["-Infinity", "Infinity"]
    env.run("predict", "--release", "1", "--lower-preds", env.f("lot.npy"), "--upper-preds",
            env.f("hit.npy"), "--out", env.f("inf.npy"))
    got = np.load(env.f("inf.npy"))
    assert (got[:, 0] == -math.inf).all() and (got[:, 1] == math.inf).all()
    human = env.run("evaluate", "--release", "1", "--lower-preds", env.f("lot.npy"),
                    "--upper-preds", env.f("hit.npy"), "--targets", env.f("yt.npy")).stdout
    assert "+inf: 1000 of 1000 intervals are (−inf, +inf)" in human


def test_every_central_and_federated_method_takes_preds(env: CliEnv) -> None:
    np.save(env.f("agents.npy"), np.repeat(np.arange(10), 200))
    (env.dir / "ids.csv").write_text("subject\n" + "".join(f"user-{i}\n" for i in range(2000)))
    args = ["--preds", env.f("f.npy"), "--targets", env.f("y.npy"), "--score", "absolute",
            "--alpha", "0.1"]
    for method, extra in [
        ("split", ["--dataset", "z"]),
        ("pcoqs", ["--dataset", "z", "--rho", "0.5", "--score-range", "0,6"]),
        ("exponq", ["--dataset", "e", "--epsilon", "1", "--score-range", "0,6"]),
        ("fedcp-qq", ["--dataset", "fed", "--agent-of", env.f("agents.npy")]),
        ("fedcp2-qq", ["--dataset", "fed", "--agent-of", env.f("agents.npy"), "--epsilon", "5",
                       "--score-range", "0,6"]),
        ("ldp-score", ["--dataset", "fed", "--epsilon", "2", "--score-range", "0,6",
                       "--simulate", "--subjects", env.f("ids.csv")]),
    ]:
        rel = env.json("calibrate", method, *args, *extra)["release"]
        assert rel["diagnostics"]["score"]["name"] == "absolute", method
        out = env.json("predict", "--release", str(rel["id"]), "--preds", env.f("ft.npy"))
        assert len(out["intervals"]) == 1000


@pytest.mark.parametrize(("args", "msg"), [
    (["split", "--dataset", "z", "--preds", "F", "--targets", "Y", "--alpha", "0.1"],
     "name the score"),
    (["split", "--dataset", "z", "--preds", "F", "--targets", "Y", "--score", "lac",
      "--alpha", "0.1"], "classification score"),
    (["pcoqs", "--dataset", "z", "--preds", "F", "--targets", "Y", "--score", "absolute",
      "--score-range", "0,5", "--upper", "5", "--alpha", "0.1", "--rho", "0.1"], "once"),
    (["pcoqs", "--dataset", "z", "--preds", "F", "--score", "absolute", "--alpha", "0.1",
      "--rho", "0.1"], "needs the true targets"),
    (["pcoqs", "--dataset", "z", "--lower-preds", "F", "--targets", "Y", "--score", "cqr",
      "--alpha", "0.1", "--rho", "0.1"], "needs both"),
])
def test_bad_regression_calibrations_change_nothing(
    env: CliEnv, args: list[str], msg: str
) -> None:
    before = _state(env)
    files = {"F": env.f("f.npy"), "Y": env.f("y.npy")}
    res = env.run("calibrate", *[files.get(a, a) for a in args])
    assert res.exit_code != 0 and msg in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert _state(env) == before


def test_split_has_no_score_range_option_and_predict_needs_one_kind(env: CliEnv) -> None:
    res = env.run("calibrate", "split", "--dataset", "z", "--preds", env.f("f.npy"),
                  "--targets", env.f("y.npy"), "--score", "absolute", "--score-range", "0,1",
                  "--alpha", "0.1")
    assert res.exit_code == 2 and "No such option '--score-range'" in res.stderr
    env.json("calibrate", "split", "--dataset", "z", "--preds", env.f("f.npy"), "--targets",
             env.f("y.npy"), "--score", "absolute", "--alpha", "0.1")
    for args, msg in [
        (["--probs", env.f("ft.npy"), "--preds", env.f("ft.npy")], "not both"),
        ([], "give --probs (classification) or --preds"),
        (["--lower-preds", env.f("lot.npy"), "--upper-preds", env.f("hit.npy")],
         "not --lower-preds/--upper-preds"),
    ]:
        res = env.run("predict", "--release", "1", *args)
        assert res.exit_code != 0 and msg in res.stderr, res.stderr
    res = env.run("evaluate", "--release", "1", "--preds", env.f("ft.npy"))
    assert res.exit_code == 2 and "--targets" in res.stderr


def test_levels_release_intervals_take_alpha(env: CliEnv) -> None:
    rel = env.json("calibrate", "split", "--dataset", "z", "--preds", env.f("f.npy"),
                   "--targets", env.f("y.npy"), "--score", "absolute",
                   "--alpha", "0.1,0.2")["release"]
    res = env.run("predict", "--release", str(rel["id"]), "--preds", env.f("ft.npy"))
    assert res.exit_code != 0 and "choose one" in res.stderr
    wide = env.json("predict", "--release", str(rel["id"]), "--preds", env.f("ft.npy"),
                    "--alpha", "0.1")["intervals"]
    narrow = env.json("predict", "--release", str(rel["id"]), "--preds", env.f("ft.npy"),
                      "--alpha", "0.2")["intervals"]
    assert all(w[0] <= n[0] and n[1] <= w[1] for w, n in zip(wide, narrow, strict=True))
    ev = env.json("evaluate", "--release", str(rel["id"]), "--preds", env.f("ft.npy"),
                  "--targets", env.f("yt.npy"), "--alpha", "0.2")
    assert ev["guaranteed_lower"] == 0.8
    res = env.run("predict", "--release", str(rel["id"]), "--preds", env.f("ft.npy"),
                  "--alpha", "all")
    assert res.exit_code != 0 and "choose one level" in res.stderr
