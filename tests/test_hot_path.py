"""The charge hot path: one canonicalisation per entry, the audit append as the last step
of a write, liveness without a pre-ping, and the COPY of subject ids."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from privcal.costs import ZCDP
from privcal.errors import InvalidInput, LedgerError
from privcal.storage import audit, charge_entry
from tests.wire import Wire

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
    already collected), a charge to dataset b commits: the audit sequencer's lock is taken
    only by the final append, not through the batch (the batch's reports are written by
    ``insert_batch_reports``, which the hook below holds open)."""
    import numpy as np

    from privcal.accountant import sessions as S

    accountant.create_dataset("a", epsilon=1, subject_epsilon=10)
    accountant.create_dataset("b", rho=1)
    info = S.open_session(accountant, "ldp-score", dataset="a", alpha=0.1, epsilon=2,
                          rounds=2, group_size=50, lower=0, upper=1)
    inside, release = threading.Event(), threading.Event()
    real = type(accountant.ledger).insert_batch_reports

    def slow_insert(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        inside.set()
        release.wait(30)

    monkeypatch.setattr(type(accountant.ledger), "insert_batch_reports", slow_insert)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(S.submit_reports(
        accountant, info.id, np.arange(20).astype(str), np.ones(20, dtype=int),
        np.zeros(20, dtype=int))))
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
    # a tab, a line feed or a carriage return in an id is refused since red team 6 (an
    # invisible character: "new\nline" read as two ids), and nothing is charged
    for bad in ("tab\there", "new\nline", "cr\rx"):
        with pytest.raises(InvalidInput, match="invisible or blank"):
            accountant.charge_subjects("d", 1, [bad, "plain"])
    assert accountant.subject_spend("d", "plain") == 0
    odd = ["back\\slash", r"\N", "\\.", 'quo"te', "com,ma", "plain"]
    assert accountant.charge_subjects("d", 1, odd).accepted == len(odd)
    for sid in odd:
        assert accountant.subject_spend("d", sid) == 1
    plain = [f"u{i}" for i in range(100)]
    assert accountant.charge_subjects("d", 1, plain).accepted == 100
    assert accountant.subject_spend("d", "u7") == 1


# ------------------------------------------------------------------ the charge's own cost
def test_a_charge_costs_a_pinned_number_of_statements(accountant: Any, tmp_path: Any) -> None:
    """One central charge (warm ledger, no idempotency key): SQLite runs exactly BEGIN
    IMMEDIATE, the dataset row with the audit head, the totals UPDATE, the charge INSERT, the
    entry, the head UPDATE and COMMIT; PostgreSQL needs 3 round trips — BEGIN with the
    dataset's row lock (one simple-protocol message), the charge INSERT with the totals
    UPDATE and the audit append (one statement), COMMIT (issue 11; raw: 4) — and a warm
    charge, whose process knows the dataset row as its last charge left it, needs one: the
    optimistic charge (storage/optimistic.py), also with a new idempotency key. A change that
    adds a statement or a round trip to every charge must change this test."""
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho="0.01"))  # warm: schema checked, pool filled
    wire = Wire(accountant.ledger, tmp_path)
    accountant.charge("d", ZCDP(rho="0.01"))
    n = wire.count()
    if accountant.ledger.backend == "sqlite":
        assert wire.sql[0] == "BEGIN IMMEDIATE" and wire.sql[-1] == "COMMIT", wire.sql
        assert n == 7, wire.sql
    else:  # the optimistic charge: one message, the statement and its COMMIT
        trace = wire.trace.read_text()
        assert n == 1, trace
        # (this connection's first: which server process runs it, and the PREPAREs of its
        # statements, in the same message)
        assert _queries(trace)[0].startswith(
            '"SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid(); '
            'PREPARE privcal_cas_'), trace
        # without a snapshot (another process's first charge): the locked path, 3 round trips
        accountant.ledger.forget_dataset("d")
        wire = Wire(accountant.ledger, tmp_path)
        accountant.charge("d", ZCDP(rho="0.01"))
        n = wire.count()
        trace = wire.trace.read_text()
        assert n == 3, trace
        queries = _queries(trace)
        assert queries[0].startswith('"BEGIN; SELECT') and queries[-1] == '"COMMIT"', queries
        # and a keyed charge with a new key is one round trip too
        wire = Wire(accountant.ledger, tmp_path)
        accountant.charge("d", ZCDP(rho="0.01"), idempotency_key="k1")
        assert wire.count() == 1, wire.trace.read_text()
        assert _queries(wire.trace.read_text())[0].startswith(
            '"SET LOCAL plan_cache_mode = force_generic_plan; EXECUTE privcal_cas_')
    n_charges = 2 if accountant.ledger.backend == "sqlite" else 4
    assert accountant.budget("d").charges == n_charges
    assert accountant.ledger.verify().charges == n_charges


