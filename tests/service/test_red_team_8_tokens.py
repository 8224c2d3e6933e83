"""Red team 8, token administration: tokens bound to a session that can no longer take
reports, a session id no SQL integer column holds, ``Idempotency-Key`` on ``POST
/v1/tokens`` (a retried create minted a second live credential) and bidirectional controls
in token names — each on ``POST /v1/tokens``, the CLI and the library, on SQLite and
PostgreSQL. A refusal is one line and writes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from privcal.cli import main
from privcal.errors import InvalidInput, NotFound
from tests.service.conftest import Live, answer_fed, open_fed, open_ldp

P = "urn:privcal:problem:"


def _count(lv: Live) -> int:
    from privcal.storage.tokens import ApiToken

    with lv.accountant.ledger.read() as s:
        return int(s.scalar(select(func.count()).select_from(ApiToken)) or 0)


def _refused(r: Any, status: int, slug: str, *words: str) -> str:
    """The problem's one-line detail, after checking its status, type and words."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == P + slug, body
    detail = str(body["detail"])
    assert "\n" not in detail and all(w in detail for w in words), detail
    return detail


def _cli(lv: Live, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", lv.ledger_url, "token", "create", *args])


def _cli_refused(lv: Live, *args: str, words: tuple[str, ...]) -> None:
    before = _count(lv)
    r = _cli(lv, *args)
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), r.output
    assert _count(lv) == before


def _close(lv: Live, sid: int, key: str, **body: Any) -> None:
    with lv.client("analyst") as c:
        r = c.post(f"/v1/sessions/{sid}/close", json=body, headers={"Idempotency-Key": key})
        assert r.status_code == 200, r.text


# ------------------------------------------------ 1. a session that can no longer report
def test_no_token_for_an_abandoned_or_released_session(live: Live) -> None:
    """Attack: abandon a session, then ``POST /v1/tokens`` a device (or ingestor, or agent)
    token for it: 201, a live credential that could never report. Now 422 naming the
    session's state, nothing written — on the route, ``token create`` and ``--count``."""
    ldp = open_ldp(live)
    _close(live, ldp, "ab-ldp", abandon=True)
    fed = open_fed(live, agents=3)
    answer_fed(live, fed)
    _close(live, fed, "rel-fed", allow_missing=True)
    before = _count(live)
    cases = [({"role": "device", "session": ldp, "subject": "late"}, "abandoned"),
             ({"role": "ingestor", "session": ldp}, "abandoned"),
             ({"role": "agent", "session": fed, "agent": "a2"}, "released"),
             ({"role": "ingestor", "session": fed}, "released")]
    with live.client("admin") as c:
        for body, state in cases:
            sid = body["session"]
            _refused(c.post("/v1/tokens", json=body), 422, "invalid-input",
                     f"session {sid} is {state}", "could never report")
    assert _count(live) == before
    _cli_refused(live, "--role", "device", "--session", str(ldp), "--subject", "late",
                 words=(f"session {ldp} is abandoned",))
    _cli_refused(live, "--role", "device", "--session", str(ldp), "--count", "3",
                 "--subject-prefix", "p-", words=(f"session {ldp} is abandoned",))
    _cli_refused(live, "--role", "ingestor", "--session", str(fed),
                 words=(f"session {fed} is released",))
    open_ = open_ldp(live)  # an open session still takes them
    with live.client("admin") as c:
        r = c.post("/v1/tokens", json={"role": "device", "session": open_, "subject": "s"})
        assert r.status_code == 201, r.text


