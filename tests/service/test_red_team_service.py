"""Red team, session 5: attacks on the service's new paths — the report writer's window
(:mod:`privcal.service.batcher`), the lean device PUT (:mod:`privcal.service.device_reports`),
agent messages — over HTTP against a real server, on SQLite and PostgreSQL. Each test is an
attack; it passes when the attack fails (refused, nothing stored, the others unaltered)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.service.conftest import EXPIRED, Live, open_fed, open_ldp, start_server
from tests.service.test_report_path import Gate

pytest.importorskip("fastapi", reason="the server extra is part of the test extra")

P = "urn:privcal:problem:"


def _stored(lv: Live, sid: int) -> int:
    from privcal.accountant.sessions import session_status

    return int(session_status(lv.accountant, sid).total_reports)


def test_one_window_of_good_and_bad_reports_answers_each_on_its_own(live: Live) -> None:
    """Attack: one write window holding, beside valid reports, a token that expired while
    its report waited, a revoked one, another session's device, an agent token, a subject
    whose ε cap is spent, a report for a round not yet open and a retry of a valid one with
    another value. Each bad one gets its own answer; the valid ones are stored and charged
    exactly as alone; nothing else is written."""
    from privcal.accountant.sessions import session_status

    acct = live.accountant
    acct.charge_subjects("d", "9.5", ["s-cap"])  # d's subject cap is ε = 10
    sid = open_ldp(live, group_size=10, rounds=2, epsilon=1.0)
    other = open_ldp(live, group_size=10, rounds=2)
    fid = open_fed(live, agents=2)
    good = {f"s-{i}": live.token("device", session=sid, subject=f"s-{i}") for i in range(4)}
    bad = {
        "expired": live.token("device", session=sid, subject="x-exp", expires_in=EXPIRED * 3),
        "revoked": live.token("device", session=sid, subject="x-rev"),
        "other": live.token("device", session=other, subject="x-oth"),
        "agent": live.token("agent", session=fid, agent="h1"),
        "cap": live.token("device", session=sid, subject="s-cap"),
        "future": live.token("device", session=sid, subject="x-fut"),
    }
    want = {"expired": (401, "unauthenticated"), "revoked": (401, "unauthenticated"),
            "other": (404, "not-found"), "agent": (403, "forbidden"),
            "cap": (409, "report-rejected"), "future": (409, "report-rejected")}
    gate = Gate(live.app.state.batcher)

    def put(tok: str, rnd: int = 0, value: int = 1) -> Any:
        with live.client(token=tok) as c:
            return c.put(f"/v1/sessions/{sid}/reports/r{value}",
                         json={"round": rnd, "value": value})

    spend0 = {s: acct.subject_spend("d", s) for s in [*good, "s-cap", "x-exp", "x-rev"]}
    with ThreadPoolExecutor(16) as pool:
        first = pool.submit(put, good["s-0"])
        assert gate.reached.wait(60)
        futs = {name: pool.submit(put, tok, 1 if name == "future" else 0)
                for name, tok in bad.items()}
        goods = {s: pool.submit(put, tok) for s, tok in good.items() if s != "s-0"}
        retry = pool.submit(put, good["s-1"], 0, 0)  # another value: one of the two wins
        gate.queued(len(futs) + len(goods) + 1)
        with live.client("admin") as admin:
            assert admin.delete(f"/v1/tokens/{bad['revoked'].split('_')[1]}").status_code \
                == 200
        time.sleep(3.2)  # the expiring token is now past its expiry
        gate.release()
        assert first.result().status_code == 201
        for name, f in futs.items():
            r = f.result()
            assert (r.status_code, r.json()["type"]) == (want[name][0], P + want[name][1]), \
                (name, r.text)
        codes = {s: f.result().status_code for s, f in goods.items()}
        rcode = retry.result().status_code
    # s-1's two reports: exactly one stored (201), the other 409
    assert sorted([codes["s-1"], rcode]) == [201, 409], (codes, rcode)
    assert all(codes[s] == 201 for s in ("s-2", "s-3")), codes
    assert futs["cap"].result().json()["reason"] == "subject budget exhausted"
    assert futs["future"].result().json()["reason"] == "round not open"
    assert _stored(live, sid) == 4 and _stored(live, other) == 0
    st = session_status(acct, sid)
    assert (st.round, st.status) == (0, "open")
    for s in good:
        assert acct.subject_spend("d", s) == spend0[s] + 1, s
    for s in ("s-cap", "x-exp", "x-rev"):
        assert acct.subject_spend("d", s) == spend0[s], s
    acct.verify()


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400",
                                 "1" + "0" * 400, "true", '"0.5"', "null", "[0.5]"])
def test_odd_agent_messages_store_nothing_and_block_nobody(live: Live, raw: str) -> None:
    """Attack: an agent's message that is not a finite grid point (JSON's NaN and Infinity
    as Python's parser reads them, a float overflowing to inf, a 401-digit integer, a bool, a
    string, null, a list): refused (422 or 409), never a 5xx, nothing stored — and the same
    agent's valid message afterwards is accepted once."""
    fid = open_fed(live, agents=2)
    a1 = live.token("agent", session=fid, agent="h1")
    with live.client(token=a1) as c:
        r = c.put(f"/v1/sessions/{fid}/messages", content=f'{{"value": {raw}}}',
                  headers={"content-type": "application/json"})
        assert r.status_code in (409, 422), (raw, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert _stored(live, fid) == 0
        ok = c.put(f"/v1/sessions/{fid}/messages", json={"value": 5 / 19})
        assert ok.status_code == 201, ok.text
        assert c.put(f"/v1/sessions/{fid}/messages", json={"value": 5 / 19}).status_code == 200
    assert _stored(live, fid) == 1
    live.accountant.verify()


@pytest.mark.parametrize("body", [
    b'{"round":0,"value":1,"round":0}',        # duplicate key: three members, two names
    b'{"round":0,"round":0,"value":1}',
    b'{"round":0,"value":1,"value":0}',        # the last value wins in json.loads
    b'{"round":-0,"value":1}',
    b'{"round":0e0,"value":1}',
    b'{"round":0,"value":1e0}',
    b'{"round":0,"value":NaN}',
    b'{"round":0,"value":1,"subject":"s-9"}',
    b'{"round":0,"value":1,"session":2}',
    b'\xef\xbb\xbf{"round":0,"value":1}',     # a UTF-8 BOM
    b'{"round":0,"value":1}\x00',
    b'{"round":0,"value":1} {"round":0,"value":0}',
    b'{"round":' + b"0" * 5000 + b',"value":1}',
    b'{"round":1' + b"0" * 5000 + b',"value":1}',
])
def test_odd_report_bodies_answer_as_the_route_and_name_no_other_subject(
        live: Live, body: bytes) -> None:
    """Attack the lean parser with bodies a JSON parser may read differently: the lean path
    must answer exactly as the FastAPI route does (the same status; the route is the
    reference: the lean path is bypassed with a chunked body, which it never takes), and a
    report, if stored, is the token's subject's, once."""
    sid = open_ldp(live, group_size=50, rounds=1)
    ref_sid = open_ldp(live, group_size=50, rounds=1)
    dev = live.token("device", session=sid, subject="s-1")
    ref = live.token("device", session=ref_sid, subject="s-1")
    hdr = {"content-type": "application/json"}
    with live.client(token=dev) as c:
        lean = c.put(f"/v1/sessions/{sid}/reports/r", content=body, headers=hdr)
    with live.client(token=ref) as c:  # no Content-Length: the route answers
        route = c.put(f"/v1/sessions/{ref_sid}/reports/r", content=iter([body]), headers=hdr)
    assert lean.status_code < 500 and route.status_code < 500, (lean.text, route.text)
    assert lean.status_code == route.status_code, (body[:60], lean.text, route.text)
    if lean.status_code >= 400:
        assert lean.json()["type"] == route.json()["type"]
    assert _stored(live, sid) == _stored(live, ref_sid) == (1 if lean.status_code == 201 else 0)
    from privcal.accountant.sessions import session_status

    assert live.accountant.subject_spend("d", "s-9") == 0
    assert session_status(live.accountant, sid).status == "open"
    live.accountant.verify()


def test_a_chunked_report_over_the_body_limit_is_413_and_stores_nothing(live: Live) -> None:
    """Attack: a device report without Content-Length (chunked) larger than the body limit:
    the lean path does not take it, the middleware counts it as it reads: 413, nothing
    stored; under the limit it is accepted like any report."""
    from privcal.service.app import create_app

    app = create_app(accountant=live.accountant, body_limit=64)
    url, server, th = start_server(app)
    try:
        sid = open_ldp(live, group_size=50, rounds=1)
        dev = live.token("device", session=sid, subject="s-1")
        body = json.dumps({"round": 0, "value": 1}).encode()
        hdr = {"content-type": "application/json", "authorization": f"Bearer {dev}"}
        import httpx

        with httpx.Client(base_url=url, headers=hdr, timeout=60) as c:
            padded = body[:-1] + b" " * 100 + b"}"
            r = c.put(f"/v1/sessions/{sid}/reports/r", content=iter([padded[:50], padded[50:]]))
            assert r.status_code == 413 and r.json()["type"] == P + "body-too-large", r.text
            r = c.put(f"/v1/sessions/{sid}/reports/r", content=padded)  # with Content-Length
            assert r.status_code == 413, r.text
            assert _stored(live, sid) == 0
            r = c.put(f"/v1/sessions/{sid}/reports/r", content=iter([body[:5], body[5:]]))
            assert r.status_code == 201, r.text
        assert _stored(live, sid) == 1
    finally:
        server.should_exit = True
        th.join(timeout=30)
    live.accountant.verify()


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("option", ["rng", "probs", "labels", "name", "score"])
def test_a_score_option_named_like_an_argument_is_a_422_not_a_500(live: Live,
                                                                   option: str) -> None:
    """Attack: ``score_options`` naming an argument of the score function; it was a
    TypeError inside the calibration (500). Now the CLI's one-line 422, nothing charged."""
    import uuid

    before = live.accountant.budget("d").spent
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": uuid.uuid4().hex},
                   json={"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1},
                         "probs": [[0.2, 0.8], [0.6, 0.4]] * 20, "labels": [1, 0] * 20,
                         "score": "aps", "score_options": {option: 1}})
    assert r.status_code == 422, r.text
    assert r.json()["type"] == P + "invalid-input" and "does not take option" in r.json()["detail"]
    assert live.accountant.budget("d").spent == before


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("kind", [".npz", ".parquet"])
def test_a_compressed_upload_that_expands_past_the_limit_is_refused_unread(
        live: Live, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Attack (a decompression bomb): a small compressed upload that expands to far more
    than the body limit — 16 MB of deflated zeros is 16 GB of floats, enough to kill the
    server. The service reads the size the file declares first and refuses it (422, one
    line, nothing charged). Here the limit is lowered to 1 MB and the file expands to 8 MB."""
    import io
    import uuid

    import numpy as np

    import privcal.service.uploads as up

    monkeypatch.setattr(up, "EXPANDED_LIMIT", 1 << 20, raising=False)
    zeros = np.zeros(1_000_000)
    buf = io.BytesIO()
    if kind == ".npz":
        np.savez_compressed(buf, scores=zeros)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"scores": zeros}), buf)
    assert len(buf.getvalue()) < 100_000  # small on the wire
    before = live.accountant.budget("d").spent
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": uuid.uuid4().hex},
                   data={"request": json.dumps({"method": "split", "params": {"alpha": 0.1}})},
                   files={"scores": ("s" + kind, buf.getvalue())})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "expand to more than 1048576 bytes" in detail and "\n" not in detail, detail
        assert "/tmp" not in detail
        small = io.BytesIO()  # under the limit: read as before
        np.savez_compressed(small, scores=np.linspace(0, 1, 1000))
        ok = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": uuid.uuid4().hex},
                    data={"request": json.dumps({"method": "split", "params": {"alpha": 0.1}})},
                    files={"scores": ("s.npz", small.getvalue())})
        assert ok.status_code == 201, ok.text
    assert live.accountant.budget("d").spent == before  # split is non-private: no spend
