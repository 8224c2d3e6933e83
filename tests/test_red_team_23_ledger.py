"""Red team 23, ledger: what the SQL ledger and ``audit verify`` let through, on SQLite and
PostgreSQL.

F7: a cap (or the running totals, or a subject's spend row) edited *around* a charge — raised,
the charge accepted by privcal with a genuine entry, then put back — left a log whose rows
all equal their entries and whose totals equal its charges, yet which spends more than the
logged cap allows: ``audit verify`` said ok (and ``audit head --sign`` signed it), and
``budget show`` stated the per-subject guarantee the subjects' spends break. Verify now
checks every dataset's spend against its cap's filter and every subject's against the
per-subject cap (an (ε, δ) dataset charged before migration 0004, which states no guarantee,
excepted: tests/test_red_team_6.py).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal.accountant import Accountant
from privcal.costs import ZCDP, PureDP
from privcal.errors import AuditFailed, BudgetRefused, LedgerError


def _sql(acct: Accountant, sql: str, **params: Any) -> None:
    """Edit the database behind privcal's back (what a database administrator can do)."""
    with acct.ledger.engine.begin() as conn:
        conn.execute(text(sql), params)


def test_a_cap_raised_around_a_charge_fails_verify(accountant: Accountant) -> None:
    accountant.create_dataset("p", epsilon=1)
    accountant.charge("p", PureDP(eps="0.8"))
    head = str(accountant.ledger.head())
    _sql(accountant, "UPDATE datasets SET cap_epsilon = :c WHERE name = 'p'", c="100")
    accountant.charge("p", PureDP(eps=5))
    _sql(accountant, "UPDATE datasets SET cap_epsilon = :c WHERE name = 'p'", c="1")
    with pytest.raises(AuditFailed, match=r"dataset 1 \('p'\): its logged charges spend "
                                          r"epsilon=5\.8 of its cap ε ≤ 1"):
        accountant.verify(expect_head=head)


def test_totals_lowered_around_a_charge_fail_verify(accountant: Accountant) -> None:
    accountant.create_dataset("z", rho="0.5")
    accountant.charge("z", ZCDP(rho="0.4"))
    _sql(accountant, "UPDATE datasets SET spent_zcdp_rho = :v WHERE name = 'z'", v="0")
    accountant.charge("z", ZCDP(rho="0.4"))
    _sql(accountant, "UPDATE datasets SET spent_zcdp_rho = :v WHERE name = 'z'", v="0.8")
    with pytest.raises(AuditFailed, match=r"dataset 1 \('z'\): its logged charges spend "
                                          r"rho=0\.8 of its cap"):
        accountant.verify()


def test_a_subject_cap_raised_around_a_batch_fails_verify(accountant: Accountant) -> None:
    accountant.create_dataset("s", epsilon=10, subject_epsilon=1)
    accountant.charge_subjects("s", 1, ["alice", "bob"])  # both at their cap
    _sql(accountant, "UPDATE datasets SET subject_epsilon = :c WHERE name = 's'", c="100")
    got = accountant.charge_subjects("s", 5, ["alice", "carol"])
    assert got.accepted == 2
    _sql(accountant, "UPDATE datasets SET subject_epsilon = :c WHERE name = 's'", c="1")
    with pytest.raises(AuditFailed, match=r"dataset 1 \('s'\): subject [0-9a-f]{16}… has "
                                          r"spent ε0=6 \(2 subjects over\), more than its "
                                          r"per-subject cap ε0 ≤ 1"):
        accountant.verify()


def test_honest_ledgers_at_their_caps_verify(accountant: Accountant) -> None:
    accountant.create_dataset("p", epsilon=1, subject_epsilon=1)
    accountant.charge("p", PureDP(eps="0.5"))
    accountant.charge("p", PureDP(eps="0.5"))  # exactly at the cap
    accountant.charge_subjects("p", "0.5", ["a", "b"])
    accountant.charge_subjects("p", "0.5", ["a", "c"])  # a exactly at hers
    accountant.create_dataset("a", approx_epsilon=1, approx_delta="1e-6")
    while True:
        try:
            accountant.charge("a", ZCDP(rho="0.01"))
        except Exception:
            break
    accountant.create_dataset("n", rho=1, allow_nonprivate=True)
    accountant.calibrate("split", {"alpha": 0.1}, dataset="n",
                         scores=np.random.default_rng(0).random(50))
    accountant.verify()


