"""Kept and signed heads against a dishonest operator (red team 18, the external auditor).

- ``audit head --sign`` signed whatever the log held — a log ``audit verify`` refused, and
  one rolled back from entry 23 to 22 — so the next routine signing laundered a rewrite. It
  now verifies the log first and signs the head it verified; with ``--previous`` the log must
  contain the last head signed (F1).
- A rollback to an older head passes a check against that head alone: ``verify`` now takes
  several kept and signed heads, and each must be in the log (F3, F4).
- ``verify`` without a head said a plain "ok"; it now says what it cannot see, and the
  signed head's time is reported (F3, F6). A log shorter than a kept head is no longer
  called "truncated" when it may have been rewritten (F8).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.accountant.verification import sign_head
from privcal.cli import main
from privcal.costs import ZCDP
from privcal.errors import AuditFailed
from privcal.storage.signing import generate_keypair


def _sql(ledger: Any, stmt: str, **params: Any) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(text(stmt), params)


def _drop_newest_charge(accountant: Any, spent_rho: str) -> None:
    """The operator's rollback: the newest entry (a charge) and its row removed, the totals
    and the head row set back — four statements, no hash computed (auditor F2)."""
    ledger = accountant.ledger
    last = ledger.head().seq
    with ledger.engine.connect() as conn:
        prev = conn.execute(text("SELECT entry_hash FROM audit_log WHERE seq = :s"),
                            {"s": last - 1}).scalar_one()
        cid = conn.execute(text("SELECT max(id) FROM charges")).scalar_one()
    _sql(ledger, "DELETE FROM audit_log WHERE seq = :s", s=last)
    _sql(ledger, "DELETE FROM charges WHERE id = :c", c=cid)
    _sql(ledger, "UPDATE datasets SET spent_zcdp_rho = :r, charge_count = charge_count - 1",
         r=spent_rho)
    _sql(ledger, "UPDATE audit_head SET seq = :s, entry_hash = :h", s=last - 1, h=prev)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    priv, pub, _ = generate_keypair(tmp_path / "audit.key", None)
    return Path(priv), Path(pub)


def test_a_rollback_passes_the_older_head_alone_but_not_every_head(
        accountant: Any, keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho=0.1))
    day1 = sign_head(accountant, priv)
    kept1 = f"{day1.seq}:{day1.hash}"
    accountant.charge("d", ZCDP(rho=0.5))
    day2 = sign_head(accountant, priv, previous=day1)
    kept2 = str(accountant.ledger.head())
    assert day2.seq == day1.seq + 1
    _drop_newest_charge(accountant, "0.1")  # the ρ = 0.5 charge is spendable again
    assert accountant.verify(signed_head=day1, trusted_key=pub).signed_through == day1.seq
    assert accountant.verify(expect_head=kept1).heads_checked == 1
    with pytest.raises(AuditFailed, match=rf"audit entry {day2.seq}: missing; the signed head"):
        accountant.verify(signed_head=[day1, day2], trusted_key=pub)
    with pytest.raises(AuditFailed, match=rf"audit entry {day2.seq}: missing; the expected"):
        accountant.verify(expect_head=[kept1, kept2])
    # and the signer's routine refuses to vouch for the rolled-back log
    with pytest.raises(AuditFailed, match=rf"audit entry {day2.seq}: missing"):
        sign_head(accountant, priv, previous=day2)
    with pytest.raises(AuditFailed):
        accountant.ledger.sign_head(priv, previous=day2)


def test_a_broken_log_is_not_signed(accountant: Any, keys: tuple[Path, Path]) -> None:
    priv, _ = keys
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho=0.1))
    _sql(accountant.ledger, "UPDATE audit_log SET payload = replace(payload, '0.1', '0.01') "
         "WHERE seq = 2")
    with pytest.raises(AuditFailed, match="audit entry 2"):
        accountant.ledger.sign_head(priv)
    with pytest.raises(AuditFailed, match="audit entry 2"):
        sign_head(accountant, priv)


def test_the_report_says_what_a_verification_without_a_head_cannot_see(
        accountant: Any, keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    accountant.create_dataset("d", rho=1)
    rep = accountant.verify()
    assert rep.heads_checked == 0 and "no kept head was given" in rep.summary
    signed = sign_head(accountant, priv)
    rep = accountant.verify(signed_head=signed, trusted_key=pub,
                            expect_head=str(accountant.ledger.head()))
    assert rep.heads_checked == 2 and rep.signed_at == signed.time
    assert "no kept head" not in rep.summary and f"(signed {signed.time})" in rep.summary


def test_cli_takes_every_head_and_signs_only_a_log_that_verifies(
        ledger: Any, ledger_url: str, keys: tuple[Path, Path], tmp_path: Path) -> None:
    priv, pub = keys  # ``ledger``: the schema migrated (an explicit URL is not migrated)
    r = CliRunner()

    def run(*args: str) -> Any:
        return r.invoke(main, ["--db-url", ledger_url, *args])

    assert run("dataset", "create", "d", "--rho", "1").exit_code == 0
    assert run("charge", "d", "--rho", "0.1").exit_code == 0
    first = run("audit", "head", "--sign", str(priv))
    assert first.exit_code == 0, first.output
    (tmp_path / "h1.json").write_text(first.stdout)
    h1 = json.loads(first.stdout)
    assert run("charge", "d", "--rho", "0.1").exit_code == 0
    second = run("audit", "head", "--sign", str(priv), "--previous", str(tmp_path / "h1.json"))
    assert second.exit_code == 0, second.output
    (tmp_path / "h2.json").write_text(second.stdout)
    ok = run("--json", "audit", "verify", "--signed-head", str(tmp_path / "h1.json"),
             "--signed-head", str(tmp_path / "h2.json"), "--trusted-key", str(pub),
             "--expect-head", f"{h1['seq']}:{h1['hash']}")
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["heads_checked"] == 3 and doc["signed_through"] == h1["seq"] + 1
    bad = run("audit", "head", "--previous", str(tmp_path / "h1.json"))
    assert bad.exit_code == 2 and "--previous goes with --sign" in bad.output
