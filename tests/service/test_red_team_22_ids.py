"""Red team 22, flows F2: an integer spelled as a float (``9.0``: what pandas writes of an
integer id column with a missing value, and what its ``astype(str)`` gives) was refused only
in CSV and parquet files. A device token minted for ``9.0`` over HTTP or from a plain list,
an ingestor's batch and the Python API charged ``9.0`` as another person than ``9`` — one
person spent twice the per-subject cap. Every person's id (subjects and agents) now follows
the files' rule; a group's label is no person and stays as written."""

from __future__ import annotations

import pytest

from privcal.errors import InvalidInput
from tests.service.conftest import Live, ledger_snapshot, open_ldp

SAID = "an integer written as a float"


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_the_service_refuses_a_float_spelled_subject(live: Live) -> None:
    sid = open_ldp(live)
    ing = live.token("ingestor", session=sid)
    before = ledger_snapshot(live)
    with live.client("admin") as c:
        for subject in ("9.0", "1.2345678901234568e+18", "7."):
            r = c.post("/v1/tokens", json={"role": "device", "session": sid,
                                            "subject": subject})
            assert r.status_code == 422 and SAID in r.json()["detail"], r.text
    with live.client(token=ing) as c:
        r = c.post(f"/v1/sessions/{sid}/batches", headers={"Idempotency-Key": "b"}, json={
            "reports": [{"subject": "9", "value": 1, "round": 0},
                        {"subject": "9.0", "value": 0, "round": 0}]})
        assert r.status_code == 422 and SAID in r.json()["detail"], r.text
    assert ledger_snapshot(live) == before  # no token, no report, no charge
    with pytest.raises(InvalidInput, match=SAID):
        live.token("device", session=sid, subject="9.0")