# ---------------------------------------------------------------------- F8: non-private releases
def _split_release(acct: Accountant, dataset: str) -> Any:
    """A genuine split (non-private) release of ``dataset``, which allows them."""
    return acct.calibrate("split", {"alpha": 0.1}, dataset=dataset,
                          scores=np.random.default_rng(1).random(60))


def test_record_release_refuses_a_non_private_release_the_dataset_forbids(
        accountant: Accountant) -> None:
    accountant.create_dataset("open", epsilon=1, allow_nonprivate=True)
    accountant.create_dataset("p", epsilon=1)
    src = _split_release(accountant, "open")
    before = accountant.ledger.head()
    with pytest.raises(BudgetRefused, match="non-private release refused: dataset 'p' does "
                                            "not allow non-private releases"):
        accountant.record_release(
            "p", method=src.method, calibrator_version=src.calibrator_version,
            threshold=src.threshold, params=src.params, shape=src.shape,
            coverage=src.coverage, privacy=src.privacy, diagnostics=src.diagnostics,
            distribution=src.distribution, distribution_version=src.distribution_version)
    assert accountant.ledger.head() == before  # nothing written
    assert [r.id for r in accountant.releases("p")] == []


def test_a_non_private_release_on_a_dataset_that_forbids_them_fails_verify(
        accountant: Accountant) -> None:
    accountant.create_dataset("p", epsilon=1)
    _sql(accountant, "UPDATE datasets SET allow_nonprivate = :t WHERE name = 'p'", t=True)
    rel = _split_release(accountant, "p")
    _sql(accountant, "UPDATE datasets SET allow_nonprivate = :t WHERE name = 'p'", t=False)
    with pytest.raises(AuditFailed, match=rf"release {rel.id} is non-private, but its dataset "
                                          "does not allow non-private releases"):
        accountant.verify()


# ---------------------------------------------------------------------- F1: a lost ledger secret
def _secret_rows(acct: Accountant) -> int:
    with acct.ledger.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM ledger_secret")).scalar_one())


def test_a_lost_secret_is_not_silently_remade_over_charged_subjects(
        accountant: Accountant, ledger_url: str) -> None:
    """The secret deleted (or a ledger restored from a dump without ``ledger_secret``, as the
    README advises for exports): a new one was made on the next charge, every pseudonym
    changed, and alice — at her cap — was charged again."""
    from privcal.storage import Ledger

    accountant.create_dataset("s", epsilon=10, subject_epsilon=1)
    accountant.charge_subjects("s", 1, ["alice", "bob"])  # both at their cap
    _sql(accountant, "DELETE FROM ledger_secret")
    head = accountant.ledger.head()
    other = Accountant(Ledger(ledger_url))  # a process that has not read the secret yet
    with pytest.raises(LedgerError, match=r"has lost the secret of its subject pseudonyms "
                                          r"\(table ledger_secret is empty\) but holds "
                                          r"subjects charged under it \(subject_spend\)"):
        other.charge_subjects("s", "0.5", ["alice", "carol"])
    with pytest.raises(LedgerError, match="lost the secret"):
        other.subject_spend("s", "alice")  # a read neither makes one nor says 0
    assert _secret_rows(accountant) == 0
    assert accountant.ledger.head() == head  # nothing written
    other.ledger.close()


def test_a_secret_of_the_wrong_form_is_one_line(accountant: Accountant,
                                                ledger_url: str) -> None:
    from privcal.storage import Ledger

    accountant.create_dataset("s", epsilon=10, subject_epsilon=1)
    accountant.charge_subjects("s", 1, ["alice"])
    for bad in ("", "00", "zz" * 32):
        _sql(accountant, "UPDATE ledger_secret SET secret = :s", s=bad)
        other = Accountant(Ledger(ledger_url))
        with pytest.raises(LedgerError, match="not 64 hex digits"):
            other.charge_subjects("s", "0.5", ["alice"])
        other.ledger.close()


