"""Regression, Mondrian and several levels over HTTP (issues 10, 12 and 13 follow-ups): the
service's calibration body is the library's ``CalibrationRequest``, as JSON arrays or
uploaded files; dry runs cost what ``privcal calibrate … --dry-run`` says; every bad input
is the CLI's one-line message as a 422 and charges nothing; replays and 409s as for every
calibration; the release over HTTP is enough for a client to build intervals and sets."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from tests.service.conftest import Live
from tests.service.test_uploads import _csv, _npy

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
P = "urn:privcal:problem:"
URL = "/v1/datasets/d/calibrations"


def _k() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def _reg(n: int = 400) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 1, n)
    y = x + rng.normal(0, 0.1 + x, n)
    return {"f": x, "y": y, "lo": x - 0.5, "hi": x + 0.5}


def _cls(n: int = 600) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    probs = rng.dirichlet(np.ones(3), size=n)
    y = np.array([rng.choice(3, p=row) for row in probs])
    site = rng.choice(["north", "south"], size=n)
    return {"probs": probs, "cy": y, "site": site}


def _files(tmp: Path, arrays: dict[str, np.ndarray]) -> dict[str, str]:
    out = {}
    for name, a in arrays.items():
        np.save(tmp / f"{name}.npy", a)
        out[name] = str(tmp / f"{name}.npy")
    return out


def _cli(lv: Live, *args: str) -> Any:
    """``privcal calibrate … --json`` on the server's ledger: (exit code, document or the
    one error line)."""
    from privcal.cli import main

    res = CliRunner().invoke(main, ["--db-url", lv.ledger_url, "calibrate", *args, "--json"])
    if res.exit_code == 0:
        return 0, json.loads(res.stdout)
    return res.exit_code, json.loads(res.stdout)["error"]["message"]


def _state(lv: Live) -> tuple[Any, ...]:
    b = lv.accountant.budget("d")
    return str(lv.accountant.ledger.head()), b.charges, b.releases, dict(b.spent)


def _post(c: Any, body: dict[str, Any], files: dict[str, tuple[str, bytes]] | None = None,
          *, dry: bool = False, headers: dict[str, str] | None = None) -> Any:
    url = URL + ("?dry_run=true" if dry else "")
    h = headers if headers is not None else _k()
    if files is None:
        return c.post(url, json=body, headers=h)
    return c.post(url, data={"request": json.dumps(body)}, files=files, headers=h)


def test_regression_absolute_and_cqr_over_json_and_multipart(live: Live,
                                                             tmp_path: Path) -> None:
    from privcal.accountant.results import Release

    d = _reg()
    f = _files(tmp_path, d)
    with live.client("analyst") as c:
        for score, arrays, cli in [
            ("absolute", {"preds": d["f"], "targets": d["y"]},
             ["--preds", f["f"], "--targets", f["y"]]),
            ("cqr", {"lower_preds": d["lo"], "upper_preds": d["hi"], "targets": d["y"]},
             ["--lower-preds", f["lo"], "--upper-preds", f["hi"], "--targets", f["y"]]),
        ]:
            body = {"method": "split", "params": {"alpha": 0.1}, "score": score}
            js = _post(c, {**body, **{k: v.tolist() for k, v in arrays.items()}})
            assert js.status_code == 201, js.text
            up = _post(c, body, {k: (f"{k}.npy", _npy(v)) for k, v in arrays.items()})
            assert up.status_code == 201, up.text
            code, want = _cli(live, "split", "--dataset", "d", "--alpha", "0.1",
                              "--score", score, *cli)
            assert code == 0, want
            for r in (js, up):
                assert r.json()["threshold"] == want["release"]["threshold"]
                assert r.json()["diagnostics"]["score"] == {"name": score, "options": {}}
            # GET /v1/releases/{id} carries what a client needs to build the intervals
            got = c.get(f"/v1/releases/{up.json()['id']}")
            assert got.status_code == 200
            rel = Release.load(json.dumps(got.json()))
            t = want["release"]["threshold"]
            new = {k: v[:20] for k, v in arrays.items() if k != "targets"}
            lo = new.get("preds", new.get("lower_preds")) - t
            hi = new.get("preds", new.get("upper_preds")) + t
            np.testing.assert_allclose(rel.predict_interval(**new), np.column_stack([lo, hi]))
        # a private method with a public score range, JSON and a CSV column
        body = {"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.2}, "score": "absolute",
                "score_range": [0, 6]}
        r = _post(c, body, {"preds": ("t.csv", _csv({"f": d["f"], "y": d["y"]})),
                            "targets": ("t.csv", _csv({"f": d["f"], "y": d["y"]}))})
        assert r.status_code == 422 and "select" not in r.text  # two columns: name one
        r = _post(c, {**body, "select": {"preds": "f", "targets": "y"}},
                  {"preds": ("t.csv", _csv({"f": d["f"], "y": d["y"]})),
                   "targets": ("t.csv", _csv({"f": d["f"], "y": d["y"]}))})
        assert r.status_code == 201, r.text
        rec = r.json()["diagnostics"]["score_range"]
        assert (rec["lower"], rec["upper"], rec["source"]) == (0.0, 6.0, "score_range")
        assert r.json()["params"]["upper"] == 6.0


def test_mondrian_and_levels_over_json_and_multipart(live: Live, tmp_path: Path) -> None:
    from privcal.accountant.results import Release

    d = _cls()
    f = _files(tmp_path, d)
    base = {"method": "split", "score": "lac", "public_groups": True}
    with live.client("analyst") as c:
        label = _post(c, {**base, "params": {"alpha": [0.1, 0.2]}, "mondrian": "label",
                          "probs": d["probs"].tolist(), "labels": d["cy"].tolist()})
        assert label.status_code == 201, label.text
        code, want = _cli(live, "split", "--dataset", "d", "--alpha", "0.1,0.2", "--score",
                          "lac", "--probs", f["probs"], "--labels", f["cy"], "--mondrian",
                          "label", "--public-groups")
        assert code == 0, want
        rel = Release.load(json.dumps(c.get(f"/v1/releases/{label.json()['id']}").json()))
        assert rel.thresholds() == Release.model_validate(want["release"]).thresholds()
        assert len(rel.thresholds()) == 6  # 3 classes × 2 levels
        sets = rel.predict_set(d["probs"][:30], alpha=0.2)
        ref = live.accountant.release(label.json()["id"]).predict_set(d["probs"][:30], alpha=0.2)
        np.testing.assert_array_equal(sets, ref)
        col = _post(c, {**base, "params": {"alpha": 0.1}},
                    {"probs": ("p.npy", _npy(d["probs"])), "labels": ("y.npy", _npy(d["cy"])),
                     "groups": ("sites.csv", _csv({"site": d["site"]}))})
        assert col.status_code == 201, col.text
        js = _post(c, {**base, "params": {"alpha": 0.1}, "probs": d["probs"].tolist(),
                       "labels": d["cy"].tolist(), "groups": d["site"].tolist()})
        assert js.status_code == 201, js.text
        assert js.json()["diagnostics"] == col.json()["diagnostics"]
        assert js.json()["params"]["groups"] == ["north", "south"]
        rel = Release.load(json.dumps(c.get(f"/v1/releases/{col.json()['id']}").json()))
        ref = live.accountant.release(col.json()["id"])
        np.testing.assert_array_equal(
            rel.predict_set(d["probs"][:40], groups=d["site"][:40]),
            ref.predict_set(d["probs"][:40], groups=d["site"][:40]))


@pytest.mark.parametrize(("body", "cli"), [
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.2}, "score": "absolute",
      "score_range": [0, 6], "preds": "f", "targets": "y"},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.2", "--score", "absolute", "--score-range",
      "0,6", "--preds", "f", "--targets", "y"]),
    ({"method": "pcoqs", "params": {"alpha": [0.05, 0.1, 0.2], "rho": 0.1}, "scores": "s"},
     ["pcoqs", "--alpha", "0.05,0.1,0.2", "--rho", "0.1", "--scores", "s"]),
    ({"method": "pcoqs", "params": {"alpha": [0.1, 0.2], "rho": 0.25}, "score": "lac",
      "probs": "probs", "labels": "cy", "mondrian": "label", "public_groups": True},
     ["pcoqs", "--alpha", "0.1,0.2", "--rho", "0.25", "--score", "lac", "--probs", "probs",
      "--labels", "cy", "--mondrian", "label", "--public-groups"]),
    ({"method": "exponq", "params": {"alpha": 0.1, "epsilon": 0.3}, "scores": "s",
      "groups": "site", "public_groups": True},
     ["exponq", "--alpha", "0.1", "--epsilon", "0.3", "--scores", "s", "--groups", "site",
      "--public-groups"]),
])
@pytest.mark.parametrize("upload", [False, True])
def test_dry_run_costs_equal_the_clis(live: Live, tmp_path: Path, body: dict[str, Any],
                                      cli: list[str], upload: bool) -> None:
    d = {**_reg(600), **_cls(600)}
    d["s"] = np.abs(d["f"] - d["y"]) / 4
    f = _files(tmp_path, d)
    keys = {k for k, v in body.items() if isinstance(v, str) and v in d}
    before = _state(live)
    with live.client("analyst") as c:
        if upload:
            r = _post(c, {k: v for k, v in body.items() if k not in keys},
                      {k: (f"{body[k]}.npy", _npy(d[body[k]])) for k in keys}, dry=True)
        else:
            r = _post(c, {**body, **{k: d[body[k]].tolist() for k in keys}}, dry=True)
    assert r.status_code == 200, r.text
    code, want = _cli(live, cli[0], "--dataset", "d", "--dry-run",
                      *[f.get(a, a) for a in cli[1:]])
    assert code == 0, want
    assert r.json()["cost"] == want["cost"] and r.json()["allowed"] == want["allowed"]
    assert r.json()["remaining_after"] == want["remaining_after"]
    assert _state(live) == before


# (request body, the CLI arguments that fail the same way); arrays named by key of _DATA
_BAD: list[tuple[dict[str, Any], list[str]]] = [
    ({"method": "split", "params": {"alpha": 0.1}, "preds": "f", "targets": "y"},
     ["split", "--alpha", "0.1", "--preds", "f", "--targets", "y"]),  # name the score
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, "preds": "f",
      "score": "absolute"},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.1", "--preds", "f", "--score", "absolute"]),
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, "preds": "f", "targets": "y",
      "score": "absolute", "score_range": [5, 0]},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.1", "--preds", "f", "--targets", "y", "--score",
      "absolute", "--score-range", "5,0"]),
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1, "upper": 5.0}, "preds": "f",
      "targets": "y", "score": "absolute", "score_range": [0, 5]},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.1", "--upper", "5", "--preds", "f", "--targets",
      "y", "--score", "absolute", "--score-range", "0,5"]),
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, "lower_preds": "lo",
      "targets": "y", "score": "cqr"},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.1", "--lower-preds", "lo", "--targets", "y",
      "--score", "cqr"]),
    ({"method": "split", "params": {"alpha": 0.1}, "preds": "f", "targets": "y_short",
      "score": "absolute"},
     ["split", "--alpha", "0.1", "--preds", "f", "--targets", "y_short", "--score",
      "absolute"]),
    ({"method": "split", "params": {"alpha": 0.1}, "preds": "f", "targets": "y_nan",
      "score": "absolute"},
     ["split", "--alpha", "0.1", "--preds", "f", "--targets", "y_nan", "--score",
      "absolute"]),
    ({"method": "split", "params": {"alpha": 0.1}, "preds": "f_inf", "targets": "y",
      "score": "absolute"},
     ["split", "--alpha", "0.1", "--preds", "f_inf", "--targets", "y", "--score",
      "absolute"]),
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, "probs": "probs", "labels": "c",
      "score": "lac", "mondrian": "label"},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.1", "--probs", "probs", "--labels", "c",
      "--score", "lac", "--mondrian", "label"]),  # public groups absent
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, "scores": "s",
      "groups": "site_short", "public_groups": True},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.1", "--scores", "s", "--groups", "site_short",
      "--public-groups"]),  # a group per row
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, "probs": "probs",
      "labels": "c_out", "score": "lac", "mondrian": "label", "public_groups": True},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.1", "--probs", "probs", "--labels", "c_out",
      "--score", "lac", "--mondrian", "label", "--public-groups"]),  # a label outside [0, k)
    ({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, "scores": "s",
      "public_groups": True},
     ["pcoqs", "--alpha", "0.1", "--rho", "0.1", "--scores", "s", "--public-groups"]),
    ({"method": "split", "params": {"alpha": 0.1}, "preds": "f", "targets": "y",
      "score": "absolute", "score_range": [0, 5]},
     None),  # split has no --score-range option; the library's message
    ({"method": "pcoqs", "params": {"alpha": [0.1, 1.5], "rho": 0.1}, "scores": "s"},
     ["pcoqs", "--alpha", "0.1,1.5", "--rho", "0.1", "--scores", "s"]),
    ({"method": "ldp-score", "params": {"alpha": 0.1, "epsilon": 1.0}, "scores": "s",
      "assume_unlinkable_features": True}, None),
]


def _bad_data() -> dict[str, np.ndarray]:
    d = {**_reg(200), **_cls(200)}
    d["s"] = np.abs(d["f"] - d["y"]) / 4
    d["y_short"] = d["y"][:-1]
    d["y_nan"] = d["y"].copy()
    d["y_nan"][3] = np.nan
    d["f_inf"] = d["f"].copy()
    d["f_inf"][5] = np.inf
    d["c"] = d["cy"]
    d["c_out"] = d["c"].copy()
    d["c_out"][4] = 3
    d["site_short"] = d["site"][:-1]
    return d


@pytest.mark.parametrize("upload", [False, True])
@pytest.mark.parametrize("dry", [False, True])
def test_bad_inputs_are_the_clis_one_line_422_and_charge_nothing(
        live: Live, tmp_path: Path, upload: bool, dry: bool) -> None:
    d = _bad_data()
    f = _files(tmp_path, d)
    before = _state(live)
    with live.client("analyst") as c:
        for body, cli in _BAD:
            keys = {k for k, v in body.items() if isinstance(v, str) and v in d}
            if upload:
                # an upload keeps NaN and ±inf (JSON arrays are checked the same way below)
                r = _post(c, {k: v for k, v in body.items() if k not in keys},
                          {k: (f"{body[k]}.npy", _npy(d[body[k]])) for k in keys}, dry=dry)
            else:
                content = json.dumps({**body, **{k: d[body[k]].tolist() for k in keys}})
                r = c.post(URL + ("?dry_run=true" if dry else ""), content=content,
                           headers={**_k(), "content-type": "application/json"})
            if cli is None:
                assert r.status_code == 422, (body, r.text)
                continue
            # the same request through the CLI (a dry run reads shapes, not values: NaN
            # targets cost what any targets cost, there as here)
            code, want = _cli(live, cli[0], "--dataset", "d", *(["--dry-run"] if dry else []),
                              *[f.get(a, a) for a in cli[1:]])
            if dry and code == 0:
                assert r.status_code == 200 and r.json()["cost"] == want["cost"], r.text
                continue
            assert code == 1, (cli, want)
            assert r.status_code == 422, (body, r.text)
            assert r.headers["content-type"] == "application/problem+json"
            detail = r.json()["detail"]
            assert "\n" not in detail and "/tmp" not in detail, detail
            assert detail == want.replace(str(tmp_path) + "/", ""), (body, detail, want)
    assert _state(live) == before


@pytest.mark.parametrize(("body", "where"), [
    ({"public_groups": 1}, "public_groups"),
    ({"shuffled": "true"}, "shuffled"),
    ({"mondrian": "site"}, "mondrian"),
    ({"score_range": [0, 1, 2]}, "score_range"),
    ({"score_range": "0,1"}, "score_range"),
    ({"targets": ["1.5"]}, "targets"),
    ({"groupz": ["a"]}, "groupz"),
    ({"preds": [True, False]}, "preds"),
])
def test_strict_bodies_refuse_loose_types(live: Live, body: dict[str, Any],
                                          where: str) -> None:
    before = _state(live)
    with live.client("analyst") as c:
        r = _post(c, {"method": "split", "params": {"alpha": 0.1}, "scores": [0.1, 0.2, 0.3],
                      **body})
    assert r.status_code == 422, r.text
    assert where in r.json()["detail"] and "\n" not in r.json()["detail"]
    assert _state(live) == before


def test_replays_and_key_reuse(live: Live) -> None:
    d = _reg(300)
    body = {"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.05}, "score": "absolute",
            "score_range": [0, 6], "preds": d["f"].tolist(), "targets": d["y"].tolist()}
    groups = np.array(["a", "b"] * 150)
    mond = {"method": "split", "params": {"alpha": [0.1, 0.2]}, "score": "absolute",
            "preds": d["f"].tolist(), "targets": d["y"].tolist(), "groups": groups.tolist(),
            "public_groups": True}
    with live.client("analyst") as c:
        for first, other in [(body, {**body, "score_range": [0, 5]}),
                             (body, {**body, "params": {"alpha": [0.1, 0.2], "rho": 0.05}}),
                             (mond, {**mond, "params": {"alpha": [0.1, 0.3]}}),
                             (mond, {**mond, "groups": None, "public_groups": False})]:
            k = _k()
            r1 = _post(c, first, headers=k)
            assert r1.status_code == 201, r1.text
            spent = _state(live)
            r2 = _post(c, first, headers=k)
            assert r2.status_code == 200 and r2.json() == r1.json()
            assert r2.headers["Idempotent-Replayed"] == "true"
            r3 = _post(c, other, headers=k)
            assert r3.status_code == 409 and r3.json()["type"] == P + "idempotency-key-reused"
            assert _state(live) == spent
        # a multipart upload of the same regression request under its own key
        k = _k()
        files = {"preds": ("f.npy", _npy(d["f"])), "targets": ("y.npy", _npy(d["y"]))}
        req = {x: v for x, v in body.items() if x not in ("preds", "targets")}
        r1 = _post(c, req, files, headers=k)
        r2 = _post(c, req, files, headers=k)
        assert r1.status_code == 201 and r2.status_code == 200 and r2.json() == r1.json()
        r3 = _post(c, {**req, "score_range": [0, 7]}, files, headers=k)
        assert r3.status_code == 409


def test_the_openapi_document_describes_the_new_inputs(live: Live) -> None:
    with live.client() as c:
        spec = c.get("/openapi.json").json()
    body = spec["paths"][URL.replace("/d/", "/{name}/")]["post"]["requestBody"]["content"]
    props = body["application/json"]["schema"]["properties"]
    for field in ("preds", "lower_preds", "upper_preds", "targets", "score_range", "mondrian",
                  "groups", "public_groups", "shuffled", "params"):
        assert field in props, field
    assert body["application/json"]["schema"]["additionalProperties"] is False
    form = body["multipart/form-data"]["schema"]["properties"]
    for part in ("preds", "lower_preds", "upper_preds", "targets", "groups"):
        assert form[part]["format"] == "binary"
