"""Red team 26, service: findings of the HTTP service (REPORT: /tmp/r26/service/REPORT.md).

F2 — ``GET /v1/releases`` and ``GET /v1/audit/entries`` pages were bounded by a count of
items only: a Mondrian release of 10 000 named groups is a 22.5 MB record, so the default
page (100) of such releases was 2.25 GB of JSON built in the server's memory. A page now
stops before :data:`~privcal.service.routes_audit.PAGE_BYTES` of JSON (one item at least),
and an empty page is the end. The tests lower the byte limit to a few releases' worth (the
rule is the same at any size) and check that every page is within it, that paging from the
last id returns every item exactly once, and that one item larger than the limit is still
served, alone.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.service.conftest import Live


def _release(lv: Live, i: int) -> int:
    with lv.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": f"r{i}"},
                   json={"method": "split", "params": {"alpha": 0.5},
                         "scores": [0.1 * (j % 9) for j in range(20 + i)]})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


def _pages(lv: Live, role: str, path: str, key: str, limit: int) -> list[tuple[int, list[Any]]]:
    """Every page of ``path`` from the start, each as (its byte size, its items)."""
    pages, after = [], 0
    with lv.client(role) as c:
        while True:
            r = c.get(path, params={"after": after, "limit": limit})
            assert r.status_code == 200, r.text
            items = r.json()
            pages.append((len(r.content), items))
            if not items:
                return pages
            after = items[-1][key]


@pytest.mark.parametrize(("path", "key", "role"), [("/v1/releases", "id", "analyst"),
                                                   ("/v1/audit/entries", "seq", "auditor")])
def test_pages_are_bounded_by_bytes(live: Live, monkeypatch: pytest.MonkeyPatch, path: str,
                                    key: str, role: str) -> None:
    from privcal.service import routes_audit

    ids = [_release(live, i) for i in range(6)]
    with live.client(role) as c:
        whole = c.get(path, params={"limit": 1000})
    assert whole.status_code == 200
    everything = whole.json()
    sizes = [len(json.dumps(x, ensure_ascii=False, separators=(",", ":")).encode())
             for x in everything]
    # room for about two items of the larger half: a count-only page (all of them) exceeds it
    limit = 2 * sorted(sizes)[len(sizes) // 2] + 3
    assert len(whole.content) > limit
    monkeypatch.setattr(routes_audit, "PAGE_BYTES", limit)
    pages = _pages(live, role, path, key, 1000)
    assert pages[-1][1] == []
    for size, items in pages[:-1]:
        assert items and (size <= limit or len(items) == 1), (size, limit, len(items))
    got = [x for _, items in pages for x in items]
    assert got == everything  # every item once, in order, the same document
    if key == "id":
        assert [x["id"] for x in got] == ids
    assert len(pages) > 2

    # an item larger than the limit is served alone, not refused or skipped
    monkeypatch.setattr(routes_audit, "PAGE_BYTES", 10)
    alone = _pages(live, role, path, key, 1000)
    assert [len(items) for _, items in alone] == [1] * len(everything) + [0]


def test_batch_fingerprint_is_made_in_pieces(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """F1: the idempotency fingerprint of an ingestor batch was one ``model_dump`` and one
    ``json.dumps`` over every row, each one C call holding the GIL — so the event loop — for
    the whole batch (330 000 rows: up to 1.7 s alone, scratch t17). Now no call takes more
    than :data:`~privcal.service.common.CANONICAL_PIECE` rows, and the fingerprint is the
    same as before (a retry that spans the upgrade replays; another body is 409)."""
    import hashlib
    import json as std_json
    from types import SimpleNamespace

    import privcal.service.common as common
    from privcal.service.batch_body import BatchBody
    from privcal.storage.request_fingerprints import keyed_fingerprint
    from tests.service.conftest import open_ldp

    rows = [{"subject": f"s{i}\u00e9", "value": i % 2, "round": 0} for i in range(9000)]
    seen: list[int] = []

    def dumps(obj: Any, **kw: Any) -> str:
        seen.append(len(obj) if isinstance(obj, list) else 0)
        return std_json.dumps(obj, **kw)

    def whole_dump(self: Any, *a: Any, **kw: Any) -> Any:
        raise AssertionError("the whole batch dumped in one call")

    sid = open_ldp(live, group_size=50, rounds=1)
    ing = live.token("ingestor", session=sid)
    monkeypatch.setattr(common, "json", SimpleNamespace(dumps=dumps, loads=std_json.loads))
    monkeypatch.setattr(BatchBody, "model_dump", whole_dump)
    with live.client(token=ing) as c:
        r = c.post(f"/v1/sessions/{sid}/batches", headers={"Idempotency-Key": "b1"},
                   json={"reports": rows})
        assert r.status_code == 200, r.text
        assert seen and max(seen) <= common.CANONICAL_PIECE, max(seen)
        again = c.post(f"/v1/sessions/{sid}/batches", headers={"Idempotency-Key": "b1"},
                       json={"reports": rows})
        assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
        other = c.post(f"/v1/sessions/{sid}/batches", headers={"Idempotency-Key": "b1"},
                       json={"reports": [*rows[:-1], {**rows[-1], "value": 0}]})
        assert other.status_code == 409 and other.json()["type"].endswith("key-reused")
    # the stored fingerprint is the pre-F1 one: keyed SHA-256 of json.dumps(sort_keys=True)
    led = live.accountant.ledger
    want = keyed_fingerprint(led.subject_key(), hashlib.sha256(std_json.dumps(
        {"reports": rows}, sort_keys=True).encode()).hexdigest())
    assert common.request_fingerprint(led.subject_key(), {"reports": rows}) == want
    monkeypatch.undo()
    from privcal.storage.tokens import IdempotencyRecord

    before = BatchBody.model_validate({"reports": rows}).model_dump()  # as the route did
    with led.read() as s:
        stored = s.get(IdempotencyRecord, (ing.split("_")[1], "b1")).fingerprint
    assert stored == keyed_fingerprint(led.subject_key(), hashlib.sha256(std_json.dumps(
        common.doc(before), sort_keys=True).encode()).hexdigest())
    for obj in ([], {}, list(range(8193)), {"b": [[i, {"y": 1.5, "x": None}]
                                               for i in range(5000)], "a": "\u2028"}):
        assert common.canonical_json(obj) == std_json.dumps(obj, sort_keys=True)


def test_ui_tries_every_credential_cookie(live: Live) -> None:
    """F4: the web view checked only the first well-formed ``privcal_ui`` cookie, so one set
    for ``Path=/ui/`` by a page on another port or a sibling host (sent first: the longer
    path) — a forged one, or the credential of a revoked token — sent a logged-in auditor
    back to the login page at every request. Every well-formed one is tried; a cookie of
    this server's own, for a token in force, opens the view, and forged ones alone do not."""
    from privcal.storage.tokens import revoke_token

    def login(token: str) -> str:
        with live.client() as c:
            r = c.post("/ui/login", data={"token": token}, headers={"Sec-Fetch-Site": "none"})
            assert r.status_code == 303, r.text
            return str(r.headers["set-cookie"].split(";")[0].split("=", 1)[1])

    good = login(live.tokens["auditor"])
    gone_token = live.token("auditor", name="gone")
    gone = login(gone_token)
    revoke_token(live.accountant.ledger, gone_token.split("_")[1])
    tid, at, _ = good.split(".")
    forged = f"{tid}.{at}.{'A' * 43}"
    with live.client() as c:
        for cookies, status in ((f"privcal_ui={forged}; privcal_ui={good}", 200),
                                (f"privcal_ui={gone}; privcal_ui={good}", 200),
                                (f"privcal_ui={forged}; privcal_ui={gone}", 303),
                                (f"privcal_ui={good}", 200)):
            r = c.get("/ui/", headers={"Cookie": cookies})
            assert r.status_code == status, (cookies, r.status_code)
            if status == 303:
                assert r.headers["location"] == "/ui/login"


