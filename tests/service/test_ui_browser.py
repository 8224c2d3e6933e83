"""The auditor's web view in a real headless browser: Debian ``chromium`` driven by
playwright through ``executable_path`` (no browser download). Logs in with a token, sees
budget bars and a drawn spend chart, a hostile dataset name shown as text, verifies the
log — and the page raises no error, no dialog and no CSP violation."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import Live

CHROMIUM = os.environ.get("PRIVCAL_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
HOSTILE = "<script>alert(1)</script>"
#: a dataset name is one URL segment (no '/'): markup without one
HOSTILE_NAME = "<img src=x onerror=alert(1)>"


def _browser_or_skip() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} not installed")
    return sync_api


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_auditor_view_in_chromium(live: Live) -> None:
    sync_api = _browser_or_skip()
    with live.client("admin") as c:
        assert c.post("/v1/datasets", json={"name": HOSTILE_NAME,
                                            "epsilon": "1"}).status_code == 201
    with live.client("analyst") as c:
        for rho in ("0.1", "0.3", "0.2"):
            r = c.post("/v1/datasets/d/charges", json={"cost": {"rho": rho}, "purpose": HOSTILE},
                       headers={"Idempotency-Key": uuid.uuid4().hex})
            assert r.status_code == 201
    problems: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.goto(f"{live.url}/ui/")
            assert page.url.endswith("/ui/login")
            page.fill("#token", live.tokens["auditor"])
            page.click("button[type=submit]")
            page.wait_for_url(f"{live.url}/ui/")
            cookies = {c["name"]: c for c in page.context.cookies()}
            ck = cookies["privcal_ui"]
            assert ck["httpOnly"] and ck["sameSite"] == "Strict"
            # the hostile name is text, not markup
            names = page.locator(".dataset-name").all_inner_texts()
            assert HOSTILE_NAME in names and "d" in names
            assert page.locator("script").count() == 0 and page.locator("img").count() == 0
            # d's chart: 3 charges → 3 points rising to 60 % of the cap
            art = page.locator("article.dataset", has=page.locator(".dataset-name",
                                                                   has_text="d")).last
            pts = art.locator("svg.spend-chart polyline").get_attribute("points") or ""
            ys = [float(p.split(",")[1]) for p in pts.split()]
            assert len(ys) == 3 and ys[0] > ys[1] > ys[2]  # SVG y grows downwards
            box = art.locator("svg.spend-chart").bounding_box()
            assert box is not None and box["width"] > 100 and box["height"] > 50
            assert "60.0%" in art.inner_text()
            page.click("#verify-button")
            assert page.locator("#verify-result").inner_text().startswith("verified")
            assert page.locator("#head").inner_text() == str(live.accountant.ledger.head())
            csp = page.request.get(f"{live.url}/ui/").headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src" not in csp
        finally:
            browser.close()
    assert not problems, problems


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_ui_refuses_other_roles_and_bad_tokens(live: Live) -> None:
    with live.client(follow_redirects=False) as c:
        r = c.post("/ui/login", data={"token": live.tokens["analyst"]})
        assert r.status_code == 403 and "set-cookie" not in r.headers
        r = c.post("/ui/login", data={"token": "pcl_nope"})
        assert r.status_code == 401 and "set-cookie" not in r.headers
        r = c.get("/ui/", headers={"Cookie": f"privcal_ui={live.tokens['analyst']}"})
        assert r.status_code == 303  # a bearer token is not a UI credential
        from privcal.service.ui import issue_credential, ui_key

        cred = issue_credential(ui_key(live.accountant.ledger),
                                live.tokens["analyst"].split("_")[1])
        r = c.get("/ui/", headers={"Cookie": f"privcal_ui={cred}"})
        assert r.status_code == 403
        r = c.post("/ui/login", data={"token": live.tokens["auditor"]})
        assert r.status_code == 303 and "httponly" in r.headers["set-cookie"].lower()
        assert "samesite=strict" in r.headers["set-cookie"].lower()