def _queries(trace: str) -> list[str]:
    """The simple-protocol queries in a libpq protocol trace."""
    return [ln.split("\t", 3)[3].strip() for ln in trace.splitlines()
            if ln.split("\t")[:1] == ["F"] and ln.split("\t")[2] == "Query"]


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_a_pg_write_returns_its_connection_as_it_took_it(accountant: Any) -> None:
    """The BEGIN rides with a write's first statement, the driver connection in autocommit
    mode meanwhile (storage/statements.py): every connection goes back to the pool out of
    autocommit and with no transaction open — after a charge, a refusal, an unknown
    dataset, a failing audit append — and a refused charge writes nothing."""
    from psycopg.pq import TransactionStatus
    from sqlalchemy import event

    from privcal.errors import BudgetRefused, NotFound

    led = accountant.ledger
    accountant.create_dataset("d", rho=1)
    states: list[tuple[bool, Any]] = []

    def checkin(dbapi_conn: Any, _rec: Any) -> None:
        states.append((dbapi_conn.autocommit, dbapi_conn.info.transaction_status))

    event.listen(led.engine, "checkin", checkin)
    first = accountant.charge("d", ZCDP(rho="0.25"))
    with pytest.raises(BudgetRefused) as refused:
        accountant.charge("d", ZCDP(rho="0.9"))
    assert "remaining" in str(refused.value) or "exceed" in str(refused.value)
    with pytest.raises(NotFound, match="unknown dataset"):
        accountant.charge("nope", ZCDP(rho="0.1"))
    with led.engine.begin() as conn:
        head = conn.execute(text("SELECT seq, entry_hash FROM audit_head")).one()
        conn.execute(text("DELETE FROM audit_head"))
    with pytest.raises(LedgerError, match="audit_head row is missing"):
        accountant.charge("d", ZCDP(rho="0.1"))
    with led.engine.begin() as conn:
        conn.execute(text("INSERT INTO audit_head (id, seq, entry_hash) VALUES (1, :s, :h)"),
                     {"s": head[0], "h": head[1]})
    second = accountant.charge("d", ZCDP(rho="0.25"))
    event.remove(led.engine, "checkin", checkin)
    assert len(states) >= 5
    assert all(s == (False, TransactionStatus.IDLE) for s in states), states
    assert second.charge_id > first.charge_id
    assert accountant.budget("d").charges == 2  # the refusal and the failed append wrote nothing
    rep = led.verify()
    assert rep.charges == 2 and rep.entries == 3  # the dataset and two charges


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_a_core_statement_first_still_runs_in_the_write(accountant: Any) -> None:
    """A write whose first statement goes through SQLAlchemy (not the hot path's driver
    statements) sends the deferred BEGIN alone first (the engine's begin hook): a failure
    after it rolls it back."""
    led = accountant.ledger
    accountant.create_dataset("d", rho=1)

    def fn(conn: Any) -> None:
        conn.execute(text("UPDATE datasets SET description = 'changed' WHERE name = 'd'"))
        raise RuntimeError("after the update")

    with pytest.raises(RuntimeError, match="after the update"):
        led.write_core(fn)
    with led.engine.connect() as conn:
        assert conn.execute(text("SELECT description FROM datasets")).scalar_one() == ""
        assert conn.connection.driver_connection.autocommit is False

    def ok(conn: Any) -> None:
        conn.execute(text("UPDATE datasets SET description = 'changed' WHERE name = 'd'"))

    led.write_core(ok)
    with led.engine.connect() as conn:
        assert conn.execute(text("SELECT description FROM datasets")).scalar_one() == "changed"


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_the_server_writes_the_charge_id_into_the_entry(accountant: Any) -> None:
    """A charge's entry on PostgreSQL gets its id from the server (one statement,
    storage/charges.py ``record_charge``): each stored payload is the canonical document of
    its stored row — for ids of several digits, odd text, with and without a key."""
    led = accountant.ledger
    accountant.create_dataset("d", rho=100)
    with led.engine.begin() as conn:  # ids of several digits
        conn.execute(text("SELECT setval(pg_get_serial_sequence('charges', 'id'), 98)"))
    receipts = [
        accountant.charge("d", ZCDP(rho="0.001")),
        accountant.charge("d", ZCDP(rho="0.001"), purpose='"quoted" \\ ü 😀 \n',
                          requester="r\u2028\ufeff"),  # (controls: refused, red team 22)
        accountant.charge("d", ZCDP(rho="0.001"), idempotency_key="k-1"),
    ]
    assert [r.charge_id for r in receipts] == [99, 100, 101]
    with led.engine.connect() as conn:
        rows = conn.execute(text("SELECT id FROM charges ORDER BY id")).scalars().all()
        payloads = conn.execute(text("SELECT payload FROM audit_log WHERE kind = 'charge' "
                                     "ORDER BY seq")).scalars().all()
    assert rows == [99, 100, 101]
    from sqlalchemy.orm import Session

    from privcal.storage.models import Charge

    with Session(led.engine) as s:
        for seq_payload, cid in zip(payloads, rows, strict=True):
            c = s.get(Charge, cid)
            doc = audit.charge_doc(c, "d")
            seq = int(seq_payload.rsplit(":", 1)[1].rstrip("}"))
            assert seq_payload == audit.entry_payload(seq, "charge", doc)
    assert led.verify().charges == 3