def test_calibration_json_is_validated_off_the_loop_in_pieces(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """F3: a calibration's JSON body was validated on the event loop by one pydantic call
    (10 MB of scores held /healthz 2.7 s, scratch t12). It is now validated in a worker
    thread, each long array :data:`~privcal.service.calibration_json.PIECE` items at a time
    — with the same answers: the release of the same data, a bad item's 422 at its index."""
    import asyncio

    from privcal.service.calibration_json import PIECE
    from privcal.service.uploads import CalibrationBody

    calls: list[tuple[bool, int]] = []
    real = CalibrationBody.model_validate_json.__func__  # type: ignore[attr-defined]

    def spy(cls: Any, text: Any, *a: Any, **kw: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        calls.append((on_loop, bytes(text).count(b",")))
        return real(cls, text, *a, **kw)

    monkeypatch.setattr(CalibrationBody, "model_validate_json", classmethod(spy))
    n = 2 * PIECE + 5
    scores = [round((j * 0.618) % 1, 4) for j in range(n)]
    body = {"method": "split", "params": {"alpha": 0.1}, "scores": scores}
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": "big"}, json=body)
        assert r.status_code == 201, r.text
        assert r.json()["shape"]["n"] == n
        assert calls and not any(on for on, _ in calls), calls
        assert max(commas for _, commas in calls) < PIECE, calls
        bad = c.post("/v1/datasets/d/calibrations?dry_run=true",
                     json={**body, "scores": [*scores[:PIECE + 9], "x", *scores[PIECE + 9:]]})
        assert bad.status_code == 422, bad.text
        assert bad.json()["errors"][0]["loc"] == ["body", "scores", PIECE + 9]
    # the split-conformal threshold of these very scores: the ⌈(n+1)(1−α)⌉-th smallest
    k = -(-(n + 1) * 9 // 10)
    assert r.json()["threshold"] == sorted(scores)[k - 1]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-16-be"])
def test_json_bodies_are_utf8(live: Live, encoding: str) -> None:
    """F5: ``json.loads`` of bytes reads UTF-16 and UTF-32 too, so a charge sent in UTF-16
    was charged (201) while the calibration route refused the same encoding; RFC 8259 §8.1:
    UTF-8. Now 422 "not UTF-8", nothing charged; UTF-8 (with or without a BOM) as before."""
    from tests.service.conftest import ledger_snapshot

    text = '{"cost": {"rho": "0.1"}, "purpose": "é"}'
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/charges", content=text.encode(encoding),
                   headers={"Content-Type": "application/json", "Idempotency-Key": "u"})
        assert r.status_code == 422, r.text
        assert ledger_snapshot(live) == before
        for i, raw in enumerate((text.encode(), text.encode("utf-8-sig"))):
            ok = c.post("/v1/datasets/d/charges", content=raw,
                        headers={"Content-Type": "application/json", "Idempotency-Key": f"v{i}"})
            assert ok.status_code == 201 and ok.json()["purpose"] == "é", ok.text
