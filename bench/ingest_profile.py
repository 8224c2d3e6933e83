"""CPU per report of a collection-session batch (load-independent proxy for ingest_bench.py).

    python bench/ingest_profile.py --backend sqlite|pg [--batch 20000] [--reps 3] [--warm 1]
                                   [--raw] [--stmts] [--profile]

Opens an ldp-score session (10 rounds) on a fresh ledger (SQLite in a temporary file;
PostgreSQL in a scratch schema of $PRIVCAL_TEST_DATABASE_URL), submits ``--warm`` batches,
then ``--reps`` batches of ``--batch`` new subjects, and prints the CPU time of this process
per report (best batch) and, on PostgreSQL, of the server backend per report (mean, from
/proc/<pid>/stat: the server must run on this machine), the wall time and the statements
sent through SQLAlchemy. ``--raw``: the bare driver writing the same rows (pseudonyms) and
the ids, measured the same way; ``--stmts``: one more batch with each statement's time;
``--profile``: one more batch under cProfile. Run it with ``PYTHONPATH`` set to another
checkout to measure that code.
"""

import argparse
import cProfile
import datetime
import io
import os
import pstats
import tempfile
import time
import uuid
from urllib.parse import quote

import numpy as np
from sqlalchemy import event

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.storage import Ledger

