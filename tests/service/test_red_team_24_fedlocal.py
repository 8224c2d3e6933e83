"""Red team 24, fedlocal F1: a device report's id (``PUT …/reports/{report_id}``) was
documented as the DAP-style retry key and its 200 as "this report was already stored", yet the
id is neither stored nor compared: another id with the same round and bit is answered 200
duplicate, the same id with another bit 409. The route's documentation (its OpenAPI 200, its
docstring, the README) now says what the answer is judged by."""

from __future__ import annotations

import pytest

from tests.service.conftest import Live, open_ldp

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


def test_a_report_is_judged_by_its_round_and_bit_and_the_route_says_so(live: Live) -> None:
    sid = open_ldp(live, group_size=4)
    tok = live.token("device", session=sid, subject="alice")
    with live.client(token=tok) as c:
        put = [c.put(f"/v1/sessions/{sid}/reports/{rid}", json={"round": 0, "value": v})
               for rid, v in (("r1", 1), ("r2", 1), ("r1", 0))]
    assert [r.status_code for r in put] == [201, 200, 409]
    assert put[1].json()["status"] == "duplicate"
    doc = live.app.openapi()["paths"]["/v1/sessions/{sid}/reports/{report_id}"]["put"]
    said = doc["responses"]["200"]["description"]
    assert "this report was already stored" not in said
    assert "report id is not stored or compared" in said and "same round and value" in said
    assert "retry key (DAP-style)" not in doc["description"] and "neither stored nor compared" in (
        doc["description"])