# ------------------------------------------------ 2. a session id beyond 2³¹−1
@pytest.mark.parametrize("sid", [2**31, 2**31 + 5, 2**62])
def test_a_session_id_no_integer_column_holds_is_refused(live: Live, sid: int) -> None:
    """Attack: ``{"role":"device","session":2147483648,"subject":"x"}`` → 500 on
    PostgreSQL (integer out of range). Now 422 from the model; the CLI says the session is
    unknown in one line; the library refuses to store it."""
    from privcal.service.bound_tokens import create_bound_device_tokens
    from privcal.storage.token_bulk import create_device_tokens
    from privcal.storage.tokens import create_token

    before = _count(live)
    with live.client("admin") as c:
        for body in ({"role": "device", "session": sid, "subject": "x"},
                     {"role": "ingestor", "session": sid}):
            _refused(c.post("/v1/tokens", json=body), 422, "invalid-input", "body.session",
                     "less than or equal to 2147483647")
    _cli_refused(live, "--role", "device", "--session", str(sid), "--subject", "x",
                 words=(f"unknown session {sid}",))
    _cli_refused(live, "--role", "ingestor", "--session", str(sid),
                 words=(f"unknown session {sid}",))
    _cli_refused(live, "--role", "device", "--session", str(sid), "--count", "2",
                 "--subject-prefix", "p-", words=(f"unknown session {sid}",))
    led = live.accountant.ledger
    with pytest.raises(NotFound, match=f"unknown session {sid}"):
        create_bound_device_tokens(live.accountant, sid, ["a"], None)
    with pytest.raises(InvalidInput, match="session must be an integer in"):
        create_token(led, "ingestor", session=sid)
    with pytest.raises(InvalidInput, match="session must be an integer in"):
        create_device_tokens(led, sid, ["a"])
    assert _count(live) == before


# ------------------------------------------------ 3. Idempotency-Key on POST /v1/tokens
def test_a_keyed_token_create_is_made_once_and_its_secret_never_stored(live: Live) -> None:
    """Attack: the same Idempotency-Key and body twice → 201 twice, two live tokens. Now
    the second is 409 ``token-already-created`` naming the first token (its secret is not
    repeated: the key's record holds the token id only); the key with another body is
    ``idempotency-key-reused``; without a key each request creates a token."""
    from privcal.storage.tokens import IdempotencyRecord, authenticate

    body = {"role": "auditor", "name": "retried"}
    before = _count(live)
    with live.client("admin") as c:
        first = c.post("/v1/tokens", json=body, headers={"Idempotency-Key": "k1"})
        assert first.status_code == 201, first.text
        tok, tid = first.json()["token"], first.json()["id"]
        # pcl_<id>_<secret>: the secret is urlsafe base64 and may hold "_" itself (a last
        # fragment of one character was found in the 409's text by chance: a flaky test)
        secret = tok.split("_", 2)[2]
        assert tok == f"pcl_{tid}_{secret}" and len(secret) == 43
        again = c.post("/v1/tokens", json=body, headers={"Idempotency-Key": "k1"})
        detail = _refused(again, 409, "token-already-created", tid, "shown once",
                          "under a new Idempotency-Key")
        assert secret not in again.text and tok not in detail
        _refused(c.post("/v1/tokens", json={**body, "name": "other"},
                        headers={"Idempotency-Key": "k1"}), 409, "idempotency-key-reused")
    assert _count(live) == before + 1
    assert authenticate(live.accountant.ledger, tok) is not None
    with live.accountant.ledger.read() as s:
        recs = list(s.scalars(select(IdempotencyRecord)))
    stored = json.dumps([(r.route, r.fingerprint, r.response) for r in recs])
    assert secret not in stored and tid in stored
    assert [(r.state, r.status_code) for r in recs] == [("done", 201)]
    with live.client("admin") as c:  # without a key: a token per request, as before
        assert c.post("/v1/tokens", json=body).status_code == 201
        assert c.post("/v1/tokens", json=body).status_code == 201
    assert _count(live) == before + 3


