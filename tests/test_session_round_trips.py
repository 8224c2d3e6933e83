"""A collection session's batch on the driver (issue 11): a pinned number of statements (SQLite)
and round trips (PostgreSQL) whatever the batch's size, the rows stored as SQLAlchemy's types
write them, and concurrent batches to one session numbered without gaps."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select, text

from privcal.accountant import sessions as S
from privcal.storage.sessions import CollectionSession, SessionBatch
from tests.wire import Wire


def _session(accountant: Any, group_size: int = 100_000) -> Any:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=10)
    return S.open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=2,
                          rounds=10, group_size=group_size, lower=0, upper=1)


def test_a_batch_costs_a_pinned_number_of_statements(accountant: Any, tmp_path: Any) -> None:
    """A charged ldp-score batch of new subjects (warm ledger). SQLite runs exactly BEGIN
    IMMEDIATE, the session + dataset rows with the last batch number, the probe, the new
    spend rows, the dataset's charge count, the charge, its members, the reports, the
    session's state, the batch row, the audit head, the two entries, the head UPDATE and
    COMMIT (15; 19 through the ORM). PostgreSQL: 10 round trips — the dataset lock (with
    BEGIN), the session lock, the probe, the spend COPY, the charge (count and members as
    CTEs), the reports COPY, the state with the batch row, the audit append (two), COMMIT
    (17 through the ORM). The same for 1, 200 and 2 000 reports: a fixed cost per batch. A
    change that adds a statement or a round trip to every batch must change this test."""
    info = _session(accountant)
    # warm: subject key, pool, schema; psycopg prepares a statement on its 5th execution
    # (one more round trip, once): after 6 batches every statement has been prepared
    for k in range(6):
        S.submit_reports(accountant, info.id, [f"w{k}-0", f"w{k}-1"], [0, 1], [0, 0])
    pos = 0
    for size in (1, 200, 2000):
        ids = [f"u{pos + i}" for i in range(size)]
        pos += size
        wire = Wire(accountant.ledger, tmp_path)
        r = S.submit_reports(accountant, info.id, ids, np.arange(size) % 2,
                             np.zeros(size, dtype=int))
        n = wire.count()
        assert r.accepted == size and r.charge_id is not None
        if accountant.ledger.backend == "sqlite":
            assert wire.sql[0] == "BEGIN IMMEDIATE" and wire.sql[-1] == "COMMIT", wire.sql
            assert n == 15, wire.sql
        else:
            assert n == 10, wire.trace.read_text()
    assert accountant.ledger.verify().charges == 9


def test_subjects_already_charged_cost_the_same(accountant: Any, tmp_path: Any) -> None:
    """Subjects with a spend row (a second session on the dataset) are raised by one UPDATE
    instead of inserted: the same count (the UPDATE takes the INSERT's place)."""
    first = _session(accountant)
    ids = [f"u{i}" for i in range(300)]
    S.submit_reports(accountant, first.id, ids, np.arange(300) % 2, np.zeros(300, dtype=int))
    second = S.open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=2,
                            rounds=10, group_size=1000, lower=0, upper=1)
    for k in range(6):  # warm (see above): subjects with a spend row, raised
        S.submit_reports(accountant, second.id, ids[200 + 10 * k:210 + 10 * k],
                         np.arange(10) % 2, np.zeros(10, dtype=int))
    wire = Wire(accountant.ledger, tmp_path)
    r = S.submit_reports(accountant, second.id, ids[:200], np.arange(200) % 2,
                         np.zeros(200, dtype=int))
    n = wire.count()
    assert r.accepted == 200
    assert n == (15 if accountant.ledger.backend == "sqlite" else 10)
    assert accountant.subject_spend("d", "u3") == 4  # ε0 = 2 twice
    assert accountant.ledger.verify().charges == 8


def test_state_and_result_are_stored_as_sqlalchemy_writes_them(accountant: Any) -> None:
    """The JSON the driver path writes is SQLAlchemy's JSON serialisation (json.dumps), byte
    for byte: the session's state and the batch's result read back as stored text."""
    info = _session(accountant)
    r = S.submit_reports(accountant, info.id, ["a", "b", "c"], [1, 0, 1], [0, 0, 0],
                         idempotency_key="k1")
    cast = "::text" if accountant.ledger.backend == "postgresql" else ""
    with accountant.ledger.read() as s:
        state_text = s.execute(text(f"SELECT state{cast} FROM collection_sessions "
                                    "WHERE id = :i"), {"i": info.id}).scalar_one()
        result_text = s.execute(text(f"SELECT result{cast} FROM session_batches "
                                     "WHERE session_id = :i"), {"i": info.id}).scalar_one()
        row = s.scalars(select(CollectionSession).where(CollectionSession.id == info.id)).one()
        batch = s.scalars(select(SessionBatch).where(SessionBatch.session_id == info.id)).one()
    assert state_text == json.dumps(row.state)
    assert result_text == json.dumps(batch.result)
    assert batch.batch == 1 and batch.idempotency_key == "k1"
    assert batch.result["accepted"] == 3 and row.state["total"] == 3
    # (SQLite's DateTime reads back naive, as before: the instant is what is compared)
    assert r.session.updated_at.replace(tzinfo=None) == row.updated_at.replace(tzinfo=None)
    again = S.submit_reports(accountant, info.id, ["a", "b", "c"], [1, 0, 1], [0, 0, 0],
                             idempotency_key="k1")
    assert again.replayed and again.accepted == 3 and again.charge_id == r.charge_id


def test_an_unknown_session_is_not_found_and_changes_nothing(accountant: Any) -> None:
    from privcal.errors import NotFound

    _session(accountant)
    head = accountant.ledger.head()
    with pytest.raises(NotFound, match="unknown session 99"):
        S.submit_reports(accountant, 99, ["a"], [1])
    assert accountant.ledger.head() == head


def test_concurrent_batches_to_one_session_are_numbered_without_gaps(accountant: Any) -> None:
    """Batches submitted at once to one session wait for each other's locks; each sees the
    batches committed before it (its number is the last + 1), none is lost or refused."""
    info = _session(accountant, group_size=1000)
    errors: list[BaseException] = []

    def submit(k: int) -> None:
        try:
            for j in range(3):
                ids = [f"t{k}-{j}-{i}" for i in range(20)]
                r = S.submit_reports(accountant, info.id, ids, np.arange(20) % 2, [0] * 20)
                assert r.accepted == 20, r
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    with accountant.ledger.read() as s:
        numbers = list(s.scalars(select(SessionBatch.batch)
                                 .where(SessionBatch.session_id == info.id)
                                 .order_by(SessionBatch.batch)))
    assert numbers == list(range(1, 13))
    assert S.session_status(accountant, info.id).total_reports == 240
    assert accountant.ledger.verify().charges == 12
