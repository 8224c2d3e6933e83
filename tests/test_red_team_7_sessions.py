"""Red team 7, collection sessions (B-1, E-3), on SQLite and PostgreSQL.

B-1: the ``state_digest`` of every session entry was a plain SHA-256 of the session's state,
whose only non-public field is ``round_ones`` (the open round's count of 1-reports): an audit
reader tried ``round_ones = 0..accepted`` and read each batch's count of ones off the log — a
one-report batch's bit, unshuffled, in a session recorded with the shuffle's amplified (ε, δ).
The digest is now keyed with the ledger secret (tagged ``k:``); old entries still verify.

E-3: a session closed by another analyst was recorded as its opener's act (the release's
requester, and a ``session_close`` entry naming nobody).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.cli import main
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage import pseudonyms
from privcal.storage.audit import canonical
from privcal.storage.sessions import CollectionSession
from privcal.storage.tokens import audit_entries

BITS = [0, 1, 1, 0, 1, 0, 0, 1]


def _entries(acct: Accountant, kind: str, sid: int) -> list[dict[str, Any]]:
    """The ``data`` of the session's entries of ``kind``, as an auditor reads them
    (``GET /v1/audit/entries`` serves these payloads)."""
    docs = [json.loads(e.payload) for e in audit_entries(acct.ledger, limit=1000)]
    return [d["data"] for d in docs if d["kind"] == kind and d["data"].get("session_id") == sid]


def _state(acct: Accountant, sid: int) -> dict[str, Any]:
    with acct.ledger.read() as s:
        return dict(s.scalars(select(CollectionSession).where(
            CollectionSession.id == sid)).one().state)


def _edit_state(acct: Accountant, sid: int, **change: Any) -> None:
    """Edit a session's state behind privcal's back (what a database administrator can do)."""
    def tx(s: Any) -> None:
        row = s.get(CollectionSession, sid)
        row.state = {**row.state, **change}

    acct.ledger.write(tx)


def _plain(state: dict[str, Any]) -> str:
    """The attack: the unkeyed SHA-256 of a guessed state, as the log used to record."""
    return hashlib.sha256(canonical(state).encode()).hexdigest()


def _shuffled_ldp(acct: Accountant, name: str = "users") -> int:
    acct.create_dataset(name, approx_epsilon=5, approx_delta="1e-6", subject_epsilon=10)
    return S.open_session(acct, "ldp-score", dataset=name, alpha=0.1, epsilon=2.0, rounds=2,
                          group_size=2000, shuffled=True, idempotency_key="open-" + name).id


def _one_report_batches(acct: Accountant, sid: int, bits: list[int], first: int = 0) -> None:
    for i, b in enumerate(bits, start=first):
        assert S.submit_reports(acct, sid, [f"user{i}"], [b], [0]).accepted == 1


# ------------------------------------------------------------------------------ B-1
def test_one_report_batch_bit_cannot_be_read_off_the_audit_log(accountant: Accountant) -> None:
    sid = _shuffled_ldp(accountant)
    _one_report_batches(accountant, sid, BITS)
    batches = _entries(accountant, "session_batch", sid)
    assert [b["accepted"] for b in batches] == [1] * len(BITS)
    # the attacker knows everything in the state but the open round's count of ones (the
    # strongest assumption: here taken from the row itself, where the red team rebuilt it
    # from the open entry, the session's group size and the charge entries)
    final = _state(accountant, sid)
    assert final["round_ones"] == sum(BITS) and final["round_count"] == len(BITS)
    key = accountant.ledger.subject_key()
    ones = 0
    for i, (entry, bit) in enumerate(zip(batches, BITS, strict=True)):
        def guess(g: int, i: int = i, ones: int = ones) -> dict[str, Any]:
            return {**final, "total": i + 1, "round_count": i + 1, "round_ones": ones + g,
                    "charge_ids": final["charge_ids"][:i + 1]}

        digest = entry["state_digest"]
        for g in (0, 1):  # neither the plain hash nor a tagged one decides the report's bit
            assert digest not in (_plain(guess(g)), "k:" + _plain(guess(g)))
        # control: the guessed states are exactly right — with the ledger secret (what
        # `audit verify` has, and an audit reader does not) the true bit, and only it, matches
        assert pseudonyms.keyed_state_digest(key, guess(bit)) == digest
        assert pseudonyms.keyed_state_digest(key, guess(1 - bit)) != digest
        ones += bit
    # the open entry commits under the key too (its state is public, but one form for all)
    assert _entries(accountant, "session_open", sid)[0]["state_digest"].startswith("k:")
    accountant.verify()
    # the keyed commitment is checked: a state edited to another count of ones fails
    _edit_state(accountant, sid, round_ones=final["round_ones"] - 1)
    with pytest.raises(AuditFailed, match=rf"session {sid}'s status or state differs"):
        accountant.verify()


def test_abandoned_round_and_close_entries_are_keyed(accountant: Accountant) -> None:
    sid = _shuffled_ldp(accountant)
    _one_report_batches(accountant, sid, [1])
    S.close_session(accountant, sid, abandon=True)
    close = _entries(accountant, "session_close", sid)[0]
    final = _state(accountant, sid)
    for g in (0, 1):  # the abandoned round's count was never released: not in the log either
        assert close["state_digest"] not in (
            _plain({**final, "round_ones": g}),
            "k:" + _plain({**final, "round_ones": g}))
    assert close["state_digest"] == pseudonyms.keyed_state_digest(
        accountant.ledger.subject_key(), {**final, "round_ones": 1})
    accountant.verify()


def test_old_form_entries_still_verify_beside_keyed_ones(accountant: Accountant,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries written by the code before (plain SHA-256) verify, beside the keyed ones the
    same sessions get after the upgrade; edits are detected under either form."""
    from privcal.accountant.sessions import closing, ingest, opening, release

    def old(key: bytes, state: Any) -> str:
        return pseudonyms.state_digest(state)

    with monkeypatch.context() as m:  # the code before: every writer of a state digest
        for mod in (opening, ingest, closing, release):
            m.setattr(mod, "keyed_state_digest", old, raising=False)
        sid = _shuffled_ldp(accountant)
        _one_report_batches(accountant, sid, BITS[:3])
        accountant.create_dataset("h", epsilon=1, subject_epsilon=10)
        fed = S.open_session(accountant, "fedcp2-qq", dataset="h", alpha=0.2, epsilon=2.0,
                             agents=3, local_n=200, bins=20, upper=1.0).id
        grid = S.session_status(accountant, fed).grid
        assert grid is not None
        S.submit_reports(accountant, fed, ["a0", "a1"], [grid["lower"] + 10 * grid["step"]] * 2)
        S.close_session(accountant, fed, allow_missing=True)
        gone = S.open_session(accountant, "ldp-score", dataset="users", alpha=0.1, epsilon=2.0,
                              rounds=2, group_size=50).id
        _one_report_batches(accountant, gone, [1], first=100)
        S.close_session(accountant, gone, abandon=True)
    old_digests = [d["state_digest"] for k in ("session_open", "session_batch", "session_close")
                   for s in (sid, fed, gone) for d in _entries(accountant, k, s)]
    assert len(old_digests) == 10
    assert all(len(d) == 64 and not d.startswith("k:") for d in old_digests)
    accountant.verify()  # an old-form ledger verifies with the new code
    # upgraded: the open session goes on, its new entries keyed
    _one_report_batches(accountant, sid, BITS[3:], first=3)
    new = _entries(accountant, "session_batch", sid)[3:]
    assert len(new) == len(BITS) - 3 and all(d["state_digest"].startswith("k:") for d in new)
    accountant.verify()
    # an old-form commitment is still checked: the abandoned session's state edited
    _edit_state(accountant, gone, round_ones=0)
    with pytest.raises(AuditFailed, match=rf"session {gone}'s status or state differs"):
        accountant.verify()


