"""Every row that decides a budget is covered by the audit (issue 16 items 3, 4, 6), on SQLite
and PostgreSQL: per-subject spends, session status/state and reports are recomputed from the
chain; subject ids are pseudonymous at rest; signed heads detect forged appended entries."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, text

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage import signing
from privcal.storage.models import Dataset, SubjectSpend
from privcal.storage.sessions import CollectionSession, SessionReport


def _sql(acct: Accountant, sql: str, **params: Any) -> None:
    """Edit the database behind privcal's back (what a database administrator can do)."""
    with acct.ledger.engine.begin() as conn:
        conn.execute(text(sql), params)


def _p(acct: Accountant, subject: str) -> str:
    return str(acct.ledger.pseudonyms([subject])[0])


@pytest.fixture
def spent(accountant: Accountant) -> Accountant:
    accountant.create_dataset("d", rho=1, subject_epsilon=1)
    accountant.charge_subjects("d", 1, ["alice", "bob"])  # both at their cap
    accountant.charge_subjects("d", "0.5", ["carol"])
    accountant.verify()
    return accountant


# ------------------------------------------------------------------ pseudonyms (16.6)
def test_subject_ids_are_not_stored(spent: Accountant) -> None:
    with spent.ledger.read() as s:
        stored = set(s.scalars(select(SubjectSpend.subject)))
    assert stored == {_p(spent, x) for x in ("alice", "bob", "carol")}
    with spent.ledger.engine.connect() as conn:
        for table in ("subject_spend", "charge_members", "audit_log", "charges"):
            dump = repr(conn.execute(text(f"SELECT * FROM {table}")).all())
            assert "alice" not in dump and "carol" not in dump
    assert spent.subject_spend("d", "alice") == Decimal(1)
    assert spent.subject_spend("d", "carol") == Decimal("0.5")
    assert spent.subject_spend("d", "nobody") == 0
    # the cap still binds the same person across batches
    assert spent.charge_subjects("d", "0.5", ["alice", "carol"]).accepted == 1


# ------------------------------------------------------------------ subject spends (16.3)
def test_renamed_subject_is_detected(spent: Accountant) -> None:
    # rename alice's row: alice would start again from 0 and overspend her cap
    _sql(spent, "UPDATE subject_spend SET subject = :new WHERE subject = :old",
         new=_p(spent, "mallory"), old=_p(spent, "alice"))
    assert spent.subject_spend("d", "alice") == 0
    with pytest.raises(AuditFailed, match=r"dataset 1 \('d'\): subject .* \(entries \[2\]\)"):
        spent.verify()


def test_moved_units_are_detected(spent: Accountant) -> None:
    # the sum is unchanged, so the totals check alone passes
    _sql(spent, "UPDATE subject_spend SET spent_units = spent_units - 500000000000 "
         "WHERE subject = :a", a=_p(spent, "alice"))
    _sql(spent, "UPDATE subject_spend SET spent_units = spent_units + 500000000000 "
         "WHERE subject = :c", c=_p(spent, "carol"))
    with pytest.raises(AuditFailed, match="subject row\\(s\\) differ"):
        spent.verify()
    head = spent.ledger.head()
    with pytest.raises(AuditFailed):
        spent.verify(expect_head=str(head))


def test_deleted_or_inserted_subject_rows_are_detected(spent: Accountant) -> None:
    _sql(spent, "DELETE FROM subject_spend WHERE subject = :a", a=_p(spent, "alice"))
    with pytest.raises(AuditFailed, match="subject"):
        spent.verify()


def test_edited_members_or_replaced_secret_are_detected(spent: Accountant) -> None:
    _sql(spent, "DELETE FROM charge_members WHERE charge_id = 2")
    with pytest.raises(AuditFailed, match="audit entry 3: the subjects charged by charge 2"):
        spent.verify()


def test_replaced_ledger_secret_is_detected(spent: Accountant) -> None:
    _sql(spent, "UPDATE ledger_secret SET secret = :s", s="11" * 32)
    with pytest.raises(AuditFailed, match="secret replaced"):
        spent.verify()


