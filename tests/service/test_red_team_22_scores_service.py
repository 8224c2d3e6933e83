"""Red team 22, coverage F1 on the service (the review of the fix, R2): float32 scores reach a
calibration over HTTP as JSON numbers — float64 values that are float32s — so a refusal by
dtype alone never fired there. A named score over such values is 422, nothing charged."""

from __future__ import annotations

import numpy as np
import pytest

from tests.service.conftest import Live


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_float32_values_in_a_json_body_are_refused(live: Live) -> None:
    g = np.random.default_rng(0)
    p = np.where(g.random(500) < 0.5, np.float32(0.1), np.float32(0.9)).astype(np.float32)
    body = {"method": "split", "params": {"alpha": 0.1}, "score": "lac",
            "scores": (np.float32(1) - p).tolist()}
    head = live.accountant.ledger.head()
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", json=body, headers={"Idempotency-Key": "f"})
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("scores are float32 values (widened to float64) "
                                             "but the score 'lac' is named")
        assert live.accountant.ledger.head() == head
        ok = {**body, "scores": (1 - p.astype(np.float64)).tolist()}
        r = c.post("/v1/datasets/d/calibrations", json=ok, headers={"Idempotency-Key": "g"})
        assert r.status_code == 201 and r.json()["threshold"] == 1 - float(np.float32(0.1)), r.text
