"""Red team 21, service findings F1 and F5 (on a real server, each backend)."""

from __future__ import annotations

from typing import Any

from tests.service.conftest import Live


def test_two_idempotency_key_headers_are_refused(live: Live) -> None:
    """F5: with two Idempotency-Key headers the request was bound to the first; a retry
    under the second — the key a proxy, log or client reading the last header believes was
    used — charged again. Now 422, nothing done; then each key alone is one charge."""
    body = {"cost": {"rho": "0.01"}}
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/charges", json=body,
                   headers=[("Idempotency-Key", "k-one"), ("Idempotency-Key", "k-two")])
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == "Idempotency-Key given twice; nothing was done"
        assert live.accountant.budget("d").charges == 0
        r = c.post("/v1/datasets/d/calibrations", json={
            "method": "split", "params": {"alpha": 0.1}, "scores": [0.1, 0.2, 0.3]},
            headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b"),
                     ("Idempotency-Key", "c")])
        assert r.status_code == 422 and "given 3 times" in r.json()["detail"], r.text
        assert live.accountant.releases("d") == []
        first = c.post("/v1/datasets/d/charges", json=body, headers={"Idempotency-Key": "k-two"})
        again = c.post("/v1/datasets/d/charges", json=body, headers={"Idempotency-Key": "k-two"})
    assert (first.status_code, again.status_code) == (201, 200), (first.text, again.text)
    assert live.accountant.budget("d").charges == 1


def test_an_ldp_score_range_whose_midpoint_overflows_is_refused(live: Live) -> None:
    """F1: an ldp-score session on [1e308, 1.7e308] was opened, asked its devices about
    the threshold +∞, and the report closing round 0 — and every one after it — was a 500:
    a session no report could complete, its subjects charged. Now 422 at the open, nothing
    written; the same for a range whose width overflows."""
    head = live.accountant.ledger.head()
    with live.client("analyst") as c:
        for lower, upper in ((1e308, 1.7e308), (-1e308, 1e308), (0, 1.348e308)):
            r = c.post("/v1/datasets/d/sessions", json={
                "method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 2,
                "group_size": 5, "lower": lower, "upper": upper})
            assert r.status_code == 422, r.text
            assert "overflows a float" in r.json()["detail"], r.text
    assert live.accountant.ledger.head() == head  # no session opened, nothing logged
    assert live.accountant.budget("d").charges == 0


def test_a_charge_receipt_names_the_key_the_client_sent(live: Live) -> None:
    """Readme F3: the receipt answered the library's key ("http:193cc3e8…:8a3e90ba…"), not
    the Idempotency-Key the client sent; so does its replay."""
    with live.client("analyst") as c:
        first = c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.01"}},
                       headers={"Idempotency-Key": "q-1"})
        again = c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.01"}},
                       headers={"Idempotency-Key": "q-1"})
    assert first.status_code == 201 and first.json()["idempotency_key"] == "q-1", first.text
    assert again.status_code == 200 and again.json()["idempotency_key"] == "q-1", again.text


def test_a_calibration_body_cut_off_logs_no_traceback(
        live: Live, caplog: Any) -> None:
    """F4: a calibration request whose client disconnected mid-body logged "Exception in
    ASGI application" with a ClientDisconnect traceback (an analyst could fill the log); now
    it ends as a one-line refusal no one reads, and nothing is written."""
    import logging
    import socket
    import time
    from urllib.parse import urlsplit

    u = urlsplit(live.url)
    body = b'{"method": "split", "params": {"alpha": 0.1}, "scores": [0.1, 0.2, 0.3]}'
    head = (f"POST /v1/datasets/d/calibrations HTTP/1.1\r\nHost: {u.hostname}\r\n"
            f"Authorization: Bearer {live.tokens['analyst']}\r\nIdempotency-Key: cut\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with caplog.at_level(logging.INFO):
        with socket.create_connection((u.hostname, u.port)) as s:
            s.sendall(head + body[: len(body) // 2])
            time.sleep(0.5)  # the app is reading the body
        time.sleep(1.0)  # the disconnect reaches it
        with live.client("analyst") as c:
            assert c.get("/healthz").status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert live.accountant.releases("d") == []
