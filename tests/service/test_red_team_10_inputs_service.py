"""Red team 10 (r10fuzz), the service: a JSON calibration with ragged ``probs`` rows answered a
plain-text 500 (finding 5), and an uploaded parquet subject column of type decimal or bool was
read as ids "7.00" / "true" (finding 6). Each is a one-line 422 problem now, nothing written."""

from __future__ import annotations

import decimal
import io
import json
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.service.conftest import Live, ledger_snapshot

P = "urn:privcal:problem:"


def _problem(r: Any) -> str:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == P + "invalid-input" and body["status"] == 422
    assert "\n" not in body["detail"] and "/tmp" not in body["detail"], body["detail"]
    return str(body["detail"])


def test_ragged_probs_rows_are_a_422_problem(live: Live) -> None:
    """``np.asarray(probs, float)`` ran before the ragged-rows check: a text/plain 500."""
    probs = np.random.default_rng(1).dirichlet(np.ones(3), 300).tolist()
    body = {"method": "split", "params": {"alpha": 0.1}, "score": "lac", "labels": [0] * 300}
    key = {"Idempotency-Key": uuid.uuid4().hex}
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        for ragged in ([*probs[:-1], [1.0]], [[0.5, 0.5], [1.0], *probs[2:]],
                       [*probs[:-1], []]):
            r = c.post("/v1/datasets/d/calibrations", json={**body, "probs": ragged},
                       headers=key)
            assert _problem(r) == "probs must be a matrix: every row the same length"
        r = c.post("/v1/datasets/d/calibrations?dry_run=true",
                   json={**body, "probs": [*probs[:-1], [1.0]]})
        assert _problem(r) == "probs must be a matrix: every row the same length"
        assert ledger_snapshot(live) == before  # nothing written, the key not kept
        r = c.post("/v1/datasets/d/calibrations", json={**body, "probs": probs}, headers=key)
        assert r.status_code == 201, r.text


def _parquet(arr: pa.Array) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"subject": arr}), buf)
    return buf.getvalue()


@pytest.mark.parametrize(("arr", "shown"), [
    (pa.array([decimal.Decimal(i) for i in range(200)], pa.decimal128(10, 2)),
     "decimal128(10, 2)"),
    (pa.array([i % 2 == 0 for i in range(200)]), "bool"),
    (pa.array(np.arange(200, dtype=np.float64)), "double"),
])
def test_uploaded_parquet_ids_of_decimal_or_bool_type_are_refused(
        live: Live, arr: pa.Array, shown: str) -> None:
    rng = np.random.default_rng(2)
    request = {"method": "ldp-label", "params": {"alpha": 0.1, "epsilon": 1.0}, "score": "lac",
               "probs": rng.dirichlet(np.ones(3), 200).tolist(),
               "labels": rng.integers(0, 3, 200).tolist()}
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": uuid.uuid4().hex},
                   data={"request": json.dumps(request)},
                   files={"subjects": ("ids.parquet", _parquet(arr))})
        detail = _problem(r)
        assert detail == (f"ids.parquet: subjects column 'subject' is of type {shown}: ids must "
                          "be text or integers (write the column as strings or int64)")
        assert ledger_snapshot(live) == before
        # the same subjects as int64: read, charged, released
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": uuid.uuid4().hex},
                   data={"request": json.dumps(request)},
                   files={"subjects": ("ids.parquet", _parquet(pa.array(np.arange(200))))})
        assert r.status_code == 201, r.text