def test_a_ledger_without_subjects_still_gets_a_secret(accountant: Accountant,
                                                       ledger_url: str) -> None:
    from privcal.storage import Ledger

    accountant.create_dataset("s", epsilon=10, subject_epsilon=1)
    _sql(accountant, "DELETE FROM ledger_secret")
    other = Accountant(Ledger(ledger_url))
    assert other.charge_subjects("s", "0.5", ["alice"]).accepted == 1
    assert _secret_rows(accountant) == 1
    other.ledger.close()


# ---------------------------------------------------------------------- F5: immutable=1 and the WAL
def test_an_immutable_open_beside_a_write_ahead_log_is_refused(tmp_path: Path) -> None:
    """SQLite does not read ``-wal`` under ``immutable=1`` (which privcal advises for a
    read-only mount): the budgets and head of the main file alone were shown as current."""
    from privcal.storage import Ledger

    path = tmp_path / "l.sqlite"
    writer = Accountant(Ledger(f"sqlite:///{path}"))
    writer.create_dataset("p", epsilon=1)
    writer.charge("p", PureDP(eps="0.5"))  # the writer's connection stays open: in the WAL
    assert (tmp_path / "l.sqlite-wal").stat().st_size > 32
    url = f"sqlite:///file:{path}?immutable=1&uri=true"
    reader = Accountant(Ledger(url))
    with pytest.raises(LedgerError, match=r"has a write-ahead log beside it \(l\.sqlite-wal, "
                                          r"\d+ bytes\) whose transactions immutable=1 does "
                                          "not read"):
        reader.budget("p")
    reader.ledger.close()
    ro = Accountant(Ledger(f"sqlite:///file:{path}?mode=ro&uri=true"))
    assert ro.budget("p").spent == {"epsilon": Decimal("0.5")}
    ro.ledger.close()
    writer.ledger.close()  # the last connection checkpoints and removes the WAL
    again = Accountant(Ledger(url))
    assert again.budget("p").spent == {"epsilon": Decimal("0.5")}
    assert str(again.ledger.head()) == str(writer.ledger.head())
    again.ledger.close()


# ------------------------------------------------------ F3: tables missing or unreadable
def test_a_ledger_missing_a_table_is_one_line_and_nothing_is_charged(
        accountant: Accountant, ledger_url: str) -> None:
    """A partial restore (a dump made with ``--exclude-table``) or a dropped table: ``db
    check`` said ok, ``audit verify`` was a driver traceback, and a calibration charged and
    then failed writing its release."""
    from privcal.storage import Ledger

    accountant.create_dataset("z", rho=1)
    accountant.charge("z", ZCDP(rho="0.1"))
    _sql(accountant, "DROP TABLE release_charges")
    other = Ledger(ledger_url)
    with pytest.raises(LedgerError, match=r"at revision \d+ but lacks privcal's table\(s\) "
                                          r"release_charges \(restored from a partial dump"):
        other.check()
    acct = Accountant(other)
    with pytest.raises(LedgerError, match="lacks privcal's table"):
        acct.verify()
    with pytest.raises(LedgerError, match="lacks privcal's table"):
        acct.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.1}, dataset="z",
                       scores=np.random.default_rng(0).random(100))
    with accountant.ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM charges")).scalar_one() == 1
    other.close()


@pytest.mark.parametrize("ledger_url", [pytest.param("postgresql", marks=pytest.mark.postgres)],
                         indirect=True)
