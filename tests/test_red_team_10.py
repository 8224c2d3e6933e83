"""Red team 10 (what the recorded guarantee does not count), on SQLite and PostgreSQL.

L-1: a charge's ``members_digest`` (SHA-256 of the secret's fingerprint and the sorted
pseudonyms) and a batch's ``reports_digest`` (SHA-256 of its ``(pseudonym, round, value)``
rows) were unsalted. A pseudonym is the same in every session of a ledger, so one person's
one-subject charges had equal digests everywhere — an audit reader linked their reports
across sessions — and two one-row batches had equal digests exactly when their round and
bit were equal: against a session whose release shows that person's bit, a *shuffled*
batch's bit was read off the log, beyond the shuffled release's amplified (ε, δ). Both
digests now carry a fresh random salt (``s:SALT:…``); ``audit verify`` still checks them,
and still accepts the unsalted form entries written before carry.

L-2: a subject past its per-subject cap was refused only when its report arrived, after the
device had randomized and sent it (a bit the server saw and the ledger does not count).
``storage.service_reads.subject_standing`` answers, before anything is drawn, the test the report
will meet; ``GET /v1/whoami`` serves it and the client draws nothing when it is false
(tests/service/test_red_team_10_service.py).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text, update

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.errors import AuditFailed
from privcal.storage import pseudonyms as PS
from privcal.storage.models import SUBJECT_UNIT, SubjectSpend
from privcal.storage.service_reads import subject_standing
from privcal.storage.tokens import audit_entries


def within_cap(acct: Accountant, session_id: int, subject: str) -> bool | None:
    """What whoami says of ``subject``'s cap in ``session_id``."""
    return subject_standing(acct.ledger, session_id, subject)[1]


def _data(acct: Accountant, kind: str) -> list[dict[str, Any]]:
    """The ``data`` of every entry of ``kind``, as an auditor reads them."""
    docs = [json.loads(e.payload) for e in audit_entries(acct.ledger, limit=1000)]
    return [d["data"] for d in docs if d["kind"] == kind]


def _open(acct: Accountant, name: str, *, shuffled: bool, rounds: int) -> int:
    return S.open_session(acct, "ldp-score", dataset=name, alpha=0.1, epsilon=2.0,
                          rounds=rounds, group_size=200 if shuffled else 1,
                          shuffled=shuffled, idempotency_key=f"open-{shuffled}").id


# ------------------------------------------------------------------------------ L-1
@pytest.mark.parametrize("bit", [0, 1])
def test_one_persons_charges_and_one_row_batches_cannot_be_linked(
        accountant: Accountant, bit: int) -> None:
    accountant.create_dataset("users", approx_epsilon=20, approx_delta="1e-5",
                              subject_epsilon=6)
    a = _open(accountant, "users", shuffled=False, rounds=1)
    b = _open(accountant, "users", shuffled=True, rounds=2)
    # the same person, the same round, the same bit — in a session whose release shows
    # it and in a shuffled one-row batch
    assert S.submit_reports(accountant, a, ["victim"], [bit], [0]).accepted == 1
    assert S.submit_reports(accountant, b, ["victim"], [bit], [0]).accepted == 1
    batches = {d["session_id"]: d for d in _data(accountant, "session_batch")}
    charges = {d["charge_id"]: d for d in _data(accountant, "charge")}
    ma, mb = (charges[batches[s]["charge_id"]]["members_digest"] for s in (a, b))
    ra, rb = (batches[s]["reports_digest"] for s in (a, b))
    for d in (ma, mb, ra, rb):
        assert d.startswith(PS.SALTED) and len(d) <= 64
    assert ma != mb  # the person's two charges: not linked
    assert ra != rb  # the two batches: equal round and bit, unequal digests
    # what the auditor compared before: the plain digests are equal (the attack's premise)
    kid = PS.key_id(accountant.ledger.subject_key())
    blob = PS.members_blob(PS.pseudonyms(accountant.ledger.subject_key(), ["victim"]))
    assert PS.members_digest_matches(kid, blob, ma) and PS.members_digest_matches(kid, blob, mb)
    accountant.verify()