def test_a_refused_keyed_token_create_leaves_its_key_free(live: Live) -> None:
    """A create refused (an unknown dataset) under a key writes nothing — no token and no
    record — so the corrected request may use the same key; a blank key is no key."""
    from privcal.storage.tokens import IdempotencyRecord

    before = _count(live)
    with live.client("admin") as c:
        h = {"Idempotency-Key": "k2"}
        _refused(c.post("/v1/tokens", json={"role": "analyst", "datasets": ["nope"]},
                        headers=h), 404, "not-found", "nope")
        with live.accountant.ledger.read() as s:
            assert s.scalar(select(func.count()).select_from(IdempotencyRecord)) == 0
        ok = c.post("/v1/tokens", json={"role": "analyst", "datasets": ["d"]}, headers=h)
        assert ok.status_code == 201, ok.text
        assert c.post("/v1/tokens", json={"role": "admin"},
                      headers={"Idempotency-Key": ""}).status_code == 201
    assert _count(live) == before + 2


def test_the_keyed_record_is_completed_in_the_tokens_own_transaction(live: Live) -> None:
    """No window between the token's commit and its key's record: the record is completed
    by the same transaction, so a token is never written under a key left pending (a
    retry after a crash there would have minted a second one)."""
    from privcal.storage.tokens import create_token, reserve_idempotent

    led = live.accountant.ledger
    assert reserve_idempotent(led, "p", "k3", "POST /v1/tokens", "f").state == "new"
    new = create_token(led, "auditor", idempotency=("p", "k3"))
    out = reserve_idempotent(led, "p", "k3", "POST /v1/tokens", "f")
    assert (out.state, out.status_code, out.response) == ("replay", 201, {"id": new.id})
    before = _count(live)
    with pytest.raises(InvalidInput, match="no pending"):  # a record already completed
        create_token(led, "auditor", idempotency=("p", "k3"))
    assert _count(live) == before


# ------------------------------------------------ 4. bidirectional controls in names
@pytest.mark.parametrize("ch", ["\u202e", "\u202a", "\u2066", "\u2069", "\u200e", "\u200f"])
def test_a_token_name_with_a_bidi_control_is_refused(live: Live, ch: str) -> None:
    """Attack: ``{"role":"analyst","datasets":["d"],"name":"\\u202eadmin"}`` → 201; the
    name then reversed the text after it in ``token list`` and the UI. Now 422 by the
    library's rule for names (:data:`privcal.errors.BIDI_CONTROLS`), CLI included."""
    from privcal.storage.tokens import token_texts

    before = _count(live)
    with live.client("admin") as c:
        _refused(c.post("/v1/tokens", json={"role": "analyst", "datasets": ["d"],
                                            "name": f"{ch}admin"}),
                 422, "invalid-input", "name", "bidirectional")
    _cli_refused(live, "--role", "admin", "--name", f"x{ch}y", words=("bidirectional",))
    assert _count(live) == before
    with pytest.raises(InvalidInput, match="bidirectional"):
        token_texts(name=f"a{ch}", datasets=[], subject=None, agent=None)
    with live.client("admin") as c:  # right-to-left letters themselves are names
        assert c.post("/v1/tokens", json={"role": "admin", "name": "מנהל"}).status_code == 201


def test_a_dataset_named_before_the_bidi_rule_can_still_be_granted(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review R (F1): the bidi rule is a rule for *new* names. A dataset created before it
    with such a name still works everywhere; granting it to a token was refused (the token
    check applied the new-name rule to a binding, which names an existing dataset)."""
    import privcal.accountant.datasets as datasets_module

    legacy = "\u2066sales\u2069"
    monkeypatch.setattr(datasets_module, "_check_addressable", lambda name: None)
    live.accountant.create_dataset(legacy, epsilon=1)
    monkeypatch.undo()
    with live.client("admin") as c:
        r = c.post("/v1/tokens", json={"role": "analyst", "datasets": [legacy]})
        assert r.status_code == 201, r.text
        new = c.post("/v1/datasets", json={"name": "x\u2066y", "epsilon": "1"})
        assert new.status_code == 422 and "bidirectional" in new.json()["detail"]  # new: no
