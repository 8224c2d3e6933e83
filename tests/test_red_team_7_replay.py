"""Red team 7, C-1 (library and CLI), on SQLite and PostgreSQL: closing a session took no
idempotency key, so a retry of a close whose answer was lost (a crash after the commit) was
answered "already closed" instead of the original answer. ``close_session`` now records a
key with the close (in the session's state, committed to by the ``session_close`` entry)
and a retry under it returns the closed session and the release the close made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.cli import main
from privcal.costs import ZCDP
from privcal.errors import AuditFailed, InvalidInput, PlanRejected
from privcal.storage.sessions import CollectionSession
from privcal.storage.tokens import audit_entries
from tests.test_red_team_7_sessions import _fed_two_of_three


def _entries(acct: Accountant, kind: str, sid: int) -> list[dict[str, Any]]:
    docs = [json.loads(e.payload) for e in audit_entries(acct.ledger, limit=1000)]
    return [d["data"] for d in docs if d["kind"] == kind and d["data"].get("session_id") == sid]


def _releases(acct: Accountant) -> int:
    """How many releases the log records."""
    return sum(e.kind == "release" for e in audit_entries(acct.ledger, limit=1000))


def _ldp(acct: Accountant) -> int:
    if "u" not in {d.name for d in acct.datasets()}:
        acct.create_dataset("u", rho=1, subject_epsilon=10)
    return S.open_session(acct, "ldp-score", dataset="u", alpha=0.1, epsilon=2.0, rounds=2,
                          group_size=50).id


def test_a_keyed_abandon_retried_returns_the_closed_session(accountant: Accountant) -> None:
    sid = _ldp(accountant)
    first = S.close_session(accountant, sid, abandon=True, idempotency_key="close-1")
    head = accountant.ledger.head()
    again = S.close_session(accountant, sid, abandon=True, idempotency_key="close-1")
    assert again == first and again.status == "closed"
    assert accountant.ledger.head() == head  # the retry wrote nothing
    # the key binds the request: other options under it are refused, naming the key
    with pytest.raises(InvalidInput, match="idempotency key 'close-1' was already used"):
        S.close_session(accountant, sid, allow_missing=True, idempotency_key="close-1")
    # without that key a closed session is refused as before
    for key in (None, "close-2"):
        with pytest.raises(PlanRejected, match="already closed"):
            S.close_session(accountant, sid, abandon=True, idempotency_key=key)
    assert accountant.ledger.head() == head
    (entry,) = _entries(accountant, "session_close", sid)
    assert entry["idempotency_key"] == "close-1" and len(entry["request_digest"]) == 64
    accountant.verify()


def test_a_keyed_release_at_close_retried_returns_its_release(accountant: Accountant) -> None:
    sid = _fed_two_of_three(accountant)
    first = S.close_session(accountant, sid, allow_missing=True, idempotency_key="k",
                            requester="carol")
    assert first.status == "released" and first.release_id is not None
    again = S.close_session(accountant, sid, allow_missing=True, idempotency_key="k",
                            requester="carol")
    assert again == first  # the same release, not a second one, not "already released"
    assert len(_entries(accountant, "session_close", sid)) == 1
    assert _releases(accountant) == 1
    with pytest.raises(InvalidInput, match="idempotency key 'k'"):
        S.close_session(accountant, sid, abandon=True, idempotency_key="k")
    accountant.verify()


def test_the_close_key_is_committed_to_by_the_log(accountant: Accountant) -> None:
    """The key a retry is matched on lives in the session's state, which the close entry's
    state digest commits to: editing it (to answer another request's retry) is detected."""
    sid = _ldp(accountant)
    S.close_session(accountant, sid, abandon=True, idempotency_key="mine")
    accountant.verify()

    def tx(s: Any) -> None:
        row = s.get(CollectionSession, sid)
        row.state = {**row.state, "close_idempotency_key": "theirs"}

    accountant.ledger.write(tx)
    with pytest.raises(AuditFailed, match=rf"session {sid}'s status or state differs"):
        accountant.verify()


def test_cli_session_close_takes_an_idempotency_key(ledger: Any, tmp_path: Path) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    acct = Accountant(ledger)
    sid = _fed_two_of_three(acct)
    args = ["--db-url", url, "session", "close", str(sid), "--allow-missing",
            "--idempotency-key", "c1", "--json"]
    one, two = CliRunner().invoke(main, args), CliRunner().invoke(main, args)
    assert one.exit_code == 0 and two.exit_code == 0, (one.output, two.output)
    assert json.loads(one.stdout) == json.loads(two.stdout)
    assert json.loads(two.stdout)["release_id"] is not None
    assert _releases(acct) == 1
    acct.verify()


# ------------------------------------------------- an open that charges nothing, keyed
OPEN = dict(alpha=0.1, epsilon=2.0, rounds=2, group_size=50)


def test_a_keyed_open_that_charges_nothing_is_opened_once(accountant: Accountant) -> None:
    accountant.create_dataset("u", rho=1, subject_epsilon=10)
    first = S.open_session(accountant, "ldp-score", dataset="u", idempotency_key="o1", **OPEN)
    head = accountant.ledger.head()
    again = S.open_session(accountant, "ldp-score", dataset="u", idempotency_key="o1", **OPEN)
    assert again == first  # the session it opened, not a second one
    assert accountant.ledger.head() == head
    # another request under the key, or a key a charge was made under: refused, naming it
    with pytest.raises(InvalidInput, match="idempotency key 'o1' was already used"):
        S.open_session(accountant, "ldp-score", dataset="u", idempotency_key="o1",
                       **{**OPEN, "alpha": 0.2})
    accountant.charge("u", ZCDP(rho="0.01"), idempotency_key="c1")
    head = accountant.ledger.head()
    with pytest.raises(InvalidInput, match="idempotency key 'c1' was already used"):
        S.open_session(accountant, "ldp-score", dataset="u", idempotency_key="c1", **OPEN)
    assert accountant.ledger.head() == head
    # a federated open too; another key opens another session
    fed = dict(alpha=0.2, epsilon=2.0, agents=3, local_n=200, bins=20, upper=1.0)
    f1 = S.open_session(accountant, "fedcp2-qq", dataset="u", idempotency_key="f", **fed)
    assert S.open_session(accountant, "fedcp2-qq", dataset="u", idempotency_key="f",
                          **fed).id == f1.id
    assert S.open_session(accountant, "ldp-score", dataset="u", idempotency_key="o2",
                          **OPEN).id not in (first.id, f1.id)
    accountant.verify()


def test_cli_session_open_takes_a_key_without_shuffled(ledger: Any) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    Accountant(ledger).create_dataset("u", rho=1, subject_epsilon=10)
    args = ["--db-url", url, "session", "open", "ldp-score", "--dataset", "u", "--alpha",
            "0.1", "--epsilon", "2", "--rounds", "2", "--group-size", "50",
            "--idempotency-key", "o1", "--json"]
    one, two = CliRunner().invoke(main, args), CliRunner().invoke(main, args)
    assert one.exit_code == 0 and two.exit_code == 0, (one.output, two.output)
    assert json.loads(one.stdout)["id"] == json.loads(two.stdout)["id"] == 1
