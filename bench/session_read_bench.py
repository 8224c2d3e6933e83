"""Server CPU per device read of its session's public state (``GET /v1/sessions/{sid}``, what
``privcal.client.Reporter`` reads before each report), on SQLite and PostgreSQL.

Per backend: a fresh ledger, an ldp-score session, ``--reads`` device tokens (one
transaction), ``privcal serve --port 0`` in its own process, then each token reads the
session once over keep-alive HTTP/1.1 connections from ``--threads`` threads. The server's
CPU per read (user+sys of its process, and on PostgreSQL of the database backends serving
its connections) is the figure that does not depend on the machine's load. Run it with
``PYTHONPATH`` set to another checkout to measure that server.

    python bench/session_read_bench.py --reads 4000 --pg postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))
from _db import PG_DEFAULT, Row, print_table, run_backends
from service_bench import _cpu, _pg_backend_cpu


def bench(url: str, backend: str, *, reads: int, threads: int) -> list[Row]:
    from privcal.accountant import Accountant
    from privcal.accountant.sessions import open_session
    from privcal.storage import Ledger
    from privcal.storage.token_bulk import create_device_tokens

    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("bench", rho="1", subject_epsilon="10")
    sess = open_session(acct, "ldp-score", dataset="bench", alpha=0.1, epsilon=2.0, rounds=1,
                        group_size=reads, requester="bench")
    tokens = create_device_tokens(led, sess.id, [f"u{i}" for i in range(reads)])
    led.close()
    app = f"privcal_read_bench_{os.getpid()}"
    server_url = url
    if backend == "postgresql":
        server_url = f"{url}{'&' if '?' in url else '?'}application_name={app}"
    proc = subprocess.Popen([sys.executable, "-c", "from privcal.cli import main; main()",
                             "serve", "--port", "0", "--log-level", "warning"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PRIVCAL_DATABASE_URL": server_url})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"http://([^:/]+):(\d+)", line)
        if not m:
            raise SystemExit(f"server did not start: {line}{proc.stderr.read()}")
        host, port = m.group(1), int(m.group(2))
        deadline = time.monotonic() + 120
        while True:
            try:
                c = http.client.HTTPConnection(host, port, timeout=60)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not become ready")
            time.sleep(0.05)
        chunks = [tokens[i::threads] for i in range(threads)]

        def reader(toks: list[str]) -> dict[int, int]:
            conn = http.client.HTTPConnection(host, port, timeout=120)
            codes: dict[int, int] = {}
            for tok in toks:
                conn.request("GET", f"/v1/sessions/{sess.id}",
                             headers={"Authorization": f"Bearer {tok}"})
                r = conn.getresponse()
                r.read()
                codes[r.status] = codes.get(r.status, 0) + 1
            conn.close()
            return codes

        cpu0 = _cpu(proc.pid)
        db0 = _pg_backend_cpu(url, app) if backend == "postgresql" else {}
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            outs = list(ex.map(reader, chunks))
        wall = time.perf_counter() - t0
        cpu = _cpu(proc.pid) - cpu0
        db1 = _pg_backend_cpu(url, app) if backend == "postgresql" else {}
        db = sum(v - db0.get(pid, 0.0) for pid, v in db1.items())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    codes: dict[int, int] = {}
    for o in outs:
        for k, v in o.items():
            codes[k] = codes.get(k, 0) + v
    return [{"backend": backend, "measurement": f"{reads:,} device reads of the session "
             f"({threads} threads)",
             "result": f"server {cpu / reads * 1000:.2f} ms CPU/read"
                       + (f", database {db / reads * 1000:.2f} ms" if backend == "postgresql"
                          else "")
                       + f"; {reads / wall:,.0f} reads/s (wall, load-dependent); codes "
                       f"{dict(sorted(codes.items()))}"}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL URL (default: "
                    "$PRIVCAL_TEST_DATABASE_URL; none: SQLite only)")
    ap.add_argument("--reads", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args()
    print_table(run_backends(lambda url, b: bench(url, b, reads=a.reads, threads=a.threads),
                             a.pg))


if __name__ == "__main__":
    main()