def test_a_role_that_may_not_read_the_secret_gets_one_line_from_verify(
        accountant: Accountant, ledger_url: str) -> None:
    """An auditor's role with SELECT on every table but ``ledger_secret`` (least privilege,
    or the README's advice for exports): ``audit verify`` was a psycopg traceback."""
    import uuid

    from sqlalchemy.engine import make_url

    from privcal.storage import Ledger

    accountant.create_dataset("s", epsilon=10, subject_epsilon=1)
    accountant.charge_subjects("s", "0.5", ["alice"])
    role = f"privcal_t_aud_{uuid.uuid4().hex[:12]}"
    schema = accountant.ledger.engine.url.query["options"].split("=", 1)[1]
    _sql(accountant, f'CREATE ROLE "{role}" LOGIN')
    try:
        _sql(accountant, f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        _sql(accountant, f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        _sql(accountant, f'REVOKE SELECT ON ledger_secret FROM "{role}"')
        url = make_url(ledger_url).set(username=role, password=None)
        auditor = Accountant(Ledger(url.render_as_string(hide_password=False)))
        with pytest.raises(LedgerError, match="cannot be read: permission denied for table "
                                              "ledger_secret"):
            auditor.verify()
        auditor.ledger.close()
    finally:
        _sql(accountant, f'DROP OWNED BY "{role}"')
        _sql(accountant, f'DROP ROLE "{role}"')


# ---------------------------------------------------------------------- F2: a head row set back
def test_a_head_row_set_back_makes_writes_one_line(accountant: Accountant,
                                                   ledger_url: str) -> None:
    from privcal.storage import Ledger

    accountant.create_dataset("p", epsilon=1, subject_epsilon=1)
    accountant.charge("p", PureDP(eps="0.1"))
    _sql(accountant, "UPDATE audit_head SET seq = 1")
    other = Accountant(Ledger(ledger_url))
    for write in (lambda: other.charge("p", PureDP(eps="0.1")),
                  lambda: other.charge_subjects("p", "0.5", ["alice"])):
        with pytest.raises(LedgerError, match=r"the audit_head row does not name the log's "
                                              r"last entry .*nothing was written"):
            write()
    with accountant.ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM charges")).scalar_one() == 1
    other.ledger.close()


# ---------------------------------------------------------------------- F4: verify's wording
def test_verify_names_an_inserted_entry_and_a_deleted_link_row(accountant: Accountant) -> None:
    accountant.create_dataset("z", rho=1)
    rel = accountant.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.1}, dataset="z",
                               scores=np.random.default_rng(0).random(100))
    zeros = "0" * 64
    _sql(accountant, "INSERT INTO audit_log (seq, kind, payload, prev_hash, entry_hash) "
         "VALUES (-3, 'dataset', '{}', :z, :z)", z=zeros)
    with pytest.raises(AuditFailed, match=r"audit entry -3: the log has no position -3 .*: a "
                                          r"row inserted outside privcal"):
        accountant.verify()
    _sql(accountant, "DELETE FROM audit_log WHERE seq = -3")
    _sql(accountant, "DELETE FROM release_charges")
    with pytest.raises(AuditFailed, match=rf"release_charges: charge {rel.charge_ids[0]} pays "
                                          rf"for release {rel.id} \(its charge_ids\) but has "
                                          r"no release_charges row \(row deleted"):
        accountant.verify()


# ---------------------------------------------------------------------- F6: concurrent upgrades
def test_an_upgrade_that_found_nothing_to_do_under_the_lock_does_not_say_it_migrated(
        ledger: Any, ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `privcal db upgrade` at once each read the revision before the lock: both said
    "migrated from revision 0010 to 0011" though the second found it done."""
    from click.testing import CliRunner

    from privcal.cli import main
    from privcal.storage import Ledger
    from privcal.storage.schema import LedgerSchema

    ledger.downgrade("0010")
    first, second = Ledger(ledger_url), Ledger(ledger_url)
    first.upgrade()
    assert first.upgraded_from == "0010"
    second.upgrade()
    assert second.upgraded_from == second.head_revision()  # found done under the lock
    first.close()
    second.close()
    # the CLI read "0010" before the other upgrade took the lock
    ledger.downgrade("0010")
    Ledger(ledger_url).upgrade()  # the other `db upgrade`, done first
    real = LedgerSchema.current
    seen: list[int] = []

    def stale_once(self: Any) -> str | None:
        seen.append(1)
        return "0010" if len(seen) == 1 else real(self)

    monkeypatch.setattr(LedgerSchema, "current", stale_once)
    res = CliRunner().invoke(main, ["--db-url", ledger_url, "db", "upgrade"])
    assert res.exit_code == 0, res.output
    assert "migrated" not in res.output and "at revision 0011" in res.output