# ------------------------------------------------------------------ sessions (16.3)
def _session(acct: Accountant) -> int:
    acct.create_dataset("s", epsilon=1, subject_epsilon=5)
    info = S.open_session(acct, "ldp-score", dataset="s", alpha=0.1, epsilon=1.5, rounds=3,
                          group_size=3)
    S.submit_reports(acct, info.id, ["a", "b"], [1, 0], [0, 0])
    acct.verify()
    return info.id


def test_edited_report_bit_is_detected(accountant: Accountant) -> None:
    sid = _session(accountant)
    _sql(accountant, "UPDATE session_reports SET value = '0' WHERE subject = :a",
         a=_p(accountant, "a"))
    with pytest.raises(AuditFailed, match=rf"audit entry 4: session {sid}'s reports of batch 1"):
        accountant.verify()


def test_edited_report_subject_is_detected(accountant: Accountant) -> None:
    _session(accountant)
    _sql(accountant, "UPDATE session_reports SET subject = :z WHERE subject = :a",
         z=_p(accountant, "z"), a=_p(accountant, "a"))
    with pytest.raises(AuditFailed, match="reports of batch 1 differ"):
        accountant.verify()


def test_edited_session_status_is_detected(accountant: Accountant) -> None:
    sid = _session(accountant)
    S.close_session(accountant, sid, abandon=True)
    _sql(accountant, "UPDATE collection_sessions SET status = 'open' WHERE id = :i", i=sid)
    with pytest.raises(AuditFailed, match=rf"audit entry 5: session {sid}'s status or state"):
        accountant.verify()


def test_edited_session_state_is_detected(accountant: Accountant) -> None:
    sid = _session(accountant)

    def edit(s: Any) -> None:
        row = s.get(CollectionSession, sid)
        row.state = {**row.state, "round_count": 0}  # the round would take 3 more reports

    accountant.ledger.write(edit)
    with pytest.raises(AuditFailed, match=rf"audit entry 4: session {sid}'s status or state"):
        accountant.verify()


def test_deleted_report_is_detected(accountant: Accountant) -> None:
    _session(accountant)
    with accountant.ledger.engine.begin() as conn:
        conn.execute(SessionReport.__table__.delete().where(
            SessionReport.subject == _p(accountant, "b")))
    with pytest.raises(AuditFailed, match="reports of batch 1 differ"):
        accountant.verify()


# ------------------------------------------------------------------ signed heads (16.4)
def _forge_append(acct: Accountant) -> None:
    """Append a dataset and its entry with the chain recomputed, as a DBA with the code can."""
    from privcal.storage.audit import dataset_doc, now

    def tx(s: Any) -> None:
        ds = Dataset(name="forged", description="", notion="zcdp", cap_rho=Decimal(100),
                     reporting_delta=Decimal("1e-6"), allow_nonprivate=True, created_at=now(),
                     spent_pure_eps=0, spent_pure_rho=0, spent_zcdp_rho=0, spent_approx_eps=0,
                     spent_approx_delta=0, charge_count=0)
        s.add(ds)
        s.flush()
        acct.ledger.append_audit(s, "dataset", dataset_doc(ds))

    acct.ledger.write(tx)


def test_signed_head_detects_a_forged_appended_entry(spent: Accountant, tmp_path: Path) -> None:
    priv, pub, _ = signing.generate_keypair(tmp_path / "k")
    signed = spent.ledger.sign_head(priv)
    rep = spent.verify(signed_head=signed, trusted_key=pub)
    assert rep.signed_through == rep.entries and rep.unsigned_entries == 0
    bare = str(spent.ledger.head())
    _forge_append(spent)
    spent.verify(expect_head=bare)  # the bare head proves only the prefix: the forgery passes
    with pytest.raises(AuditFailed, match=r"audit entry 4: not signed by the trusted key"):
        spent.verify(signed_head=signed, trusted_key=pub)
    assert spent.verify(signed_head=signed, trusted_key=pub,
                        allow_unsigned_tail=True).unsigned_entries == 1