# ------------------------------------------------------------------------------ E-3
def _fed_two_of_three(acct: Accountant) -> int:
    if "h" not in {d.name for d in acct.datasets()}:
        acct.create_dataset("h", epsilon=1, subject_epsilon=10)
    sid = S.open_session(acct, "fedcp2-qq", dataset="h", alpha=0.2, epsilon=2.0, agents=3,
                         local_n=200, bins=20, upper=1.0, requester="analyst:ann").id
    grid = S.session_status(acct, sid).grid
    assert grid is not None
    S.submit_reports(acct, sid, ["a0", "a1"], [grid["lower"] + 10 * grid["step"]] * 2)
    return sid


def test_close_by_another_analyst_is_recorded_as_the_closers(accountant: Accountant) -> None:
    sid = _fed_two_of_three(accountant)
    closed = S.close_session(accountant, sid, allow_missing=True, requester="analyst:carol")
    assert closed.status == "released" and closed.requester == "analyst:ann"  # the opener
    rel = accountant.release(closed.release_id)  # type: ignore[arg-type]
    # the re-planned release is carol's decision; the opener is stated beside it
    assert rel.requester == "analyst:carol"
    assert rel.diagnostics["opened_by"] == "analyst:ann"
    logged = [json.loads(e.payload)["data"] for e in audit_entries(accountant.ledger, limit=1000)
              if e.kind == "release"]
    assert logged[-1]["requester"] == "analyst:carol"
    assert _entries(accountant, "session_close", sid)[0]["closed_by"] == "analyst:carol"
    # abandoned by carol: the close entry names her
    other = _fed_two_of_three(accountant)
    S.close_session(accountant, other, abandon=True, requester="analyst:carol")
    assert _entries(accountant, "session_close", other)[0]["closed_by"] == "analyst:carol"
    accountant.verify()


def test_close_with_a_bad_requester_changes_nothing(accountant: Accountant) -> None:
    sid = _fed_two_of_three(accountant)
    head = accountant.ledger.head()
    for bad in ("x" * 201, 7):
        with pytest.raises(InvalidInput, match="requester"):
            S.close_session(accountant, sid, allow_missing=True, requester=bad)  # type: ignore
    assert accountant.ledger.head() == head
    assert S.session_status(accountant, sid).status == "open"


def test_cli_session_close_records_the_requester(ledger: Any, tmp_path: Path) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    acct = Accountant(ledger)
    sid = _fed_two_of_three(acct)
    res = CliRunner().invoke(main, ["--db-url", url, "session", "close", str(sid),
                                    "--allow-missing", "--requester", "carol", "--json"])
    assert res.exit_code == 0, res.output
    rel = acct.release(json.loads(res.stdout)["release_id"])
    assert rel.requester == "carol" and rel.diagnostics["opened_by"] == "analyst:ann"
    assert _entries(acct, "session_close", sid)[0]["closed_by"] == "carol"
    acct.verify()
