"""Device reports ingested per second over HTTP by ``privcal serve``, and the latency of one
device PUT, on SQLite and PostgreSQL.

Per backend: a fresh ledger, an ldp-score session of one round of ``--reports`` users,
one device token per user (created in one transaction), then ``privcal serve --port 0``
in its own process and ``--procs`` load processes each driving ``--concurrency``
concurrent HTTP/1.1 keep-alive connections, every device putting its one report once.
The load generator (``--client``) is by default a raw asyncio-socket client (tens of µs
of CPU per request; ``httpx`` costs ≈ 1 ms, which on a 2-core machine starves the server).
Reports/s is accepted reports over the wall time from the first request to the last answer; p50/p99
are per-request latencies seen by the clients. The server writes the reports through its
write window (``--report-window``, group commit: what arrives while a batch is written
goes into the next one): one ``submit_reports`` transaction per session per batch. The
server's CPU per report (user+sys of its process) is the figure that does not depend on
the machine's load; on PostgreSQL so is the CPU of the database backends serving the
server's connections (found by their ``application_name``). Checks at the end: every
report accepted, session released, audit verify passes.

    python bench/service_bench.py --pg postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _db import PG_DEFAULT, Row, print_table, run_backends


def _load(args: tuple[str, int, list[str], int, float, str]) -> tuple[
        int, list[float], float, float, dict[int, int], float]:
    """One load process: ``concurrency`` keep-alive connections putting one report per token.

    ``client`` "raw" (default) writes pre-formatted HTTP/1.1 requests on asyncio sockets and
    reads the status line and ``Content-Length`` body (tens of µs of CPU per request, so the
    load generator leaves the cores to the server); "httpx" uses ``httpx.AsyncClient``
    (≈ 1 ms of CPU per request: on a 2-core machine it measures the client as much as the
    server).
    """
    base, sid, tokens, concurrency, start_at, client = args
    cpu0 = time.process_time()
    if client == "httpx":
        out = _load_httpx(base, sid, tokens, concurrency, start_at)
    else:
        out = _load_raw(base, sid, tokens, concurrency, start_at)
    return (*out, time.process_time() - cpu0)


def _load_raw(base: str, sid: int, tokens: list[str], concurrency: int, start_at: float
              ) -> tuple[int, list[float], float, float, dict[int, int]]:
    from urllib.parse import urlsplit

    u = urlsplit(base)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    body = b'{"round":0,"value":1}'
    head = (f"PUT /v1/sessions/{sid}/reports/r1 HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Authorization: Bearer ").encode()
    reqs = [head + tok.encode() + b"\r\n\r\n" + body for tok in tokens]

    async def main() -> tuple[int, list[float], float, float, dict[int, int]]:
        lat: list[float] = []
        codes: dict[int, int] = {}
        it = iter(reqs)
        conns = [await asyncio.open_connection(host, port) for _ in range(concurrency)]
        while time.time() < start_at:
            await asyncio.sleep(0.001)
        t0 = time.perf_counter()

        async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for req in it:
                s = time.perf_counter()
                writer.write(req)
                status_head = await reader.readuntil(b"\r\n\r\n")
                code = int(status_head[9:12])
                m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", status_head)
                await reader.readexactly(int(m.group(1)) if m else 0)
                lat.append(time.perf_counter() - s)
                codes[code] = codes.get(code, 0) + 1
            writer.close()

        await asyncio.gather(*(worker(r, w) for r, w in conns))
        t1 = time.perf_counter()
        return codes.get(201, 0), lat, t0, t1, codes

    return asyncio.run(main())


def _load_httpx(base: str, sid: int, tokens: list[str], concurrency: int, start_at: float
                ) -> tuple[int, list[float], float, float, dict[int, int]]:
    import httpx

    async def main() -> tuple[int, list[float], float, float, dict[int, int]]:
        lat: list[float] = []
        codes: dict[int, int] = {}
        it = iter(tokens)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as c:
            while time.time() < start_at:
                await asyncio.sleep(0.001)
            t0 = time.perf_counter()

            async def worker() -> None:
                for tok in it:
                    s = time.perf_counter()
                    r = await c.put(f"/v1/sessions/{sid}/reports/r1",
                                    json={"round": 0, "value": 1},
                                    headers={"Authorization": f"Bearer {tok}"})
                    lat.append(time.perf_counter() - s)
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            t1 = time.perf_counter()
        return codes.get(201, 0), lat, t0, t1, codes

    return asyncio.run(main())


def _cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its child processes (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:  # fields[1]: the parent pid
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _pg_backend_cpu(url: str, app: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving connections named ``app`` (the server
    must run on this machine): the database's share of a report, which does not depend on
    the machine's load either."""
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as c:
        pids = [r[0] for r in c.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))]
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def bench(url: str, backend: str, *, reports: int, procs: int, concurrency: int,
          window: float, workers: int, profile: str | None = None,
          client: str = "raw") -> list[Row]:
    from privcal.accountant import Accountant
    from privcal.accountant.sessions import open_session, session_status
    from privcal.storage import Ledger
    from privcal.storage.token_bulk import create_device_tokens

    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("bench", rho="1", subject_epsilon="10")
    sess = open_session(acct, "ldp-score", dataset="bench", alpha=0.1, epsilon=2.0, rounds=1,
                        group_size=reports, requester="bench")
    t = time.perf_counter()
    tokens = create_device_tokens(led, sess.id, [f"u{i}" for i in range(reports)])
    t_tok = time.perf_counter() - t
    app = f"privcal_bench_{os.getpid()}"
    server_url = url
    if backend == "postgresql":  # the server's connections, named to find their backends
        server_url = f"{url}{'&' if '?' in url else '?'}application_name={app}"
    env = {**os.environ, "PRIVCAL_DATABASE_URL": server_url}
    proc = subprocess.Popen([sys.executable, "-c", "from privcal.cli import main; main()",
                             "serve", "--port", "0", "--log-level", "warning",
                             "--report-window", str(window), "--workers", str(workers)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"(http://\S+)", line)
        if not m:
            raise SystemExit(f"server did not start: {line}{proc.stderr.read()}")
        base = m.group(1)
        import httpx

        deadline = time.monotonic() + 180
        while True:  # every worker process answers once the first does; allow for a slow start
            try:
                if httpx.get(base + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not become ready")
            time.sleep(0.05)
        time.sleep(2.0 if workers > 1 else 0.0)
        start_at = time.time() + 1.0
        chunks = [tokens[i::procs] for i in range(procs)]
        spy = None
        if profile:  # py-spy (pip install py-spy) samples the server while the load runs
            spy = subprocess.Popen(["py-spy", "record", "--subprocesses", "--format", "raw",
                                    "-o", f"{profile}.{backend}.txt", "--pid", str(proc.pid)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu0 = _cpu(proc.pid)
        db0 = _pg_backend_cpu(url, app) if backend == "postgresql" else {}
        with mp.get_context("spawn").Pool(procs) as pool:
            outs = pool.map(_load, [(base, sess.id, ch, concurrency, start_at, client)
                                  for ch in chunks])
        cpu = _cpu(proc.pid) - cpu0
        db1 = _pg_backend_cpu(url, app) if backend == "postgresql" else {}
        db_cpu = sum(v - db0.get(pid, 0.0) for pid, v in db1.items())
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ok = sum(o[0] for o in outs)
    lat = sorted(x for o in outs for x in o[1])
    wall = max(o[3] for o in outs) - min(o[2] for o in outs)
    codes: dict[int, int] = {}
    for o in outs:
        for k, v in o[4].items():
            codes[k] = codes.get(k, 0) + v
    client_cpu = sum(o[5] for o in outs)
    st = session_status(acct, sess.id)
    rep = acct.verify()
    led.close()
    p50 = statistics.median(lat) * 1000
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000
    return [
        {"backend": backend, "measurement": f"{reports:,} device PUTs ({procs}×{concurrency} "
         f"connections, {workers} server process(es), window {window * 1000:g} ms)",
         "result": f"{ok / wall:,.0f} reports/s ({ok:,} accepted in {wall:.2f} s; codes "
                   f"{dict(sorted(codes.items()))}; session {st.status})"},
        {"backend": backend, "measurement": "device PUT latency",
         "result": f"p50 {p50:.1f} ms, p99 {p99:.1f} ms"},
        {"backend": backend, "measurement": "server CPU per report (user+sys, all its threads "
         "and worker processes; the load-independent cost)",
         "result": f"{cpu / max(ok, 1) * 1000:.2f} ms/report ({cpu:.1f} CPU-s; capacity on "
                   f"2 idle cores ≈ {2 * max(ok, 1) / max(cpu, 1e-9):,.0f} reports/s if the "
                   "server had them to itself)"},
        *([{"backend": backend, "measurement": "PostgreSQL backends' CPU per report (the "
             "server's connections; load-independent)",
             "result": f"{db_cpu / max(ok, 1) * 1000:.2f} ms/report ({db_cpu:.1f} CPU-s)"}]
          if backend == "postgresql" else []),
        {"backend": backend, "measurement": f"load generator ({client}) CPU per request",
         "result": f"{client_cpu / max(len(lat), 1) * 1000:.2f} ms/request "
                   f"({client_cpu:.1f} CPU-s in {procs} processes)"},
        {"backend": backend, "measurement": "setup: device tokens created",
         "result": f"{reports:,} in {t_tok:.1f} s; audit verify ok ({rep.entries} entries)"
                   if hasattr(rep, "entries") else f"{reports:,} in {t_tok:.1f} s"},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL URL (default: "
                    "$PRIVCAL_TEST_DATABASE_URL; none: SQLite only)")
    ap.add_argument("--reports", type=int, default=20_000)
    ap.add_argument("--procs", type=int, default=2, help="load-generating processes")
    ap.add_argument("--concurrency", type=int, default=128, help="connections per process")
    ap.add_argument("--report-window", type=float, default=0.004)
    ap.add_argument("--workers", type=int, default=1, help="privcal serve --workers")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="load generator: raw asyncio sockets (cheap) or httpx.AsyncClient")
    ap.add_argument("--profile", default=None, help="py-spy the server: PREFIX.BACKEND.txt "
                    "(collapsed stacks)")
    a = ap.parse_args()
    rows = run_backends(lambda url, b: bench(url, b, reports=a.reports, procs=a.procs,
                                             concurrency=a.concurrency,
                                             window=a.report_window,
                                             workers=a.workers, profile=a.profile,
                                             client=a.client), a.pg)
    print_table(rows)


if __name__ == "__main__":
    main()
