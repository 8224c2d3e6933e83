"""Red team 21, service F2 and F3: the lean paths.

- F2: a request with two ``Authorization`` headers is unauthenticated (red team 18), but the
  lean report PUT and session read took the last header: a report with two device tokens
  was stored (201) and charged to the second's subject. They now share the middleware's
  rule (:func:`privcal.service.auth.bearer_token`).
- F3: an unexpected error on a lean path escaped to uvicorn, a bare ``text/plain`` or empty
  500 without the standard headers; it is now the whole app's 500 problem document.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from privcal.service.problems import server_error_response
from tests.service.conftest import Live, open_ldp


def _two_devices(lv: Live, sid: int) -> list[tuple[str, str]]:
    a = lv.token("device", session=sid, subject="first-dev")
    b = lv.token("device", session=sid, subject="second-dev")
    return [("Authorization", f"Bearer {a}"), ("Authorization", f"Bearer {b}")]


def test_f2_report_put_with_two_authorization_headers_is_unauthenticated(live: Live) -> None:
    sid = open_ldp(live, group_size=50)
    hdrs = [*_two_devices(live, sid), ("Content-Type", "application/json")]
    with httpx.Client(base_url=live.url, timeout=60) as c:
        # exactly a valid report: the lean path's; one with an extra key: the whole app's
        lean = c.put(f"/v1/sessions/{sid}/reports/r1", content=b'{"round":0,"value":1}',
                     headers=hdrs)
        full = c.put(f"/v1/sessions/{sid}/reports/r2",
                     content=b'{"round":0, "value":1, "x":1}', headers=hdrs)
    assert full.status_code == 401, full.text
    assert lean.status_code == 401, (lean.status_code, lean.text)
    assert lean.json()["type"] == full.json()["type"] == "urn:privcal:problem:unauthenticated"
    assert lean.headers["www-authenticate"] == full.headers["www-authenticate"]
    assert live.accountant.subject_summary("d").subjects == 0  # nothing charged
    # each token alone still reports (the rule refuses two headers, not these tokens)
    with httpx.Client(base_url=live.url, timeout=60) as c:
        one = c.put(f"/v1/sessions/{sid}/reports/r1", content=b'{"round":0,"value":1}',
                    headers=[hdrs[0], hdrs[2]])
    assert one.status_code == 201, one.text


def test_f2_session_read_with_two_authorization_headers_is_unauthenticated(
        live: Live) -> None:
    sid = open_ldp(live, group_size=50)
    hdrs = _two_devices(live, sid)
    with httpx.Client(base_url=live.url, timeout=60) as c:
        lean = c.get(f"/v1/sessions/{sid}", headers=hdrs)
        full = c.get(f"/v1/sessions/{sid}?a=1", headers=hdrs)
        one = c.get(f"/v1/sessions/{sid}", headers=hdrs[:1])
    assert full.status_code == 401, full.text
    assert lean.status_code == 401, (lean.status_code, lean.text[:200])
    assert lean.json()["type"] == "urn:privcal:problem:unauthenticated"
    assert one.status_code == 200, one.text


def _assert_app_500(r: httpx.Response) -> None:
    """``r`` is the whole app's 500: server_error_response's body and headers."""
    expected = server_error_response(None, RuntimeError())
    assert r.status_code == 500, (r.status_code, r.text)
    assert r.content == bytes(expected.body)
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_f3_unexpected_error_on_the_lean_paths_is_the_apps_500(
        live: Live, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    sid = open_ldp(live, group_size=50)
    dev = live.token("device", session=sid, subject="s1")

    async def broken_submit(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("the report writer broke")

    def broken_body(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("the session read broke")

    monkeypatch.setattr(live.app.state.batcher, "submit_async", broken_submit)
    monkeypatch.setattr(live.app.state.public_states, "body", broken_body)
    with live.client(token=dev) as c:
        put = c.put(f"/v1/sessions/{sid}/reports/r1", content=b'{"round":0,"value":1}',
                    headers={"Content-Type": "application/json"})
        get = c.get(f"/v1/sessions/{sid}")
        _assert_app_500(put)
        _assert_app_500(get)
        # the connection was not dropped: the next request on it is answered
        assert c.get("/healthz").status_code == 200
    assert "the report writer broke" in caplog.text and "the session read broke" in caplog.text
