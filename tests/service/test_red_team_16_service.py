"""Red team 16, F5, in the service: ``GET /v1/releases/{id}`` serves a release as its audit
entry recorded it; a row edited in the database is 409 audit-failed (to a principal that may
see its dataset; one that may not gets the 404 it got before)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import text


def test_edited_release_row_is_not_served(live: Any) -> None:
    acct = live.accountant
    rel = acct.calibrate("split", dataset="d", scores=np.random.default_rng(0).random(200),
                         alpha=0.1)
    with live.client("analyst") as c:
        assert c.get(f"/v1/releases/{rel.id}").json()["threshold"] == rel.threshold
    with acct.ledger.engine.begin() as conn:
        conn.execute(text("UPDATE releases SET threshold = '0.5' WHERE id = :i"),
                     {"i": rel.id})
    with live.client("analyst") as c:
        r = c.get(f"/v1/releases/{rel.id}")
    assert r.status_code == 409, r.text
    assert f"release {rel.id} refused" in r.text and "privcal audit verify" in r.text
    outsider = live.token("analyst", name="o", datasets=["other"])
    with live.client(token=outsider) as c:
        assert c.get(f"/v1/releases/{rel.id}").status_code == 404
