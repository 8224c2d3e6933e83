"""Red team 24, service: findings against a running ``privcal serve`` (tests/service/conftest).

F2: a body of many invalid items (list items, object keys) was answered with one validation
error per item — each built, converted and serialized on the event loop, and all sent: 1 MB
of ``[]`` scores held every other request (``/healthz`` too) for 24 s and was answered with
30 MB. A 422 now stops at a list's first bad item, refuses an object of more than
``MAX_OBJECT_KEYS`` keys as invalid JSON, and lists at most ``SHOWN_ERRORS`` errors."""

from __future__ import annotations

import json

from tests.service.conftest import Live, ledger_snapshot, open_ldp

N = 20_000  # items: enough that one error each is plain in the answer's size


def _small_422(r: object, first: str) -> dict[str, object]:
    assert r.status_code == 422, r.text  # type: ignore[attr-defined]
    assert r.headers["content-type"] == "application/problem+json"  # type: ignore[attr-defined]
    assert len(r.content) < 4096, len(r.content)  # type: ignore[attr-defined]
    doc = r.json()  # type: ignore[attr-defined]
    assert doc["detail"].startswith(first), doc["detail"]
    return dict(doc)


def test_f2_a_calibration_of_invalid_items_is_one_short_422(live: Live) -> None:
    """Scores (and labels, probs rows) of N bad items: one error, not N."""
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        for field, body in (
                ("scores", {"scores": [[]] * N}),
                ("probs", {"probs": [[[]] * N]}),
                ("labels", {"probs": [[0.5, 0.5]], "labels": [[]] * N})):
            raw = json.dumps({"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, **body})
            r = c.post("/v1/datasets/d/calibrations", content=raw,
                       headers={"Content-Type": "application/json", "Idempotency-Key": field})
            doc = _small_422(r, f"body.{field}")
            assert len(doc["errors"]) <= 2, doc["errors"]  # labels: int and str lists
    assert ledger_snapshot(live) == before


def test_f2_an_object_of_many_keys_is_invalid_json_not_one_error_per_key(live: Live) -> None:
    keys = {f"k{i}": 1 for i in range(5000)}  # past the bound (MAX_OBJECT_KEYS, 1000)
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.01"}, **keys},
                   headers={"Idempotency-Key": "many-keys"})
        _small_422(r, "body: invalid JSON: an object with more than 1000 keys")
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": "cal-keys"},
                   json={"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1},
                         "scores": [0.5] * 10, "score_options": keys})
        _small_422(r, "body: invalid JSON: an object with more than 1000 keys")
        # the largest object a route takes is far below the bound: still a plain charge
        ok = c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.01"}},
                    headers={"Idempotency-Key": "fine"})
        assert ok.status_code == 201, ok.text
    after = ledger_snapshot(live)
    assert after["charges"] != before["charges"]


def test_f2_a_batch_of_invalid_rows_is_one_short_422(live: Live) -> None:
    sid = open_ldp(live)
    tok = live.token("ingestor", session=sid)
    before = ledger_snapshot(live)
    with live.client(token=tok) as c:
        r = c.post(f"/v1/sessions/{sid}/batches", json={"reports": [[]] * N},
                   headers={"Idempotency-Key": "rows"})
        doc = _small_422(r, "body.reports.0")
        assert len(doc["errors"]) == 1, doc["errors"]
    assert ledger_snapshot(live) == before


def test_f2_a_422_lists_at_most_its_first_errors(live: Live) -> None:
    with live.client("admin") as c:  # 1000 dataset names (the route's bound), each invalid
        r = c.post("/v1/tokens", json={"role": "analyst", "datasets": [1] * 1000})
        assert r.status_code == 422, r.text
        assert len(r.json()["errors"]) == 100  # privcal.service.app.SHOWN_ERRORS
        assert r.json()["detail"].startswith("body.datasets.0")