def test_salted_digests_are_still_checked(accountant: Accountant) -> None:
    accountant.create_dataset("users", approx_epsilon=20, approx_delta="1e-5",
                              subject_epsilon=6)
    sid = _open(accountant, "users", shuffled=True, rounds=2)
    S.submit_reports(accountant, sid, ["u1", "u2", "u3"], [1, 0, 1], [0, 0, 0])
    accountant.verify()

    def flip(s: Any) -> None:  # a stored report's bit edited behind privcal's back
        s.execute(text("UPDATE session_reports SET value = CASE WHEN value = '1' THEN '0' "
                       "ELSE '1' END WHERE session_id = :s AND subject = :p"),
                  {"s": sid, "p": str(PS.pseudonyms(accountant.ledger.subject_key(),
                                                    ["u2"])[0])})

    accountant.ledger.write(flip)
    with pytest.raises(AuditFailed, match=rf"session {sid}'s reports of batch 1 differ"):
        accountant.verify()
    accountant.ledger.write(flip)
    accountant.verify()
    # a charged subject's pseudonym swapped in charge_members: the salted members digest fails
    other = PS.members_blob(PS.pseudonyms(accountant.ledger.subject_key(),
                                          ["u1", "u2", "mallory"]))

    def swap(s: Any) -> None:
        s.execute(text("UPDATE charge_members SET members = :m"), {"m": other})

    accountant.ledger.write(swap)
    with pytest.raises(AuditFailed, match="differ from what the log recorded"):
        accountant.verify()


def test_digest_forms() -> None:
    kid, blob = "k" * 32, b"\x01" * 32
    rows = [("ab" * 32, 0, "1")]
    salted = PS.members_digest(kid, blob)
    assert PS.members_digest(kid, blob) != salted  # a fresh salt each
    salt = salted.split(":")[1]
    assert PS.members_digest(kid, blob, salt) == salted  # the salt decides it
    assert PS.members_digest_matches(kid, blob, salted)
    assert not PS.members_digest_matches(kid, b"\x02" * 32, salted)
    assert not PS.members_digest_matches(kid, blob, salted[:-1] + "0" * (salted[-1] != "0"))
    # an entry written before the salt: the plain SHA-256 is still a match (and only it)
    import hashlib

    plain = hashlib.sha256(b"privcal members\x00" + kid.encode() + b"\x00" + blob).hexdigest()
    assert PS.members_digest_matches(kid, blob, plain)
    assert not PS.members_digest_matches(kid, b"\x02" * 32, plain)
    for bad in ("s:", "s:zz:zz", "s:" + "0" * 16 + ":" + "0" * 44 + ":x", "s:" + plain):
        assert not PS.members_digest_matches(kid, blob, bad)
    old = PS.reports_digest(rows, unsalted=True)
    assert len(old) == 64 and PS.reports_digest_matches(rows, old)
    new = PS.reports_digest(rows)
    assert new.startswith(PS.SALTED) and PS.reports_digest_matches(rows, new)
    assert not PS.reports_digest_matches([("ab" * 32, 0, "0")], new)
    assert not PS.reports_digest_matches([("ab" * 32, 0, "0")], old)


# ------------------------------------------------------------------------------ L-2
@pytest.mark.parametrize("extra_units", [0, 1])
def test_within_cap_is_the_test_a_report_meets(accountant: Accountant, extra_units: int
                                               ) -> None:
    """Exactly at cap − ε0 the report is allowed and accepted; one unit more, it is
    neither (the client asks ``within_cap`` before it draws)."""
    accountant.create_dataset("users", approx_epsilon=20, approx_delta="1e-5",
                              subject_epsilon=6)
    first = _open(accountant, "users", shuffled=False, rounds=1)
    assert within_cap(accountant, first, "alice") is True
    assert S.submit_reports(accountant, first, ["alice"], [1], [0]).accepted == 1
    # alice's spend moved to cap − ε0 (+ one unit) behind privcal's back
    p = str(PS.pseudonyms(accountant.ledger.subject_key(), ["alice"])[0])
    units = int(Decimal(4) / SUBJECT_UNIT) + extra_units

    def put(s: Any) -> None:
        s.execute(update(SubjectSpend).where(SubjectSpend.subject == p)
                  .values(spent_units=units))

    accountant.ledger.write(put)
    second = S.open_session(accountant, "ldp-score", dataset="users", alpha=0.1, epsilon=2.0,
                            rounds=1, group_size=1, idempotency_key="second").id
    allowed = within_cap(accountant, second, "alice")
    assert allowed is (extra_units == 0)
    got = S.submit_reports(accountant, second, ["alice"], [1], [0])
    assert got.accepted == int(bool(allowed))
    assert within_cap(accountant, second, "bob") is True
    assert within_cap(accountant, 10_000, "alice") is None  # no such session