ap = argparse.ArgumentParser(description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--backend", choices=("sqlite", "pg"), default="sqlite")
ap.add_argument("--batch", type=int, default=20000)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--warm", type=int, default=1)
ap.add_argument("--profile", action="store_true")
ap.add_argument("--raw", action="store_true")
ap.add_argument("--top", type=int, default=30, help="cProfile rows shown (--profile)")
ap.add_argument("--stmts", action="store_true")
a = ap.parse_args()
TICK = os.sysconf("SC_CLK_TCK")


def pcpu(pids):
    t = 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            t += int(f[11]) + int(f[12])
        except FileNotFoundError:
            pass
    return t / TICK


def run(url):
    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("bench", epsilon=1, subject_epsilon=10)
    n_total = a.batch * (a.reps + a.warm + 2) * 10
    info = S.open_session(
        acct,
        "ldp-score",
        dataset="bench",
        alpha=0.1,
        epsilon=2,
        rounds=10,
        group_size=n_total // 10,
        lower=0,
        upper=1,
    )
    gen = np.random.default_rng(0)
    ids = np.char.add("user-", np.arange(n_total).astype(str))
    bits = gen.integers(0, 2, n_total)
    answers = np.arange(n_total) // (n_total // 10)  # the round each report answers
    nstmt = [0]
    pids = set()
    event.listen(
        led.engine, "before_cursor_execute", lambda *x, **k: nstmt.__setitem__(0, nstmt[0] + 1)
    )
    if "postgresql" in url:
        with led.engine.connect() as c:
            pids.add(c.exec_driver_sql("select pg_backend_pid()").scalar())
    pos = 0

    def one():
        nonlocal pos
        r = S.submit_reports(acct, info.id, ids[pos : pos + a.batch], bits[pos : pos + a.batch],
                             answers[pos : pos + a.batch])
        assert r.accepted == a.batch, r
        pos += a.batch

    for _ in range(a.warm):
        one()
    cpus = []
    walls = []
    stm = []
    srv = []
    for _ in range(a.reps):
        nstmt[0] = 0
        c, w, sv = time.process_time(), time.perf_counter(), pcpu(pids)
        one()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
        stm.append(nstmt[0])
        srv.append(pcpu(pids) - sv)
    print(
        f"{a.backend} batch {a.batch}: client CPU/report {1e6 * min(cpus) / a.batch:.2f} us "
        f"(batch {min(cpus) * 1e3:.1f} ms), "
        f"server CPU/report {1e6 * np.mean(srv) / a.batch:.2f} us, "
        f"wall min {min(walls) * 1e3:.1f} ms, statements {stm}, load {os.getloadavg()[0]:.1f}"
    )
    if a.stmts:
        log = []

        def b(conn, cur, stmt, params, ctx, many):
            conn.info["t0"] = (time.process_time(), time.perf_counter())

        def af(conn, cur, stmt, params, ctx, many):
            c0, w0 = conn.info["t0"]
            log.append(
                (time.process_time() - c0, time.perf_counter() - w0, " ".join(stmt.split())[:110])
            )

        event.listen(led.engine, "before_cursor_execute", b)
        event.listen(led.engine, "after_cursor_execute", af)
        c = time.process_time()
        one()
        tot = time.process_time() - c
        for cp, w, st in log:
            print(f"  cpu {cp * 1e3:7.1f} ms  wall {w * 1e3:7.1f} ms  {st}")
        print(
            f"  total cpu {tot * 1e3:.1f} ms, in statements {sum(x[0] for x in log) * 1e3:.1f} ms"
        )
    if a.profile:
        pr = cProfile.Profile()
        pr.enable()
        one()
        pr.disable()
        s = io.StringIO()
        st = pstats.Stats(pr, stream=s)
        print("calls", st.total_calls)
        st.sort_stats("cumulative").print_stats(a.top)
        print(s.getvalue()[:14000])
        s = io.StringIO()
        st = pstats.Stats(pr, stream=s)
        st.sort_stats("tottime").print_stats(25)
        print(s.getvalue()[:8000])
    if a.raw:
        for form in ("ids", "pseudonyms"):
            rawrun(url, ids, bits, led, form)
    led.close()


def rawrun(url, ids, bits, led, form):
    import sqlite3

    sqlite = url.startswith("sqlite")
    if sqlite:
        conn = sqlite3.connect(url.split("///", 1)[1], timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        mypids = set()
    else:
        import psycopg
        from sqlalchemy.engine import make_url

        u = make_url(url)
        conn = psycopg.connect(
            host=u.host,
            port=u.port,
            user=u.username,
            dbname=u.database,
            password=u.password,
            options=u.query.get("options"),
        )
        mypids = {conn.execute("select pg_backend_pid()").fetchone()[0]}
    t = f"_{form}"
    for ddl in [
        f"CREATE TABLE raw_reports{t} (session_id INTEGER NOT NULL, subject VARCHAR(200) NOT NULL, "
        "round INTEGER NOT NULL, value VARCHAR(64) NOT NULL, received_at {ts} NOT NULL, "
        "batch INTEGER, "
        "PRIMARY KEY (session_id, subject))",
        f"CREATE TABLE raw_spend{t} (dataset_id INTEGER NOT NULL, subject VARCHAR(200) NOT NULL, "
        "spent_units BIGINT NOT NULL, PRIMARY KEY (dataset_id, subject))",
    ]:
        conn.execute(ddl.format(ts="TIMESTAMPTZ" if not sqlite else "DATETIME"))
    conn.commit()
    ts = datetime.datetime.now(datetime.UTC).isoformat()
    n = a.batch * (a.reps + a.warm)
    subj_all = ids[:n].tolist() if form == "ids" else led.pseudonyms(ids[:n].tolist()).tolist()
    cpus = []
    srv = []
    walls = []
    for k, start in enumerate(range(0, n, a.batch)):
        c, w, sv = time.process_time(), time.perf_counter(), pcpu(mypids)
        subj = subj_all[start : start + a.batch]
        vals = bits[start : start + a.batch].astype(str).tolist()
        if sqlite:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                f"INSERT INTO raw_reports{t} VALUES (1, ?, 0, ?, ?, 1)",
                ((x, y, ts) for x, y in zip(subj, vals, strict=True)),
            )
            conn.executemany(
                f"INSERT INTO raw_spend{t} VALUES (1, ?, 2000000000000)", ((x,) for x in subj)
            )
            conn.execute("COMMIT")
        else:
            with conn.cursor() as cur:
                with cur.copy(f"COPY raw_reports{t} FROM STDIN") as cp:
                    cp.write(
                        "".join(
                            f"1\t{x}\t0\t{y}\t{ts}\t1\n" for x, y in zip(subj, vals, strict=True)
                        )
                    )
                with cur.copy(f"COPY raw_spend{t} FROM STDIN") as cp:
                    cp.write("".join(f"1\t{x}\t2000000000000\n" for x in subj))
            conn.commit()
        if k >= a.warm:
            cpus.append(time.process_time() - c)
            walls.append(time.perf_counter() - w)
            srv.append(pcpu(mypids) - sv)
    print(
        f"raw {form} {a.backend} batch {a.batch}: "
        f"client CPU/report {1e6 * min(cpus) / a.batch:.2f} us, "
        f"server CPU/report {1e6 * np.mean(srv) / a.batch:.2f} us, "
        f"wall min {min(walls) * 1e3:.1f} ms"
    )
    conn.close()


if a.backend == "sqlite":
    with tempfile.TemporaryDirectory() as d:
        run(f"sqlite:///{d}/b.sqlite")
else:
    import psycopg

    pg = os.environ["PRIVCAL_TEST_DATABASE_URL"]
    admin = pg.replace("postgresql+psycopg://", "postgresql://", 1)
    schema = f"prof_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
    try:
        run(f"{pg}?options={quote(f'-csearch_path={schema}')}")
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')