def test_a_charge_receipt_is_what_validation_gives(accountant: Any) -> None:
    """The receipt built without a second validation equals the validated one, field by
    field and type by type (aware UTC time, exact decimals)."""
    from privcal.accountant.results import ChargeReceipt
    from privcal.costs import ApproxDP, PureDP

    accountant.create_dataset("z", rho=1)
    accountant.create_dataset("p", epsilon=1)
    accountant.create_dataset("a", approx_epsilon=1, approx_delta="1e-6")
    for ds, cost in (("z", ZCDP(rho="0.0100")), ("p", PureDP(eps=0.25)),
                     ("a", ApproxDP(eps="0.5", delta="1e-7")), ("a", ZCDP(rho="0.001"))):
        r = accountant.charge(ds, cost, purpose="π ü", requester="r", idempotency_key=None)
        again = ChargeReceipt.model_validate(r.model_dump())
        assert again == r
        assert {k: type(v) for k, v in dict(again).items()} == \
            {k: type(v) for k, v in dict(r).items()}
        assert r.created_at.tzinfo is not None and r.created_at.utcoffset().total_seconds() == 0
        assert r.remaining == accountant.budget(ds).remaining


_decimal = st.one_of(
    st.none(),
    st.decimals(allow_nan=False, allow_infinity=False, min_value=-10**30, max_value=10**30),
    st.decimals(allow_nan=False, allow_infinity=False, places=30, min_value=0, max_value=1),
    st.sampled_from([Decimal("-0"), Decimal("0E-30"), Decimal("1E+14"), Decimal("1E-30"),
                     Decimal("123.4560000")]),
)
_text = st.one_of(st.none(), st.text(), st.text(st.characters(codec="utf-8")),
                  st.sampled_from(["", "\x00\x1f\x7f\u2028\u2029\ufeff", '"\\/', "π😀", "\ud800"]))


def _columns(c: Any) -> dict[str, Any]:
    """A charge row's columns but ``id``, as the hot path inserts them."""
    return {k: v for k, v in vars(c).items() if k != "id"}


