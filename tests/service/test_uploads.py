"""Calibrations with uploaded files (multipart ``.npy/.npz/.csv/.parquet``, read as the CLI
reads them) and string class labels (``classes``) over HTTP: the same releases as the JSON
arrays, the CLI's one-line errors naming the uploaded file, nothing written on bad input."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
NAMES = ["cat", "dog", "bird"]
P = "urn:privcal:problem:"


def _k() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def _data(n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(3), size=n)
    y = np.array([rng.choice(3, p=row) for row in probs])
    return probs, y


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _csv(cols: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    pcsv.write_csv(pa.table(cols), buf)
    return buf.getvalue()


def _parquet(cols: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf)
    return buf.getvalue()


def _post(c: Any, request: dict[str, Any], files: dict[str, tuple[str, bytes]],
          **kw: Any) -> Any:
    return c.post("/v1/datasets/d/calibrations", data={"request": json.dumps(request)},
                  files={k: (n, b) for k, (n, b) in files.items()}, headers=_k(), **kw)


def _state(lv: Live) -> tuple[Any, ...]:
    return (str(lv.accountant.ledger.head()), lv.accountant.budget("d").spent)


def test_uploads_give_the_release_of_the_json_arrays(live: Live) -> None:
    probs, y = _data()
    labels = np.array(NAMES)[y]
    split = {"method": "split", "params": {"alpha": 0.1}, "score": "lac"}
    with live.client("analyst") as c:
        ref = c.post("/v1/datasets/d/calibrations", headers=_k(), json={
            **split, "probs": probs.tolist(), "labels": labels.tolist(), "classes": NAMES})
        assert ref.status_code == 201, ref.text
        assert ref.json()["diagnostics"]["classes"] == NAMES
        want = ref.json()["threshold"]
        table = {**{n: probs[:, j] for j, n in enumerate(NAMES)}, "label": labels}
        uploads: list[tuple[dict[str, Any], dict[str, tuple[str, bytes]]]] = [
            # class names from the probs table's header, labels from its label column
            ({**split, "label_column": "label"}, {"probs": ("calib.csv", _csv(table))}),
            ({**split, "label_column": "label", "columns": "cat:bird"},
             {"probs": ("calib.parquet", _parquet(table))}),
            ({**split, "classes": NAMES}, {"probs": ("p.npy", _npy(probs)),
                                          "labels": ("y.csv", _csv({"y": labels}))}),
        ]
        buf = io.BytesIO()
        np.savez(buf, probs=probs, other=np.zeros(3))
        uploads.append(({**split, "classes": NAMES, "labels": labels.tolist()},
                        {"probs": ("a.npz", buf.getvalue())}))
        for request, files in uploads:
            r = _post(c, request, files)
            assert r.status_code == 201, (request, r.text)
            assert r.json()["threshold"] == want
            assert r.json()["diagnostics"]["classes"] == NAMES
            assert r.headers["location"] == f"/v1/releases/{r.json()['id']}"
        scores = np.linspace(0, 1, 101)
        a = c.post("/v1/datasets/d/calibrations", headers=_k(), json={
            "method": "split", "params": {"alpha": 0.2}, "scores": scores.tolist()})
        b = _post(c, {"method": "split", "params": {"alpha": 0.2}, "select": {"scores": "s"}},
                  {"scores": ("s.csv", _csv({"id": np.arange(101), "s": scores}))})
        assert a.status_code == 201 and b.status_code == 201, b.text
        assert a.json()["threshold"] == b.json()["threshold"]
        # a dry run reads the upload's shape: the cost, nothing written
        before = _state(live)
        d = c.post("/v1/datasets/d/calibrations?dry_run=true", data={"request": json.dumps(
            {"method": "split", "params": {"alpha": 0.2}})},
            files={"scores": ("s.npy", _npy(scores))})
        assert d.status_code == 200, d.text
        assert _state(live) == before


def test_an_upload_is_replayed_by_its_idempotency_key(live: Live) -> None:
    scores = np.linspace(0, 1, 50)
    req = {"request": json.dumps({"method": "split", "params": {"alpha": 0.2}})}
    with live.client("analyst") as c:
        k = _k()
        r1 = c.post("/v1/datasets/d/calibrations", data=req, headers=k,
                    files={"scores": ("s.npy", _npy(scores))})
        r2 = c.post("/v1/datasets/d/calibrations", data=req, headers=k,
                    files={"scores": ("s.npy", _npy(scores))})
        assert r1.status_code == 201 and r2.status_code == 200
        assert r2.json() == r1.json()
        r3 = c.post("/v1/datasets/d/calibrations", data=req, headers=k,
                    files={"scores": ("s.npy", _npy(scores[:40]))})  # another shape
        assert r3.status_code == 409 and r3.json()["type"] == P + "idempotency-key-reused"


def _cli_error(lv: Live, tmp: Path, *args: str) -> str:
    from privcal.cli import main

    res = CliRunner().invoke(main, ["--db-url", lv.ledger_url, "calibrate", "split",
                                    "--dataset", "d", "--alpha", "0.1", *args])
    assert res.exit_code != 0
    line = res.stderr.strip().splitlines()
    assert len(line) == 1, res.stderr
    return line[0].removeprefix("error: ").replace(f"{tmp}/", "")


def test_bad_uploads_are_the_clis_one_line_errors_and_change_nothing(
        live: Live, tmp_path: Path) -> None:
    probs, y = _data(50)
    table = {**{n: probs[:, j] for j, n in enumerate(NAMES)}, "label": np.array(NAMES)[y]}
    (tmp_path / "calib.csv").write_bytes(_csv(table))
    (tmp_path / "words.csv").write_bytes(_csv({"s": np.array(["a", "b"])}))
    split = {"method": "split", "params": {"alpha": 0.1}, "score": "lac"}
    before = _state(live)
    cases = [  # (request, files, the CLI arguments that fail the same way)
        ({**split, "columns": "cat:cow", "label_column": "label"},
         {"probs": ("calib.csv", _csv(table))},
         ["--probs", str(tmp_path / "calib.csv"), "--columns", "cat:cow",
          "--label-column", "label", "--score", "lac"]),
        ({"method": "split", "params": {"alpha": 0.1}},
         {"scores": ("words.csv", _csv({"s": np.array(["a", "b"])}))},
         ["--scores", str(tmp_path / "words.csv")]),
    ]
    with live.client("analyst") as c:
        for request, files, cli in cases:
            r = _post(c, request, files)
            assert r.status_code == 422, r.text
            detail = r.json()["detail"]
            assert "\n" not in detail and "privcal-upload" not in detail and "/tmp" not in detail
            assert detail == _cli_error(live, tmp_path, *cli)
        for request, files, where in [
            (split, {"probs": ("calib.txt", b"1,2,3")}, "unsupported file type '.txt'"),
            (split, {"probs": ("p.npy", b"\x93NUMPY garbage")}, "p.npy: cannot read it"),
            ({**split, "scores": [0.1]}, {"scores": ("s.npy", _npy(np.ones(3)))},
             "scores given twice"),
            ({**split, "select": {"labels": "y"}}, {"probs": ("p.npy", _npy(probs))},
             "select names 'labels'"),
            ({**split, "label_column": "nope", "columns": "cat:bird"},
             {"probs": ("calib.csv", _csv(table))},
             "calib.csv: no column named 'nope'"),
            ({**split, "labels": ["cat", "cow"] * 25, "classes": NAMES},
             {"probs": ("p.npy", _npy(probs))}, "'cow', not one of the classes"),
        ]:
            r = _post(c, request, files)
            assert r.status_code == 422, (where, r.text)
            assert where in r.json()["detail"] and "\n" not in r.json()["detail"], r.text
        r = c.post("/v1/datasets/d/calibrations", headers=_k(), files={
            "scores": ("s.npy", _npy(np.ones(3)))})
        assert r.status_code == 422 and "no 'request' field" in r.json()["detail"]
        r = c.post("/v1/datasets/d/calibrations", headers=_k(),
                   data={"request": json.dumps({**split, "requester": "mallory"})},
                   files={"scores": ("s.npy", _npy(np.ones(3)))})
        assert r.status_code == 422 and r.json()["detail"].startswith("request.requester")
        r = c.post("/v1/datasets/d/calibrations", headers={**_k(), "content-type":
                                                          "text/plain"}, content=b"x")
        assert r.status_code == 415 and r.json()["type"] == P + "unsupported-media-type"
        r = c.post("/v1/datasets/d/calibrations", headers=_k(), json={
            **split, "scores": [0.1, 0.2], "columns": "a:b"})
        assert r.status_code == 422 and "uploaded files" in r.json()["detail"]
    assert _state(live) == before


def test_an_upload_past_the_body_limit_is_413(live: Live) -> None:
    import httpx

    from privcal.service.app import create_app
    from tests.service.conftest import start_server

    app = create_app(accountant=live.accountant, body_limit=4096)
    url, server, th = start_server(app)
    try:
        with httpx.Client(base_url=url, headers={
                "Authorization": f"Bearer {live.tokens['analyst']}"}) as c:
            r = _post(c, {"method": "split", "params": {"alpha": 0.1}},
                      {"scores": ("s.npy", _npy(np.linspace(0, 1, 5000)))})
            assert r.status_code == 413 and r.json()["type"] == P + "body-too-large"
    finally:
        server.should_exit = True
        th.join(timeout=30)
    assert live.accountant.ledger.head().seq == 2  # the two datasets only
