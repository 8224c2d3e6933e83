"""Red team 25, ledger: the SQL ledger against its environment and its signing API.

F1: a kept connection of the charge's hot path that the server ended while it was kept
(``idle_session_timeout``, an administrator) was used as is: the optimistic charge went into a
dead socket and an unkeyed charge failed with "may or may not have been recorded" (it was not).

F2: a ``lock_timeout`` or ``statement_timeout`` (database, role or URL) shorter than a wait for
an idempotency key's lock or the audit sequencer's lock was a driver traceback.

F3: ``Ledger.sign_head`` signed a log overspent past an (ε, δ) cap, and the accountant's
``sign_head`` checked (ε, δ) caps in a later read than the one whose head it signed.

F4/F5: SQLite URIs privcal cannot keep a budget in — in memory (a forked child spent the
parent's budget again on its copy) or in shared-cache mode (table locks: raw "database table is
locked" tracebacks) — are refused at open.
"""

from __future__ import annotations

import sqlite3
import time
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from sqlalchemy import text

from privcal.accountant import Accountant, verification
from privcal.costs import ZCDP, ApproxDP
from privcal.errors import AuditFailed, InvalidInput, LedgerError
from privcal.storage import Ledger, signing
from privcal.storage.audit_queue import SEQUENCER_LOCK
from privcal.storage.engine import spoke_while_idle