@settings(max_examples=300, deadline=None)
@given(
    cid=st.integers(1, 2**53 - 1), dsid=st.integers(1, 2**31), name=st.text(),
    scope=st.sampled_from(["dataset", "subjects"]),
    notion=st.sampled_from(["pure", "zcdp", "approx", "local"]),
    eps=_decimal, delta=_decimal, rho=_decimal, eps0=_decimal,
    acc_n=st.one_of(st.none(), st.integers(0, 2**53)),
    rej_n=st.one_of(st.none(), st.integers(0, 10)),
    purpose=_text, requester=_text, key=_text,
    when=st.datetimes(timezones=st.just(__import__("datetime").UTC)),
    digest=st.one_of(st.none(), st.text("0123456789abcdef", min_size=64, max_size=64)),
    members=st.one_of(st.none(), st.text("0123456789abcdef", min_size=64, max_size=64)),
    floats=st.one_of(st.none(), st.sampled_from([-0.0, 5e-324, 1.7976931348623157e308, 0.1])),
)
def test_the_charge_entry_is_rfc8785(cid: int, dsid: int, name: str, scope: str, notion: str,
                                     eps: Any, delta: Any, rho: Any, eps0: Any, acc_n: Any,
                                     rej_n: Any, purpose: Any, requester: Any, key: Any,
                                     when: Any, digest: Any, members: Any, floats: Any) -> None:
    """The charge document and its entry prefix, written directly on the hot path
    (audit.charge_doc, audit._flat_prefix, charge_entry.charge_prefix), are byte for byte RFC 8785
    of the generic document (jsonable + rfc8785.dumps) — unicode names, control characters,
    huge and tiny decimals, -0, floats (-0.0, subnormal, the largest) — or refused alike (a
    lone surrogate)."""
    from types import SimpleNamespace

    c = SimpleNamespace(
        id=cid, dataset_id=dsid, scope=scope, notion=notion,
        epsilon=floats if floats is not None else eps, delta=delta, rho=rho, eps0=eps0,
        subjects_accepted=acc_n, subjects_rejected=rej_n, purpose=purpose,
        requester=requester, idempotency_key=key, created_at=when,
        request_digest=digest, members_digest=members)
    generic = {k: v for k, v in (("request_digest", digest), ("members_digest", members))
               if v is not None}
    generic.update({
        "charge_id": cid, "dataset_id": dsid, "dataset": name, "scope": scope,
        "notion": notion, "epsilon": c.epsilon, "delta": delta, "rho": rho, "eps0": eps0,
        "subjects_accepted": acc_n, "subjects_rejected": rej_n, "purpose": purpose,
        "requester": requester, "idempotency_key": key,
        "created_at": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")})
    doc = audit.charge_doc(c, name)  # type: ignore[arg-type]
    assert doc == audit.jsonable(generic)
    try:
        want = rfc8785.dumps(audit.jsonable({"seq": 0, "kind": "charge", "data": generic}))
    except Exception:  # rfc8785 refuses it (a lone surrogate): so must the hot path
        with pytest.raises(Exception):  # noqa: B017
            audit.entry_prefix("charge", doc).encode("utf-8")
        with pytest.raises(Exception):  # noqa: B017
            charge_entry.charge_prefix(cid, _columns(c), name).encode("utf-8")
        return
    prefix = audit.entry_prefix("charge", doc)
    assert (prefix + "0}").encode("utf-8") == want
    # the hot path's own writer, straight from the row (no document dict)
    assert charge_entry.charge_prefix(cid, _columns(c), name) == prefix
    assert audit.payload_at(prefix, cid) == audit.entry_payload(cid, "charge", doc)


@settings(max_examples=200, deadline=None)
@given(st.decimals(allow_nan=False, allow_infinity=False, min_value=Decimal("1e-20"),
                   max_value=Decimal("1e14")),
       st.sampled_from(["pure", "zcdp"]))
def test_a_normalized_cost_is_returned_as_is(amount: Decimal, kind: str) -> None:
    """normalize_cost hands back a cost already in stored form unchanged, and otherwise
    the rounded-up one: either way it equals the freshly validated normalized cost, and
    cost_json equals its model_dump form."""
    from privcal.accountant.normalize import cost_json, normalize_cost
    from privcal.accountant.privacy import dstr
    from privcal.costs import PureDP

    make = PureDP if kind == "pure" else ZCDP
    field = "eps" if kind == "pure" else "rho"
    cost = make(**{field: amount})
    got = normalize_cost(cost)
    want = make(**{field: getattr(normalize_cost(make(**{field: amount})), field)})
    up = amount.quantize(Decimal("1e-12"), rounding="ROUND_CEILING").normalize()
    assert getattr(got, field).as_tuple() == up.as_tuple()
    assert got == want and (got is cost) == (amount.as_tuple() == up.as_tuple())
    assert cost_json(got) == {k: dstr(v) if isinstance(v, Decimal) else v
                              for k, v in got.model_dump(mode="python").items()}


# ------------------------------------------------------------------ the hot path's codec
def _hot_row(led: Any, name: str) -> Any:
    """The dataset row as the charge's hot path reads it (Codec.load of the locked row)."""
    return led.write_core(lambda conn: led.dataset_row(conn, name))


def _orm_row(led: Any, name: str) -> dict[str, Any]:
    """The dataset row as the ORM reads it, column → value."""
    with led.read() as s:
        ds = led.get_dataset(s, name)
        return {c: getattr(ds, c) for c in led.hot_sql.dataset.names}


def test_a_dataset_row_changed_between_charges_is_seen(accountant: Any) -> None:
    """The hot path's dataset row reuses the last row's parsed values only for columns whose
    raw value is unchanged (statements.Codec.load): an administrator's UPDATE of the row
    between two charges — its cap, its totals, its time, its description, its Rényi orders —
    is seen by the next charge, and the row equals the ORM's column by column (fails if a
    parsed value were served from a cache keyed on anything but the raw values)."""
    led = accountant.ledger
    accountant.create_dataset("d", rho=10)
    accountant.create_dataset("a", approx_epsilon=10, approx_delta="1e-6",
                              renyi_orders=["2", "3.5"])
    accountant.charge("d", ZCDP(rho="1"))
    accountant.charge("a", ZCDP(rho="0.001"))
    with led.engine.begin() as conn:
        conn.execute(text("UPDATE datasets SET cap_rho = '5', spent_zcdp_rho = '2', "
                          "description = 'changed', created_at = '2001-02-03 04:05:06.000007' "
                          "WHERE name = 'd'"))
    r = accountant.charge("d", ZCDP(rho="1"))
    assert r.remaining == {"rho": Decimal(2)}  # 5 - (2 + 1), not 10 - 2
    row = _hot_row(led, "d")
    assert row._asdict() == _orm_row(led, "d")
    assert row.description == "changed" and row.created_at.year == 2001
    assert row.spent_zcdp_rho == Decimal(3) and row.cap_rho == Decimal(5)
    # a row of another dataset between them, then the first again: all of it re-read
    assert _hot_row(led, "a")._asdict() == _orm_row(led, "a")
    with led.engine.begin() as conn:
        conn.execute(text("UPDATE datasets SET renyi_orders = '[\"2\", \"4\"]' "
                          "WHERE name = 'a'"))
    assert _hot_row(led, "a").renyi_orders == ["2", "4"] == _orm_row(led, "a")["renyi_orders"]
    assert _hot_row(led, "d")._asdict() == _orm_row(led, "d")


def test_the_codec_shares_only_immutable_values() -> None:
    """Codec.load parses a column again unless its raw value is the last one's exactly
    (same type: the integer 1 is not the text '1'), and never shares a mutable value (a
    JSON list) between two rows."""
    from sqlalchemy.dialects import sqlite

    from privcal.storage.statements import HotSQL

    codec = HotSQL(sqlite.dialect()).dataset
    names = codec.names
    raw = {n: None for n in names} | {
        "id": 1, "name": "d", "description": "", "notion": "approx", "cap_epsilon": "1",
        "cap_delta": "0.000001", "reporting_delta": "0.000001", "allow_nonprivate": 0,
        "created_at": "2026-01-02 03:04:05.000006", "renyi_orders": '["2", "3"]',
        "spent_pure_eps": "0", "spent_pure_rho": "0", "spent_zcdp_rho": "0.10",
        "spent_approx_eps": "0", "spent_approx_delta": "0", "charge_count": 3}
    first = codec.load([raw[n] for n in names])
    second = codec.load([raw[n] for n in names])
    assert first == second
    assert first.renyi_orders == ["2", "3"] and first.renyi_orders is not second.renyi_orders
    first.renyi_orders.append("4")
    assert codec.load([raw[n] for n in names]).renyi_orders == ["2", "3"]
    assert second.created_at is first.created_at  # (immutable: shared)
    other = codec.load([1 if n == "cap_epsilon" else raw[n] for n in names])
    assert other.cap_epsilon == Decimal(1) and type(other.cap_epsilon) is Decimal
    assert codec.load([True if n == "allow_nonprivate" else raw[n] for n in names]
                      ).allow_nonprivate is True
    assert codec.load([raw[n] for n in names]).allow_nonprivate is False


_amount = st.one_of(
    st.none(), st.integers(-10**20, 10**20), st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.sampled_from([Decimal("-0"), Decimal("0E-30"), Decimal("1E+14"), Decimal("0.100"),
                     Decimal("NaN"), Decimal("Infinity"), "0.25", "1e-7"]))


@settings(max_examples=300, deadline=None)
@given(_amount)
def test_the_codec_converts_as_sqlalchemy(value: Any) -> None:
    """The hot path's bind and result functions (statements._processors: ExactDecimal's own
    on SQLite and PostgreSQL) give what SQLAlchemy's processors of the same column give —
    or raise alike."""
    from sqlalchemy.dialects import postgresql, sqlite

    from privcal.storage.models import Charge, Dataset
    from privcal.storage.statements import HotSQL, _coltype

    for dialect in (sqlite.dialect(), postgresql.psycopg.dialect()):
        q = HotSQL(dialect)
        for codec, table in ((q.dataset, Dataset.__table__), (q.charge, Charge.__table__)):
            out = dict(codec._out)
            for i, col in enumerate(table.c):
                t = col.type.dialect_impl(dialect)
                sa_bind = t.bind_processor(dialect)
                sa_result = t.result_processor(dialect, _coltype(dialect, t))
                assert (col.name in codec.bind) == (sa_bind is not None)
                assert (i in out) == (sa_result is not None)
                if col.type.__class__.__name__ != "ExactDecimal":
                    continue
                want: Any
                try:
                    want = ("ok", sa_bind(value))  # type: ignore[misc]
                except Exception as exc:  # compared below
                    want = ("raises", type(exc))
                try:
                    got: Any = ("ok", codec.bind[col.name](value))
                except Exception as exc:
                    got = ("raises", type(exc))
                assert got == want
                if want[0] == "ok":
                    stored = want[1]
                    assert out[i](stored) == sa_result(stored)  # type: ignore[misc]
                    assert type(out[i](stored)) is type(sa_result(stored))  # type: ignore[misc]
                    if stored is not None:
                        assert str(out[i](stored)) == str(sa_result(stored))  # type: ignore[misc]


def test_a_trusted_receipt_is_model_construct() -> None:
    """results.construct_trusted builds the instance model_construct builds (fields, their
    order, fields set), and hands anything else to model_construct: a model with aliases,
    or values missing a field (its default filled in)."""
    from datetime import UTC, datetime

    from privcal.accountant.results import ChargeReceipt, _plain_fields, construct_trusted
    from privcal.costs import LocalDP

    values = {"charge_id": 3, "dataset": "d", "scope": "dataset", "cost": {"kind": "zcdp"},
              "purpose": None, "requester": "r", "idempotency_key": None,
              "created_at": datetime.now(UTC), "remaining": {"rho": Decimal("0.5")},
              "replayed": False}
    got = construct_trusted(ChargeReceipt, dict(values))
    want = ChargeReceipt.model_construct(**values)
    assert got == want and list(vars(got)) == list(vars(want))
    assert got.model_fields_set == want.model_fields_set
    assert got.model_dump() == want.model_dump() and repr(got) == repr(want)
    assert got.__pydantic_extra__ is None and got.__pydantic_private__ is None
    with pytest.raises(Exception):  # noqa: B017 - frozen, like the validated receipt
        got.charge_id = 4  # type: ignore[misc]
    assert _plain_fields(LocalDP) is None  # a validation alias: model_construct's way
    short = {k: v for k, v in values.items() if k != "replayed"}
    partial = construct_trusted(ChargeReceipt, short)
    assert partial.replayed is False
    assert partial.model_fields_set == ChargeReceipt.model_construct(**short).model_fields_set
