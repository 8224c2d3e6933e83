"""The lean read of a session by a session-bound token (privcal.service.session_reads): the
same answer as the FastAPI route, byte for byte, in every state of the session; a new round
or a closed session is never served from an older state; the token is checked every time;
anything but a success goes through the whole app."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.service.conftest import Live, open_fed, open_ldp


def _both(lv: Live, token: str, path: str, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[Any, Any]:
    """(lean answer, the whole app's answer) to the same GET."""
    import privcal.service.app as app_mod

    with lv.client(token=token) as c:
        lean = c.get(path)
        with monkeypatch.context() as m:
            async def never(scope: Any, send: Any) -> None:
                return None

            m.setattr(app_mod, "try_lean_get", never)
            full = c.get(path)
    return lean, full


def _same(lean: Any, full: Any) -> None:
    assert (lean.status_code, lean.content) == (full.status_code, full.content)
    for h in ("content-type", "content-length"):
        assert lean.headers.get(h) == full.headers.get(h), h


def test_a_device_reads_what_the_route_answers_and_never_an_older_state(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = open_ldp(live, group_size=2, rounds=2)
    devs = [live.token("device", session=sid, subject=f"u{i}") for i in range(3)]
    states = live.app.state.public_states
    path = f"/v1/sessions/{sid}"

    lean, full = _both(live, devs[0], path, monkeypatch)
    _same(lean, full)
    first = lean.json()
    assert first["status"] == "open" and first["round"] == 0 and first["query"] is not None
    rendered = states.rendered
    with live.client(token=devs[1]) as c:  # the same round: served from the cache
        assert [c.get(path).content for _ in range(3)] == [lean.content] * 3
    assert states.rendered == rendered
    for i, tok in enumerate(devs[:2]):  # the round fills and advances
        with live.client(token=tok) as c:
            r = c.put(f"{path}/reports/r{i}", json={"round": 0, "value": 1})
            assert r.status_code == 201, r.text
    lean, full = _both(live, devs[2], path, monkeypatch)
    _same(lean, full)
    assert lean.json()["round"] == 1 and lean.json()["query"] != first["query"]
    assert states.rendered == rendered + 1
    with live.client("analyst") as c:
        r = c.post(f"{path}/close", json={"abandon": True},
                   headers={"Idempotency-Key": uuid.uuid4().hex})
        assert r.status_code == 200, r.text
    lean, full = _both(live, devs[2], path, monkeypatch)
    _same(lean, full)
    assert lean.json()["status"] != "open" and lean.json()["query"] is None


def test_an_agent_reads_its_federated_session_as_the_route_does(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    fid = open_fed(live)
    agent = live.token("agent", session=fid, agent="a1")
    lean, full = _both(live, agent, f"/v1/sessions/{fid}", monkeypatch)
    _same(lean, full)
    assert lean.json()["grid"] is not None and "total_reports" not in lean.json()


def test_anything_but_a_bound_token_reading_its_session_goes_through_the_app(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    sid, other = open_ldp(live), open_ldp(live)
    dev = live.token("device", session=sid, subject="u1")
    path = f"/v1/sessions/{sid}"
    with live.client(token=dev) as c:
        assert c.get(path).status_code == 200
    cases = [
        (dev, f"/v1/sessions/{other}", 404),  # another session
        (dev, "/v1/sessions/999999", 404),
        (live.tokens["analyst"], path, 200),  # the whole state, not the public part
        (dev[:-2] + ("AA" if not dev.endswith("AA") else "BB"), path, 401),  # wrong secret
        ("", path, 401),
        (dev, path + "?x=1", 200),
    ]
    for tok, p, code in cases:
        lean, full = _both(live, tok, p, monkeypatch)
        assert lean.status_code == code, (p, lean.text)
        _same(lean, full)
    with live.client("analyst") as c:
        assert "total_reports" in c.get(path).json()
    with live.client("admin") as c:  # revoked: refused at once, not served from the cache
        tid = dev.split("_")[1]
        assert c.delete(f"/v1/tokens/{tid}").status_code == 200
    with live.client(token=dev) as c:
        assert c.get(path).status_code == 401
