"""A full LDP-CP-S session over HTTP at scale: ``--devices`` simulated devices (default
20 000), each with its own device token, report concurrently through a real
``privcal serve --port 0`` (its own process) from a bounded thread pool, with the
project's device client (``privcal.client.Reporter``: read the round's public query,
randomize locally, put the report; a report refused because its round filled meanwhile
is answered again in the next round). ``--retry-fraction`` of the devices then re-send
their exact request (an HTTP retry): each must be answered 200 ``duplicate`` and counted
once. At the end: the session released with n = devices, the auditor's head read over
HTTP, and ``privcal audit verify --expect-head SEQ:HASH`` — a separate CLI process on
the same database — recomputes the chain up to that head.

    python bench/service_scale.py --devices 20000 --threads 32 [--pg URL]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))
from _db import Row, print_table, run_backends


def run(url: str, backend: str, *, devices: int, rounds: int, threads: int,
        retry_fraction: float, window: float) -> list[Row]:
    import httpx

    from privcal.accountant import Accountant
    from privcal.accountant.sessions import open_session, session_status
    from privcal.client import Reporter
    from privcal.storage import Ledger
    from privcal.storage.token_bulk import create_device_tokens
    from privcal.storage.tokens import create_token

    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("scale", rho="1", subject_epsilon="10")
    sess = open_session(acct, "ldp-score", dataset="scale", alpha=0.1, epsilon=2.0,
                        rounds=rounds, group_size=devices // rounds, requester="bench")
    t = time.perf_counter()
    tokens = create_device_tokens(led, sess.id, [f"dev-{i}" for i in range(devices)])
    auditor = create_token(led, "auditor", name="bench-auditor").token
    t_tok = time.perf_counter() - t
    env = {**os.environ, "PRIVCAL_DATABASE_URL": url}
    proc = subprocess.Popen([sys.executable, "-c", "from privcal.cli import main; main()",
                             "serve", "--port", "0", "--log-level", "warning",
                             "--report-window", str(window)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env)
    codes: dict[str, int] = {}
    lock = threading.Lock()
    rng = random.Random(7)
    scores = [rng.random() for _ in range(devices)]
    retry = set(rng.sample(range(devices), int(retry_fraction * devices)))
    try:
        assert proc.stderr is not None
        m = re.search(r"(http://\S+)", proc.stderr.readline())
        if not m:
            raise SystemExit("the server did not start")
        base = m.group(1)
        limits = httpx.Limits(max_connections=threads, max_keepalive_connections=threads)
        shared = httpx.Client(base_url=base, timeout=120, limits=limits)

        def count(what: str) -> None:
            with lock:
                codes[what] = codes.get(what, 0) + 1

        def device(i: int) -> None:
            rep = Reporter(base, tokens[i], client=shared, retries=5)
            out = rep.report(scores[i], report_id=f"r{i}", answer_again=True)
            count(out["status"])
            if i in retry:  # the same request again, as a client retries a lost answer
                r = shared.put(f"/v1/sessions/{sess.id}/reports/{out['report_id']}",
                               json={"round": out["round"], "value": out["value"]},
                               headers={"Authorization": f"Bearer {tokens[i]}"})
                count("retry→duplicate" if r.status_code == 200 and
                      r.json()["status"] == "duplicate" else f"retry→{r.status_code}")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(device, i) for i in range(devices)]:
                f.result()
        wall = time.perf_counter() - t0
        head = shared.get("/v1/audit/head",
                          headers={"Authorization": f"Bearer {auditor}"}).json()
        shared.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    st = session_status(acct, sess.id)
    expect = f"{head['seq']}:{head['hash']}"
    t = time.perf_counter()
    cli = subprocess.run([sys.executable, "-c", "from privcal.cli import main; main()",
                          "audit", "verify", "--expect-head", expect, "--json"],
                         capture_output=True, text=True, env=env)
    t_verify = time.perf_counter() - t
    verdict = json.loads(cli.stdout) if cli.returncode == 0 else {"ok": False,
                                                                  "error": cli.stderr[-300:]}
    rel = acct.release(st.release_id) if getattr(st, "release_id", None) else None
    led.close()
    ok = verdict.get("ok", cli.returncode == 0)
    return [
        {"backend": backend, "measurement": f"{devices:,} devices, own tokens, {threads} "
         f"threads, LDP-CP-S T = {rounds}, window {window * 1000:g} ms",
         "result": f"{devices / wall:,.0f} devices/s ({wall:.1f} s; answers "
                   f"{dict(sorted(codes.items()))}; session {st.status}"
                   + (f", release shape {rel.shape}" if rel is not None else "") + ")"},
        {"backend": backend, "measurement": "privcal audit verify --expect-head (CLI process)",
         "result": f"exit {cli.returncode}, ok {ok}, head {head['seq']} ({t_verify:.1f} s)"},
        {"backend": backend, "measurement": "setup: device tokens created",
         "result": f"{devices:,} in {t_tok:.1f} s"},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", default=None, help="also on PostgreSQL at this URL")
    ap.add_argument("--devices", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--retry-fraction", type=float, default=0.05)
    ap.add_argument("--report-window", type=float, default=0.004)
    a = ap.parse_args()
    rows = run_backends(lambda url, b: run(url, b, devices=a.devices, rounds=a.rounds,
                                           threads=a.threads, retry_fraction=a.retry_fraction,
                                           window=a.report_window), a.pg)
    print_table(rows)


if __name__ == "__main__":
    main()
