"""The HTTP API and the UI state what a release's coverage guarantee assumes of the data
(``assumes``: exchangeable, or i.i.d. draws), next to the guarantee, as the CLI does
(tests/test_assumptions.py)."""

from __future__ import annotations

import numpy as np
import pytest

from privcal.calibrators.assumptions import ASSUMES
from tests.service.conftest import Live


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_the_api_and_the_ui_say_what_a_guarantee_assumes(live: Live) -> None:
    scores = np.linspace(0, 1, 101).tolist()
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", json={
            "method": "split", "params": {"alpha": 0.1}, "scores": scores},
            headers={"Idempotency-Key": "assumes-1"})
        assert r.status_code == 201, r.text
        assert r.json()["assumes"] == ASSUMES["split"]
        rid = r.json()["id"]
        shown = c.get(f"/v1/releases/{rid}")
        assert shown.status_code == 200 and shown.json()["assumes"] == ASSUMES["split"]
        listed = c.get("/v1/releases")
        assert [x["assumes"] for x in listed.json()] == [ASSUMES["split"]]
    with live.client(follow_redirects=False) as c:
        login = c.post("/ui/login", data={"token": live.tokens["auditor"]})
        assert login.status_code == 303, login.text[:200]
        page = c.get("/ui/")
        assert page.status_code == 200
        assert "<th>assuming</th>" in page.text
        assert f"<td>{ASSUMES['split']}</td>" in page.text.replace("&#39;", "'")


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_the_ui_checks_its_query_string_as_the_api_does(live: Live) -> None:
    """A repeated query parameter (any method) and an undeclared one on a form POST are a
    one-line 422 on the UI too, before its handler runs (the API's rule: the UI's routes
    were the only ones outside it)."""
    with live.client(follow_redirects=False) as c:
        r = c.post("/ui/login?next=x", data={"token": live.tokens["auditor"]})
        assert r.status_code == 422 and "next" in r.json()["detail"], r.text[:300]
        assert "set-cookie" not in r.headers
        ok = c.post("/ui/login", data={"token": live.tokens["auditor"]})
        assert ok.status_code == 303
        twice = c.get("/ui/?view=a&view=b")
        assert twice.status_code == 422 and "given twice" in twice.json()["detail"]
        assert c.get("/ui/?view=a").status_code == 200  # a read may carry an unknown one
        verify = c.post("/ui/verify?dry_run=true")
        assert verify.status_code == 422 and "dry_run" in verify.json()["detail"]
