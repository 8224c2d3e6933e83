"""The charge hot path: one canonicalisation per entry, the audit append as the last step
of a write, liveness without a pre-ping, and the COPY of subject ids."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from privcal.costs import ZCDP
from privcal.errors import LedgerError
from privcal.storage import audit

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(_json)
def test_fast_canonical_is_rfc8785(obj: Any) -> None:
    try:
        want = rfc8785.dumps(obj).decode("utf-8")
    except Exception:  # rfc8785 refuses it (lone surrogate, unsafe integer): so must we
        with pytest.raises(Exception):  # noqa: B017
            audit.fast_canonical(obj).encode("utf-8")
        return
    assert audit.fast_canonical(obj) == want


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(), _json, max_size=5), st.integers(1, 2**40))
def test_entry_prefix_then_seq_is_the_payload(data: dict[str, Any], seq: int) -> None:
    try:
        want = audit.entry_payload(seq, "charge", data)
    except Exception:
        return
    assert audit.payload_at(audit.entry_prefix("charge", data), seq) == want


def test_fast_canonical_orders_keys_by_utf16_code_units() -> None:
    # U+FF61 sorts before U+1F600 by code point but after it by UTF-16 code unit (RFC 8785 §3.2.3)
    obj = {"\uff61": 1, "\U0001f600": 2}
    assert audit.fast_canonical(obj) == rfc8785.dumps(obj).decode("utf-8")


def test_audit_entries_only_inside_a_write(accountant: Any) -> None:
    with accountant.ledger.engine.connect() as conn, pytest.raises(LedgerError):
        accountant.ledger.append_audit(conn, "charge", {"x": 1})


# PostgreSQL only (the server closes the connection): the backend is pinned, not skipped
@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_a_dead_pooled_connection_is_replaced(accountant: Any, ledger_url: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    accountant.create_dataset("d", rho=1)
    led = accountant.ledger
    with led.engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    import psycopg

    from tests.conftest import _psycopg_dsn

    with psycopg.connect(_psycopg_dsn(ledger_url), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # the write meets the dead connection and runs again on a fresh one
    assert accountant.charge("d", ZCDP(rho="0.1")).charge_id >= 1
    with led.engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with psycopg.connect(_psycopg_dsn(ledger_url), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # a read cannot be re-run: the idle connection is pinged at checkout and replaced
    from privcal.storage import engine as engine_mod

    monkeypatch.setattr(engine_mod, "IDLE_PING_S", -1.0)
    assert accountant.budget("d").charges == 1
    assert led.verify().charges == 1


# PostgreSQL only (SQLite serialises all writers): the backend is pinned, not skipped
@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_a_charge_does_not_wait_for_another_datasets_batch(
    accountant: Any, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a session batch on dataset a is still writing its reports (its charge entry
    already queued), a charge to dataset b commits: the audit head is locked only for the
    final append and commit, not through the batch."""
    import numpy as np

    from privcal.accountant import sessions as S

    accountant.create_dataset("a", epsilon=1, subject_epsilon=10)
    accountant.create_dataset("b", rho=1)
    info = S.open_session(accountant, "ldp-score", dataset="a", alpha=0.1, epsilon=2,
                          rounds=2, group_size=50, lower=0, upper=1)
    inside, release = threading.Event(), threading.Event()
    real = type(accountant.ledger).insert_reports

    def slow_insert(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        inside.set()
        release.wait(30)

    monkeypatch.setattr(type(accountant.ledger), "insert_reports", slow_insert)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(S.submit_reports(
        accountant, info.id, np.arange(20).astype(str), np.ones(20, dtype=int))))
    t.start()
    try:
        assert inside.wait(30)
        done: list[int] = []
        c = threading.Thread(target=lambda: done.append(
            accountant.charge("b", ZCDP(rho="0.1")).charge_id))
        c.start()
        c.join(10)
        assert done, "the charge to dataset b waited for the batch on dataset a"
    finally:
        release.set()
        t.join(30)
    assert out and out[0].accepted == 20
    assert accountant.ledger.verify().charges == 2


@pytest.mark.postgres
def test_subject_ids_with_copy_special_characters(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1, subject_epsilon=2)
    odd = ["tab\there", "back\\slash", "new\nline", "cr\rx", r"\N", "plain"]
    assert accountant.charge_subjects("d", 1, odd).accepted == len(odd)
    for sid in odd:
        assert accountant.subject_spend("d", sid) == 1
    plain = [f"u{i}" for i in range(100)]
    assert accountant.charge_subjects("d", 1, plain).accepted == 100
    assert accountant.subject_spend("d", "u7") == 1
