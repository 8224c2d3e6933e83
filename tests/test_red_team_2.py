"""Red team, session 5: attacks on the charge path on the DB-API driver
(:mod:`privcal.storage.statements`, :mod:`privcal.storage.transactions`) and on the PostgreSQL
audit sequencer (:mod:`privcal.storage.audit_queue`). Each test is an attack; it passes when
the attack fails (nothing written, the pooled connection clean, the chain intact)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import unicodedata
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import text

from privcal.costs import ZCDP, ApproxDP, PureDP
from privcal.errors import invisible_char

_pg = pytest.mark.parametrize("ledger_url", [pytest.param("postgresql",
                                                          marks=pytest.mark.postgres)],
                              indirect=True)


def _state(acct: Any, name: str = "d") -> tuple[Any, ...]:
    """Everything a charge writes: the budget, the charges, the chain (and queue) length."""
    led = acct.ledger
    with led.engine.connect() as conn:
        charges = conn.execute(text("SELECT count(*) FROM charges")).scalar()
        entries = conn.execute(text("SELECT count(*) FROM audit_log")).scalar()
        queued = (conn.execute(text("SELECT count(*) FROM audit_queue")).scalar()
                  if led.backend == "postgresql" else 0)
    b = acct.budget(name)
    return b.spent, b.charges if hasattr(b, "charges") else None, charges, entries, queued


def _boom_trigger(acct: Any) -> None:
    """A trigger that fails the INSERT of a charge whose purpose is 'boom' — after the
    dataset's totals were updated in the same transaction (SQLite: a statement before it;
    PostgreSQL: the CTE of the same statement)."""
    led = acct.ledger
    with led.engine.begin() as conn:
        if led.backend == "sqlite":
            conn.execute(text(
                "CREATE TRIGGER boom BEFORE INSERT ON charges WHEN NEW.purpose = 'boom' "
                "BEGIN SELECT RAISE(ABORT, 'boom refused'); END"))
        else:
            conn.execute(text(
                "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.purpose = 'boom' THEN RAISE EXCEPTION 'boom refused' "
                "USING ERRCODE = '23514'; END IF; RETURN NEW; END $$"))
            conn.execute(text("CREATE TRIGGER boom BEFORE INSERT ON charges FOR EACH ROW "
                              "EXECUTE FUNCTION boom()"))


@pytest.mark.parametrize("cost", [ZCDP(rho="0.1"), PureDP(eps="0.1"),
                                  ApproxDP(eps="0.1", delta="1e-7")],
                         ids=["zcdp", "pure", "approx"])
def test_a_constraint_violation_mid_charge_writes_nothing_and_leaves_the_pool_clean(
        accountant: Any, cost: Any) -> None:
    """Attack: fail a charge's INSERT after its totals' UPDATE ran in the same transaction.
    If the driver-level transaction were not rolled back before its connection went back to
    the pool, the next charge on that connection would commit the orphan UPDATE (totals
    larger than the charges: ``verify`` fails) or could not begin."""
    kw = {"ZCDP": {"rho": "1"}, "PureDP": {"epsilon": "1"},
          "ApproxDP": {"approx_epsilon": "1", "approx_delta": "1e-5"}}[type(cost).__name__]
    accountant.create_dataset("d", **kw)
    accountant.charge("d", cost, purpose="ok")
    _boom_trigger(accountant)
    before = _state(accountant)
    for _ in range(3):  # the same pooled connection, again and again
        with pytest.raises(Exception, match="boom refused"):
            accountant.charge("d", cost, purpose="boom")
        assert _state(accountant) == before
    accountant.charge("d", cost, purpose="after")  # (PostgreSQL spent ids on the failures)
    rep = accountant.ledger.verify()
    assert (rep.charges, rep.entries) == (2, 3)
    once = before[0]
    assert accountant.budget("d").spent == {k: 2 * v for k, v in once.items()}


def test_a_refused_charge_writes_nothing_on_the_same_connection(accountant: Any) -> None:
    """Attack: a refused charge (budget) followed by an accepted one on the same pooled
    connection: the refusal must leave nothing, the next one exactly its own amount."""
    accountant.create_dataset("d", rho="0.3")
    accountant.charge("d", ZCDP(rho="0.2"))
    before = _state(accountant)
    from privcal.errors import BudgetRefused

    for _ in range(3):
        with pytest.raises(BudgetRefused):
            accountant.charge("d", ZCDP(rho="0.2"))
        assert _state(accountant) == before
    accountant.charge("d", ZCDP(rho="0.1"))
    assert accountant.budget("d").spent == {"rho": Decimal("0.3")}
    accountant.ledger.verify()


@pytest.mark.parametrize("amount", ["0.000000000001", "0.1", "0.999999999999",
                                    "123456789012.123456789012", "3"])
def test_exact_amounts_are_stored_as_given(accountant: Any, amount: str) -> None:
    """Attack: amounts at the edges of the 12 places and of the integer range; the stored
    bytes (the charge row, the audit payload) must be the decimal given, on both backends."""
    accountant.create_dataset("d", approx_epsilon="999999999999999", approx_delta="0.5")
    accountant.charge("d", ApproxDP(eps=amount, delta="0." + "0" * 11 + "1"))
    led = accountant.ledger
    with led.engine.connect() as conn:
        eps, delta = conn.execute(text("SELECT epsilon, delta FROM charges")).one()
        payload = conn.execute(text(
            "SELECT payload FROM audit_log WHERE kind = 'charge'")).scalar()
    assert Decimal(str(eps)) == Decimal(amount) and Decimal(str(delta)) == Decimal("1e-12")
    assert f'"epsilon":"{amount}"' in payload and '"delta":"0.000000000001"' in payload
    accountant.ledger.verify()


# ------------------------------------------------------------------ PostgreSQL only
@_pg
def test_a_statement_timeout_mid_charge_writes_nothing(accountant: Any,
                                                       ledger_url: str) -> None:
    """Attack: the dataset row is held by another transaction and the charge's connection
    has a 300 ms statement timeout: the charge fails with a one-line ledger error (not a
    traceback of SQL), writes nothing, and the same ledger charges normally afterwards."""
    from privcal.accountant import Accountant
    from privcal.storage import Ledger

    accountant.create_dataset("d", rho="1")
    led = Ledger(ledger_url + quote(" -cstatement_timeout=300"))
    acct = Accountant(led)
    acct.charge("d", ZCDP(rho="0.1"))
    before = _state(acct)
    holder = accountant.ledger.engine.connect()
    try:
        holder.execute(text("SELECT 1 FROM datasets WHERE name = 'd' FOR UPDATE"))
        t0 = time.monotonic()
        with pytest.raises(Exception) as err:
            acct.charge("d", ZCDP(rho="0.1"))
        assert time.monotonic() - t0 < 30
        assert "statement timeout" in str(err.value) or "canceling" in str(err.value)
    finally:
        holder.rollback()
        holder.close()
    assert _state(acct) == before
    acct.charge("d", ZCDP(rho="0.1"))
    assert acct.budget("d").spent == {"rho": Decimal("0.2")}
    acct.ledger.verify()
    led.close()


@_pg
def test_a_connection_killed_between_charges_is_replaced_and_charged_once(
        accountant: Any) -> None:
    """Attack: the server terminates the connections a charge would use next (failover, an
    idle kill) — the one kept from the last charge (storage/held_connections.py) and the
    pooled one: the next charge runs on a fresh connection, exactly once."""
    accountant.create_dataset("d", rho="1")
    led = accountant.ledger
    accountant.charge("d", ZCDP(rho="0.1"))
    pids = {c.connection.driver_connection.info.backend_pid for c in led.held_connections()}
    with led.engine.connect() as c:  # the pooled connection
        pids.add(c.execute(text("SELECT pg_backend_pid()")).scalar())
    from privcal.storage import Ledger

    other = Ledger(led.url)
    with other.engine.connect() as c:
        for pid in pids:
            assert c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    time.sleep(0.2)
    accountant.charge("d", ZCDP(rho="0.1"))
    # read on other connections (a read meeting a dead pooled connection fails once: reads
    # are not retried, and the pool pings only connections idle for IDLE_PING_S)
    from privcal.accountant import Accountant

    assert Accountant(other).budget("d").spent == {"rho": Decimal("0.2")}
    rep = other.verify()
    assert (rep.charges, rep.entries) == (2, 3)
    other.close()


@_pg
def test_a_read_on_a_connection_the_server_killed_is_a_one_line_ledger_error(
        accountant: Any) -> None:
    """Attack: the server terminates the pooled connection a read will use (failover, idle
    kill). Killed while idle in the pool: the pool sees the server's goodbye at checkout
    and the read runs on a fresh connection. Killed after the pool handed it out: the read
    fails with a one-line LedgerError (the service's 503), not a driver traceback (a 500);
    the next read gets a fresh connection and sees the ledger."""
    from sqlalchemy import event

    from privcal.accountant import Accountant
    from privcal.errors import LedgerError
    from privcal.storage import Ledger

    accountant.create_dataset("d", rho="1")
    accountant.charge("d", ZCDP(rho="0.1"))
    reader = Ledger(accountant.ledger.url)
    acct = Accountant(reader)
    assert acct.budget("d").spent == {"rho": Decimal("0.1")}  # leaves one pooled connection

    def kill(pid: int) -> None:
        with accountant.ledger.engine.connect() as c:
            assert c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
        time.sleep(0.2)

    with reader.engine.connect() as c:
        pid = c.execute(text("SELECT pg_backend_pid()")).scalar()
    kill(pid)
    assert acct.budget("d").spent == {"rho": Decimal("0.1")}  # idle: replaced at checkout

    armed = [True]

    def kill_at_checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if armed[0]:
            armed[0] = False
            kill(dbapi_conn.info.backend_pid)

    event.listen(reader.engine, "checkout", kill_at_checkout)  # after the pool's own check
    with pytest.raises(LedgerError, match="lost during a read") as err:
        acct.budget("d")
    assert not armed[0]
    assert "\n" not in str(err.value)
    assert acct.budget("d").spent == {"rho": Decimal("0.1")}
    reader.close()


def _reader(url: str, stop: Any, out: Any) -> None:
    """Drain and verify the chain over and over while the writers run."""
    from privcal.storage import Ledger

    led = Ledger(url)
    n = drained = 0
    err = None
    try:
        while not stop.is_set():
            drained += led.sequence_audit() or 0
            led.verify()
            n += 1
    except Exception as exc:  # reported to the parent
        err = f"{type(exc).__name__}: {exc}"
    out.put(("reader", n, drained, err))


def _writer(url: str, w: int, count: int, out: Any) -> None:
    from privcal.accountant import Accountant

    acct = Accountant(url)
    ids, err = [], None
    try:
        for _ in range(count):
            ids.append(acct.charge(f"d{w}", ZCDP(rho="0.01")).charge_id)
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
    out.put(("writer", ids, err))


@_pg
def test_writers_on_many_datasets_with_readers_draining_keep_one_chain(
        accountant: Any, ledger_url: str) -> None:
    """Attack: 6 writers on 6 datasets while 2 readers drain the queue and verify the whole
    ledger in a loop. Every verify passes mid-race; at the end the chain is gap-free, each
    committed charge has exactly one entry, nothing is left queued after a drain."""
    writers, per = 6, 25
    for w in range(writers):
        accountant.create_dataset(f"d{w}", rho="10")
    accountant.ledger.engine.dispose()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    stop = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(ledger_url, w, per, q)) for w in range(writers)]
    readers = [ctx.Process(target=_reader, args=(ledger_url, stop, q)) for _ in range(2)]
    for p in procs + readers:
        p.start()
    got = []
    while sum(r[0] == "writer" for r in got) < writers:
        got.append(q.get(timeout=600))
    stop.set()
    while len(got) < writers + len(readers):
        got.append(q.get(timeout=600))
    for p in procs + readers:
        p.join(timeout=60)
        assert p.exitcode == 0
    results = [r for r in got if r[0] == "writer"]
    checks = [r for r in got if r[0] == "reader"]
    assert all(r[2] is None for r in results), [r[2] for r in results]
    assert all(r[3] is None for r in checks), checks
    assert sum(r[1] for r in checks) >= 2, checks  # the readers did verify mid-race
    ids = sorted(c for r in results for c in r[1])
    assert len(ids) == writers * per == len(set(ids))
    led = accountant.ledger
    led.sequence_audit()
    rep = led.verify()
    assert (rep.charges, rep.queued, rep.entries) == (len(ids), 0, writers + len(ids))
    with led.engine.connect() as conn:
        seqs = [s for (s,) in conn.execute(text("SELECT seq FROM audit_log ORDER BY seq"))]
        cids = sorted(int(c) for (c,) in conn.execute(text(
            "SELECT payload::json->'data'->>'charge_id' FROM audit_log WHERE kind = 'charge'")))
    assert seqs == list(range(1, len(seqs) + 1)) and cids == ids


# ------------------------------------------------------------------ score options
@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("option", ["rng", "probs", "labels", "name"])
@pytest.mark.parametrize("score", ["lac", "aps"])
def test_a_score_option_named_like_an_argument_is_a_one_line_error(
        accountant: Any, option: str, score: str, tmp_path: Any) -> None:
    """Attack: a score option named like an argument of the score function (``rng``,
    ``probs``, ``labels``, ``name``). It used to reach ``label_scores(score, probs, labels,
    rng=rng, **opts)`` as a keyword and raise TypeError ("got multiple values") — a traceback
    in the CLI, a 500 from the service. It is an unknown option: a one-line InvalidInput,
    nothing charged."""
    import json

    import numpy as np
    from click.testing import CliRunner

    from privcal.cli import main
    from privcal.errors import InvalidInput

    accountant.create_dataset("d", rho="1")
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(3), 100)
    y = rng.integers(0, 3, 100)
    before = _state(accountant)
    with pytest.raises(InvalidInput, match=f"does not take option.*{option}"):
        accountant.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.1}, dataset="d", probs=p,
                             labels=y, score=score, score_options={option: 1})
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "y.npy", y)
    res = CliRunner().invoke(main, [
        "--db-url", accountant.ledger.url, "calibrate", "pcoqs", "--dataset", "d",
        "--alpha", "0.1", "--rho", "0.1", "--probs", str(tmp_path / "p.npy"),
        "--labels", str(tmp_path / "y.npy"), "--score", score, "--score-option",
        f"{option}=1", "--json"])
    assert res.exit_code == 1, res.output
    msg = json.loads(res.stdout)["error"]["message"]
    assert "does not take option" in msg and "\n" not in msg
    assert _state(accountant) == before


_ODD_TEXTS = [
    "100% of %s and %(kind)s and %%",                   # client-side binding placeholders
    "'; DROP TABLE charges; --",                        # quotes
    "back\\slash \\' E'\\x41' $$ $q$",                  # escapes, dollar quotes
    '{"data":{"charge_id":7},"kind":"charge","seq":',   # the entry prefix itself
    "\u2028\u2029 \u00e9 e\u0301 \U0001F600 \ufeff",  # separators, combining, emoji, BOM
    "\t\n",  # (DEL, CR and the other controls are refused in free text: red team 22, ui F1)
    "x" * 5000,
]


@pytest.mark.parametrize(("ledger_url", "busy"), [
    ("sqlite", False),
    pytest.param("postgresql", False, marks=pytest.mark.postgres),
    pytest.param("postgresql", True, marks=pytest.mark.postgres),  # only PostgreSQL queues
], ids=["sqlite-direct", "postgresql-direct", "postgresql-queued"], indirect=["ledger_url"])
def test_odd_text_in_a_charge_is_stored_and_logged_byte_for_byte(
        accountant: Any, ledger_url: str, busy: bool) -> None:
    """Attack the charge path's SQL (PostgreSQL: BEGIN and the first statement in one
    message with parameters bound by the client; the server writing the charge id into the
    canonical prefix) with text that looks like SQL, placeholders, escapes or the prefix
    itself, in the dataset name, the purpose, the requester and the idempotency key: every
    charge is stored as given, its entry is its row's document, ``verify`` passes; no other
    row is touched."""
    from contextlib import nullcontext

    from privcal.storage import audit

    led = accountant.ledger
    ctx: Any = nullcontext()
    if busy:
        from tests.test_audit_queue import _sequencer_busy

        ctx = _sequencer_busy(led)
    # a blank idempotency key is refused (red team 24, newcomer F2): "\t\n" keeps its controls
    # behind a letter
    keys = [t[:200] if t.strip() else f"k{t}" for t in _ODD_TEXTS]
    names = []
    for i, t in enumerate(_ODD_TEXTS):
        # a dataset name is one URL segment, printable, NFC (red team 5), with nothing that
        # reads as nothing (red team 10): the SQL-looking text stays in it, the control,
        # separator and invisible characters and '/' go (they stay in the others)
        shown = unicodedata.normalize("NFC", "".join(
            ch for ch in t[:150] if ch != "/" and invisible_char(ch) is None))
        name = f"d{i} {shown}".strip() + f" {i}"
        accountant.create_dataset(name, rho="1")
        names.append(name)
    with ctx:
        for i, t in enumerate(_ODD_TEXTS):
            r = accountant.charge(names[i], ZCDP(rho="0.1"), purpose=t, requester=t[:200],
                                  idempotency_key=keys[i])
            again = accountant.charge(names[i], ZCDP(rho="0.1"), purpose=t,
                                      requester=t[:200], idempotency_key=keys[i])
            assert again.replayed and again.charge_id == r.charge_id
    rep = led.verify()
    assert (rep.charges, rep.queued) == (len(_ODD_TEXTS), 0)
    with led.engine.connect() as conn:
        rows = conn.execute(text("SELECT c.purpose, c.requester, c.idempotency_key, d.name, "
                                 "a.payload FROM charges c JOIN datasets d ON d.id = "
                                 "c.dataset_id JOIN audit_log a ON a.kind = 'charge' "
                                 "ORDER BY c.id, a.seq")).all()
    payloads = sorted({p for *_, p in rows if '"kind":"charge"' in p})
    docs = [json.loads(p)["data"] for p in payloads]
    for i, t in enumerate(_ODD_TEXTS):
        d = next(x for x in docs if x["dataset"] == names[i])
        assert (d["purpose"], d["requester"], d["idempotency_key"]) == (t, t[:200], keys[i])
        assert audit.canonical(json.loads(payloads[docs.index(d)])) == payloads[docs.index(d)]
    assert {(p, q, k, n) for p, q, k, n, _ in rows} == {
        (t, t[:200], keys[i], names[i]) for i, t in enumerate(_ODD_TEXTS)}
    for name in names:
        assert accountant.budget(name).spent == {"rho": Decimal("0.1")}


def _dying_writer(url: str, ready: Any) -> None:
    """Charge with the sequencer busy, and stop dead before COMMIT (killed by the parent)."""
    from privcal.accountant import Accountant
    from privcal.storage.statements import HotStatements

    def hang(self: Any, conn: Any) -> None:
        ready.set()
        time.sleep(600)

    HotStatements._commit = hang  # type: ignore[method-assign]
    Accountant(url).charge("d", ZCDP(rho="0.5"))


@_pg
@pytest.mark.parametrize("how", ["killed", "rolled back"])
def test_a_writer_that_dies_after_queueing_leaves_nothing(accountant: Any, ledger_url: str,
                                                          how: str) -> None:
    """Attack: a charge queues its entry (the sequencer is busy) and its process is killed
    (SIGKILL) — or its COMMIT fails — before it commits. Nothing of it may remain: no
    charge, no totals, no queued entry; the chain verifies and the next charge is counted."""
    import signal

    from tests.test_audit_queue import _queue, _sequencer_busy

    accountant.create_dataset("d", rho="1")
    accountant.charge("d", ZCDP(rho="0.1"))
    led = accountant.ledger
    before = _state(accountant)
    with _sequencer_busy(led):
        if how == "killed":
            led.engine.dispose()
            ctx = mp.get_context("fork")
            ready = ctx.Event()
            p = ctx.Process(target=_dying_writer, args=(ledger_url, ready))
            p.start()
            assert ready.wait(120)
            with led.engine.connect() as conn:  # its entry is in the queue, uncommitted
                assert conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in "
                    "transaction' AND datname = current_database()")).scalar() >= 1
            os.kill(p.pid, signal.SIGKILL)
            p.join(60)
        else:
            from privcal.storage.statements import HotStatements

            real = HotStatements._commit

            def fail(self: Any, conn: Any) -> None:
                raise RuntimeError("COMMIT lost")

            HotStatements._commit = fail  # type: ignore[method-assign]
            # the locked path, whose COMMIT is its own step (the optimistic charge's statement
            # is its COMMIT: tests/test_optimistic_charge.py)
            led.forget_dataset("d")
            try:
                with pytest.raises(RuntimeError, match="COMMIT lost"):
                    accountant.charge("d", ZCDP(rho="0.5"))
            finally:
                HotStatements._commit = real  # type: ignore[method-assign]
        deadline = time.monotonic() + 60
        while _state(accountant) != before and time.monotonic() < deadline:
            time.sleep(0.1)  # the server notices the dead client and rolls it back
        assert _state(accountant) == before
        assert _queue(led) == []
    accountant.charge("d", ZCDP(rho="0.2"))
    assert accountant.budget("d").spent == {"rho": Decimal("0.3")}
    rep = led.verify()
    assert (rep.charges, rep.queued) == (2, 0)


# ------------------------------------------------------------------ subject caps under races
def _subject_worker(url: str, w: int, sid: int | None, rounds: int, out: Any) -> None:
    """Charge (or, with a session, report for) 40 overlapping subjects, ``rounds`` times."""
    from privcal.accountant import Accountant
    from privcal.errors import BudgetRefused

    acct = Accountant(url)
    accepted: list[str] = []
    err = None
    subjects = [f"u{(w * 13 + i) % 60}" for i in range(40)]
    try:
        for _ in range(rounds):
            if sid is None:
                try:
                    r = acct.charge_subjects("d", "1", subjects)
                except BudgetRefused:
                    continue
                accepted += [s for s, ok in zip(subjects, r.accepted_mask, strict=True) if ok]
            else:
                from privcal.accountant.sessions import submit_reports

                r = submit_reports(acct, sid + w % 2, subjects, [1] * len(subjects),
                                   [0] * len(subjects))
                accepted.append(str(r.accepted))
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
    out.put((accepted, err))


@pytest.mark.parametrize("sessions", [False, True], ids=["charge_subjects", "session batches"])
def test_racing_subject_charges_never_pass_a_subjects_cap(accountant: Any, ledger_url: str,
                                                          sessions: bool) -> None:
    """Attack: 6 processes charge 40 overlapping subjects each (of 60) at once — directly
    (``charge_subjects``, 3 times each) or as batches of reports to two ldp-score sessions of
    the same dataset — against a per-subject cap of ε = 1.5 (one charge of ε0 = 1). No
    subject may be charged past its cap, however the writers interleave; the ledger's
    spends equal the accepted charges and verify."""
    from privcal.accountant.sessions import open_session

    accountant.create_dataset("d", rho="1", subject_epsilon="1.5")
    sid = None
    if sessions:
        sid = open_session(accountant, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0,
                           rounds=1, group_size=10_000).id
        sid2 = open_session(accountant, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0,
                            rounds=1, group_size=10_000).id
        assert sid2 == sid + 1
    accountant.ledger.engine.dispose()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_subject_worker, args=(ledger_url, w, sid, 3, q))
             for w in range(6)]
    for p in procs:
        p.start()
    got = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(err is None for _, err in got), [err for _, err in got]
    spends = {f"u{i}": accountant.subject_spend("d", f"u{i}") for i in range(60)}
    assert max(spends.values()) == 1, spends  # each once: the first writer wins it
    if not sessions:
        from collections import Counter

        counted = Counter(s for acc, _ in got for s in acc)
        assert {s: spends[s] for s in counted} == dict(counted)
        assert sum(spends.values()) == sum(counted.values())
    else:  # a subject accepted in one session is over its cap for the other
        assert sum(spends.values()) == sum(int(a) for acc, _ in got for a in acc)
    accountant.ledger.verify()


# ------------------------------------------------------------------ in-memory ledger, threads
def test_threads_charging_an_in_memory_ledger_never_overspend() -> None:
    """Attack: 8 threads charge one in-memory SQLite ledger (``sqlite:///:memory:``, one
    connection shared by every checkout). They used to share one transaction: 178 charges
    of ρ = 0.01 accepted against a cap of 1, totals of 0.74, and a log that failed to
    verify. Now a thread holds the connection from checkout to checkin: exactly the 100
    that fit, the rest refused, the chain verifies."""
    import threading

    from privcal.accountant import Accountant
    from privcal.errors import BudgetRefused

    acct = Accountant("sqlite:///:memory:")
    acct.create_dataset("d", rho="1")
    accepted: list[int] = []
    errors: list[str] = []

    def work() -> None:
        for _ in range(20):
            try:
                accepted.append(acct.charge("d", ZCDP(rho="0.01")).charge_id)
            except BudgetRefused:
                pass
            except Exception as exc:  # reported below
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    assert sorted(accepted) == list(range(1, 101))
    assert acct.budget("d").spent == {"rho": Decimal("1.00")}
    rep = acct.ledger.verify()
    assert (rep.charges, rep.entries) == (100, 101)


@_pg
@pytest.mark.parametrize("write", ["charge (write_core)", "dataset (ORM write)"])
def test_a_connection_lost_during_commit_is_not_retried_into_a_second_write(
        accountant: Any, monkeypatch: pytest.MonkeyPatch, write: str) -> None:
    """Attack: the server commits, then the connection dies before COMMIT's answer arrives
    (failover, network). The write was retried on a fresh connection as if nothing had been
    committed: one ``charge`` call recorded two charges (ρ = 0.1 asked, 0.2 spent). An
    unknown outcome is now a one-line LedgerError and the write is not run again: exactly
    one charge (or dataset) is recorded, and the ledger verifies."""
    import psycopg

    from privcal.errors import LedgerError

    accountant.create_dataset("d", rho="1")
    real = psycopg.Connection.commit
    lost = {"n": 0}

    def commit_then_lose(self: Any) -> None:
        real(self)
        if lost["n"] == 0:
            lost["n"] += 1
            self.close()
            raise psycopg.OperationalError("consuming input failed: server closed the "
                                           "connection unexpectedly")

    monkeypatch.setattr(psycopg.Connection, "commit", commit_then_lose)
    with pytest.raises(LedgerError, match="lost during COMMIT") as err:
        if write.startswith("charge"):
            accountant.charge("d", ZCDP(rho="0.1"))
        else:
            accountant.create_dataset("e", rho="1")
    assert "\n" not in str(err.value)
    monkeypatch.setattr(psycopg.Connection, "commit", real)
    assert lost["n"] == 1
    rep = accountant.ledger.verify()
    if write.startswith("charge"):
        assert accountant.budget("d").spent == {"rho": Decimal("0.1")}
        assert (rep.charges, rep.datasets) == (1, 1)
    else:
        assert (rep.charges, rep.datasets) == (0, 2)