def test_signed_head_rejects_other_keys_and_edits(spent: Accountant, tmp_path: Path) -> None:
    priv, pub, _ = signing.generate_keypair(tmp_path / "k")
    _, other_pub, _ = signing.generate_keypair(tmp_path / "other")
    signed = spent.ledger.sign_head(priv)
    with pytest.raises(AuditFailed, match="does not verify with the trusted key"):
        spent.verify(signed_head=signed, trusted_key=other_pub)
    # a DBA who rewrites the log and edits the head file to match cannot re-sign it
    doc = signed.model_dump()
    doc["hash"] = "ab" * 32
    with pytest.raises(AuditFailed, match="does not verify"):
        spent.verify(signed_head=doc, trusted_key=pub)
    with pytest.raises(InvalidInput, match="both"):
        spent.verify(signed_head=signed)
    with pytest.raises(InvalidInput, match="already exists"):
        signing.generate_keypair(tmp_path / "k")
    with pytest.raises(InvalidInput, match="not a PEM public key"):
        spent.verify(signed_head=signed, trusted_key=priv)


def test_cli_keygen_sign_verify(spent: Accountant, ledger_url: str, tmp_path: Path) -> None:
    from privcal.cli import main

    def run(*args: str) -> Any:
        return CliRunner().invoke(main, ["--db-url", ledger_url, *args])

    key = tmp_path / "audit.key"
    r = run("audit", "keygen", str(key), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["public_key"] == f"{key}.pub"
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    r = run("audit", "head", "--sign", str(key))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert set(doc) == {"format", "seq", "hash", "time", "key_id", "signature"}
    head_file = tmp_path / "head.json"
    head_file.write_text(r.output)
    ok = run("audit", "verify", "--signed-head", str(head_file), "--trusted-key", f"{key}.pub",
             "--json")
    assert ok.exit_code == 0 and json.loads(ok.output)["signed_through"] == doc["seq"]
    _forge_append(spent)
    bad = run("audit", "verify", "--signed-head", str(head_file), "--trusted-key", f"{key}.pub")
    assert bad.exit_code == 4 and "not signed by the trusted key" in bad.stderr
    r = run("budget", "show", "d", "--subject", "alice", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["subject"]["spent"] == "1"


def test_fast_pseudonyms_equal_hmac_sha256() -> None:
    import hmac
    import os

    from privcal.storage import pseudonyms as P

    for key in (os.urandom(32), os.urandom(80), b""):  # ≤ and > the 64-byte block
        ids = ["", "alice", "000007", "ünï\t\n", "x" * 200, "\udcff"]
        want = [hmac.digest(key, i.encode("utf-8", "surrogatepass"), "sha256") for i in ids]
        assert P.pseudonym_bytes(key, ids) == want
        assert P.pseudonyms(key, ids).tolist() == [w.hex() for w in want]
        assert P.pseudonyms_raw(key, ids).tobytes() == b"".join(want)


def test_of_two_signed_heads_of_one_entry_the_newest_signing_is_reported(
        spent: Accountant, tmp_path: Path) -> None:
    """Red team 21, readme F2: the nightly signing of a quiet log makes heads of one entry;
    verified with both, the summary gave the first one's signing time, whatever the order —
    a stale file's age. It gives the newest, in either order."""
    from datetime import UTC, datetime

    priv, pub, _ = signing.generate_keypair(tmp_path / "k")
    head = spent.ledger.head()
    old = signing.sign_head(head, priv, time=datetime(2026, 11, 23, tzinfo=UTC))
    new = signing.sign_head(head, priv, time=datetime(2026, 11, 24, tzinfo=UTC))
    for order in ([old, new], [new, old]):
        rep = spent.verify(signed_head=order, trusted_key=pub)
        assert rep.signed_at == new.time and rep.signed_at.startswith("2026-11-24"), order