PG_ONLY = pytest.mark.parametrize(
    "ledger_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)


def _with_options(url: str, setting: str) -> str:
    """``url`` (a PostgreSQL test URL with ``options=-csearch_path=…``) with one more ``-c``
    server setting, as a database or role default would give it."""
    options = parse_qs(urlsplit(url).query)["options"][0]
    base = url.split("options=", 1)[0]
    return f"{base}options={quote(f'{options} -c{setting}')}"


# ------------------------------------------------------------------ F1
@PG_ONLY
def test_a_kept_connection_the_server_ended_is_not_used_for_a_charge(ledger_url: str,
                                                                     ledger: Ledger) -> None:
    a = Accountant(ledger)
    a.create_dataset("d", rho=10)
    for _ in range(3):  # the optimistic path's snapshot and a kept connection
        a.charge("d", ZCDP(Decimal("0.001")))
    kept = a.ledger.held_connections()
    assert kept
    drv = kept[0].connection.driver_connection
    with Ledger(ledger_url) as admin, admin.engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": drv.info.backend_pid})
    deadline = time.monotonic() + 10
    while not spoke_while_idle(drv) and time.monotonic() < deadline:
        time.sleep(0.02)  # the terminated backend's goodbye reaches the socket
    with Accountant(ledger_url) as other:  # the dataset changes meanwhile
        other.charge("d", ZCDP(Decimal("0.001")))
    got = a.charge("d", ZCDP(Decimal("0.001")))  # unkeyed: was "may or may not have been"
    assert not got.replayed
    assert a.budget("d").spent["rho"] == Decimal("0.005")
    a.verify()


# ------------------------------------------------------------------ F2
@PG_ONLY
@pytest.mark.parametrize("setting", ["lock_timeout=100", "statement_timeout=300"])
def test_a_key_lock_wait_past_a_timeout_is_one_line(ledger_url: str, ledger: Ledger,
                                                    setting: str) -> None:
    holder = Ledger(ledger_url)
    timed = Ledger(_with_options(ledger_url, setting))
    try:
        with holder.key_lock("d", "K"):
            with pytest.raises(LedgerError, match="held its lock past the ledger's lock_timeout"):
                with timed.key_lock("d", "K"):
                    pass  # pragma: no cover - the lock is held
        with timed.key_lock("d", "K"):  # free again: taken at once
            pass
    finally:
        holder.close()
        timed.close()


@PG_ONLY
def test_a_sequencer_lock_wait_past_a_timeout_is_one_line(ledger_url: str,
                                                          ledger: Ledger) -> None:
    Accountant(ledger).create_dataset("d", rho=1)
    timed = Ledger(_with_options(ledger_url, "statement_timeout=300"))
    holder = Ledger(ledger_url)
    try:
        with holder.engine.connect() as conn, conn.begin():
            conn.execute(text(f"SELECT pg_advisory_xact_lock({SEQUENCER_LOCK})"))
            with pytest.raises(LedgerError, match="sequencer lock stayed held"):
                timed.head()
            assert Accountant(timed).verify().entries == 1  # verify reads the chain as it is
        assert timed.head().seq == 1
    finally:
        holder.close()
        timed.close()


# ------------------------------------------------------------------ F3
def _overspent_approx(acct: Accountant, path: Path) -> None:
    """An (ε, δ) dataset charged past its cap by a cap raised around a charge and put back
    (every row equals its entry again)."""
    acct.create_dataset("ad", approx_epsilon=1, approx_delta=Decimal("1e-6"))
    acct.charge("ad", ApproxDP(Decimal("0.9"), Decimal("1e-7")))
    _set_cap(path, "5")
    acct.ledger.close()
    acct.charge("ad", ApproxDP(Decimal("0.9"), Decimal("1e-7")))  # under the raised cap
    acct.ledger.close()
    _set_cap(path, "1")


def _set_cap(path: Path, cap: str) -> None:
    with sqlite3.connect(path) as c:
        c.execute("UPDATE datasets SET cap_epsilon = ? WHERE name = 'ad'", (cap,))


def test_ledger_sign_head_does_not_sign_an_unchecked_approx_cap(tmp_path: Path) -> None:
    db = tmp_path / "l.sqlite"
    acct = Accountant(f"sqlite:///{db}")
    _overspent_approx(acct, db)
    priv, _, _ = signing.generate_keypair(tmp_path / "k")
    with pytest.raises(InvalidInput, match=r"\(ε, δ\) cap, whose Rényi filter the storage"):
        acct.ledger.sign_head(priv)
    with pytest.raises(AuditFailed, match="more than the cap's filter allows"):
        acct.ledger.sign_head(priv, cap_check=verification.check_cap)
    with pytest.raises(AuditFailed, match="more than the cap's filter allows"):
        verification.sign_head(acct, priv)
    acct.close()


def test_a_healthy_approx_ledger_is_signed_with_the_accountant_s_check(tmp_path: Path) -> None:
    acct = Accountant(f"sqlite:///{tmp_path / 'l.sqlite'}")
    acct.create_dataset("ad", approx_epsilon=1, approx_delta=Decimal("1e-6"))
    acct.charge("ad", ApproxDP(Decimal("0.5"), Decimal("1e-7")))
    priv, pub, _ = signing.generate_keypair(tmp_path / "k")
    for signed in (verification.sign_head(acct, priv),
                   acct.ledger.sign_head(priv, cap_check=verification.check_cap)):
        assert acct.verify(signed_head=signed, trusted_key=pub).signed_through == 2
    acct.close()


def test_the_accountant_checks_caps_in_the_snapshot_it_signs(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    """A writer raises the cap right after the log's verification read and puts it back
    after: the (ε, δ) check ran in a later read, which saw the raised cap, and the
    overspent head was signed."""
    db = tmp_path / "l.sqlite"
    acct = Accountant(f"sqlite:///{db}")
    _overspent_approx(acct, db)
    priv, _, _ = signing.generate_keypair(tmp_path / "k")
    verify = acct.ledger.verify

    def verify_then_raise_the_cap(*args: Any, **kwargs: Any) -> Any:
        try:
            return verify(*args, **kwargs)
        finally:
            _set_cap(db, "5")

    monkeypatch.setattr(acct.ledger, "verify", verify_then_raise_the_cap)
    with pytest.raises(AuditFailed, match="more than the cap's filter allows"):
        verification.sign_head(acct, priv)
    acct.close()


# ------------------------------------------------------------------ F4, F5
@pytest.mark.parametrize("url", [
    "sqlite:///file:rt25mem?mode=memory&cache=shared&uri=true",
    "sqlite:///file:rt25mem?mode=memory&uri=true",
    "sqlite:///file::memory:?uri=true",
    "sqlite:///file:?uri=true",
])
def test_a_sqlite_uri_in_memory_is_refused(url: str) -> None:
    with pytest.raises(LedgerError, match=r"in memory or a temporary one: .* use sqlite://"):
        Ledger(url)


def test_sqlite_shared_cache_is_refused_and_other_uris_still_open(tmp_path: Path) -> None:
    db = tmp_path / "l.sqlite"
    with pytest.raises(LedgerError, match="shared-cache mode"):
        Ledger(f"sqlite:///file:{db}?cache=shared&uri=true")
    Accountant(f"sqlite:///{db}").create_dataset("d", rho=1)
    with Ledger(f"sqlite:///file:{db}?mode=ro&uri=true") as ro:
        assert ro.head().seq == 1


# ------------------------------------------------------------------ F6
@PG_ONLY
def test_verify_outlasts_the_server_s_idle_in_transaction_timeout(ledger_url: str,
                                                                  ledger: Ledger) -> None:
    """``audit verify`` hashes the log between its statements; an
    ``idle_in_transaction_session_timeout`` shorter than that (here 0.2 s against a slow
    hash, simulated by the progress wrapper) ended its read every time ("retry")."""
    acct = Accountant(ledger)
    acct.create_dataset("d", rho=1)
    acct.charge("d", ZCDP(Decimal("0.1")))

    def slow(entries: Any, _what: str, _total: int) -> Any:
        for e in entries:
            time.sleep(0.5)
            yield e

    with Accountant(_with_options(ledger_url, "idle_in_transaction_session_timeout=200")) as a:
        assert a.verify(progress=slow).entries == 2


# ------------------------------------------------------------------ F7
def test_a_pre_grid_dataset_charged_past_its_cap_since_is_an_audit_failure(
        tmp_path: Path) -> None:
    """An (ε, δ) dataset as privcal wrote it before migration 0004 (no Rényi grid in row or
    log) is charged by today's privcal under the filter on the frozen grid; a cap raised
    around such charges and put back verified ok ("charged before 0004: no guarantee")."""
    from privcal.storage import audit
    from privcal.storage.models import Dataset

    db = tmp_path / "l.sqlite"
    acct = Accountant(f"sqlite:///{db}")

    def legacy(s: Any) -> None:
        zero = Decimal(0)
        ds = Dataset(name="ad", description="", notion="approx", cap_epsilon=Decimal(1),
                     cap_rho=None, cap_delta=Decimal("1e-6"), reporting_delta=Decimal("1e-6"),
                     subject_epsilon=None, allow_nonprivate=False, created_at=audit.now(),
                     spent_pure_eps=zero, spent_pure_rho=zero, spent_zcdp_rho=zero,
                     spent_approx_eps=zero, spent_approx_delta=zero, charge_count=0)
        s.add(ds)
        s.flush()
        acct.ledger.append_audit(s, "dataset", audit.dataset_doc(ds))

    acct.ledger.write(legacy)
    acct.charge("ad", ApproxDP(Decimal("0.5"), Decimal("1e-7")))
    acct.verify()  # within the filter
    _set_cap(db, "5")
    acct.ledger.close()
    acct.charge("ad", ApproxDP(Decimal("0.9"), Decimal("1e-7")))
    acct.ledger.close()
    _set_cap(db, "1")
    with pytest.raises(AuditFailed, match="more than the cap's filter allows"):
        acct.verify()
    priv, _, _ = signing.generate_keypair(tmp_path / "k")
    with pytest.raises(AuditFailed, match="more than the cap's filter allows"):
        verification.sign_head(acct, priv)
    with pytest.raises(InvalidInput, match="cannot check"):
        acct.ledger.sign_head(priv)
    acct.close()


# ------------------------------------------------------------------ F8
@pytest.mark.parametrize("args", ["nolock=1", "nolock=true", "vfs=unix-none"])
def test_a_sqlite_uri_without_file_locking_is_refused(tmp_path: Path, args: str) -> None:
    """``nolock=1``: six processes were told 61 charges of ε 0.1 were recorded on a cap of 5;
    the file held 25 of them."""
    with pytest.raises(LedgerError, match="turns SQLite's file locking off"):
        Ledger(f"sqlite:///file:{tmp_path / 'l.sqlite'}?{args}&uri=true")
    with Ledger(f"sqlite:///file:{tmp_path / 'l.sqlite'}?nolock=0&uri=true") as ok:
        assert ok.head().seq == 0
