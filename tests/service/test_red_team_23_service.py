"""Red team 23, service: findings against a running ``privcal serve`` (tests/service/conftest)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.conftest import Live, ledger_snapshot


def test_f1_amplify_past_the_services_bound_is_a_422_that_computes_nothing(live: Live) -> None:
    """n = 10⁹ (the library's bound) took 12–15 s of the server's CPU per request: the
    service takes n ≤ 10⁸, a shuffled session's largest group, and names the limit."""
    limit = 10**8  # privcal.service.routes_plans.AMPLIFY_MAX_N
    body = {"epsilon0": 0.1, "delta": 1e-300, "randomizer": "generic"}  # cheap at any n
    with live.client("analyst") as c:
        before = ledger_snapshot(live)
        r = c.post("/v1/amplify", json={**body, "n": limit + 1})
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert "100,000,000" in r.json()["detail"] and "privcal amplify" in r.json()["detail"]
        assert ledger_snapshot(live) == before
        ok = c.post("/v1/amplify", json={**body, "n": limit})
        assert ok.status_code == 200, ok.text
        assert ok.json()["n"] == limit


def _locked_once(real: Any) -> Any:
    """``real``, but its first call finds the ledger locked (as SQLite's 30 s wait ends)."""
    from privcal.errors import LedgerError

    calls = {"n": 0}

    def f(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise LedgerError("the ledger stayed locked after 1 attempt; try again")
        return real(*a, **k)

    return f


def test_f2_the_retry_of_a_503_is_run_not_told_it_is_still_running(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """The charge met a locked ledger (503), and so did the removal of its key's pending
    record: the retry the 503 asks for was 409 "still running" for 5 minutes."""
    import privcal.storage.tokens as tokens

    acct = live.app.state.accountant
    monkeypatch.setattr(acct, "charge", _locked_once(acct.charge))
    monkeypatch.setattr(tokens, "forget_idempotent", _locked_once(tokens.forget_idempotent))
    with live.client("analyst") as c:
        send = {"json": {"cost": {"rho": "0.01"}}, "headers": {"Idempotency-Key": "k-503"}}
        first = c.post("/v1/datasets/d/charges", **send)
        assert first.status_code == 503, first.text
        again = c.post("/v1/datasets/d/charges", **send)
        assert again.status_code == 201, again.text
        replay = c.post("/v1/datasets/d/charges", **send)
        assert replay.status_code == 200 and replay.json()["replayed"] is True
        assert replay.json()["charge_id"] == again.json()["charge_id"]
        assert c.get("/v1/datasets/d/budget").json()["spent"] == {"rho": "0.01"}


def test_f2_a_committed_charge_is_answered_though_its_record_met_a_locked_ledger(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """The charge committed, then the service's record of its answer met a locked ledger:
    the client was told 503 "try again" (its receipt lost; a new key charges twice)."""
    import privcal.storage.tokens as tokens

    monkeypatch.setattr(tokens, "finish_idempotent", _locked_once(tokens.finish_idempotent))
    with live.client("analyst") as c:
        send = {"json": {"cost": {"rho": "0.01"}}, "headers": {"Idempotency-Key": "k-done"}}
        first = c.post("/v1/datasets/d/charges", **send)
        assert first.status_code == 201, first.text
        again = c.post("/v1/datasets/d/charges", **send)
        assert again.status_code == 200, again.text
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["charge_id"] == first.json()["charge_id"]
        assert c.get("/v1/datasets/d/budget").json()["spent"] == {"rho": "0.01"}


def test_f3_a_token_name_of_a_default_names_form_is_refused(live: Live) -> None:
    """A token named ``token-<another token's id>`` wrote that token's requester into the
    ledger: the auditor blamed the wrong token. Refused (422, nothing written); any other
    name, and a token made without one (named ``token-<its id>``), as before."""
    with live.client("admin") as c:
        plain = c.post("/v1/tokens", json={"role": "analyst", "dataset": "d"})
        assert plain.status_code == 201, plain.text
        tid = plain.json()["id"]
        assert plain.json()["info"]["name"] == f"token-{tid}"
        before = ledger_snapshot(live)
        for name in (f"token-{tid}", "token-0123456789abcdef"):
            r = c.post("/v1/tokens", json={"role": "analyst", "dataset": "d", "name": name})
            assert r.status_code == 422, r.text
            assert "default name" in r.json()["detail"]
        assert ledger_snapshot(live) == before
        for name in ("token-ann", "token-0123456789ABCDEF", "Token-0123456789abcdef"):
            r = c.post("/v1/tokens", json={"role": "analyst", "dataset": "d", "name": name})
            assert r.status_code == 201, r.text


def test_f3_the_cli_refuses_it_too(tmp_path: Any) -> None:
    """The rule is the library's (privcal.storage.tokens.create_token): the CLI's too."""
    from privcal.errors import InvalidInput
    from privcal.storage import Ledger
    from privcal.storage.tokens import create_token

    led = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    led.upgrade()
    try:
        with pytest.raises(InvalidInput, match="default name"):
            create_token(led, "admin", name="token-0123456789abcdef")
        assert create_token(led, "admin", name="ops").info.name == "ops"
    finally:
        led.close()
