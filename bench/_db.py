"""Shared by the ledger benchmarks: run one benchmark on SQLite and on PostgreSQL, print a table.

SQLite runs in a temporary file; PostgreSQL in a scratch schema of the database
named by ``pg`` (a SQLAlchemy ``postgresql+psycopg://`` URL), dropped afterwards.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
import uuid
from collections.abc import Callable
from urllib.parse import quote

Row = dict[str, str]

#: the default for --pg
PG_DEFAULT = os.environ.get("PRIVCAL_TEST_DATABASE_URL")


def run_backends(bench: Callable[[str, str], list[Row]], pg: str | None) -> list[Row]:
    """``bench(url, backend)`` on SQLite, then on PostgreSQL if ``pg`` is given."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as d:
        rows += bench(f"sqlite:///{d}/bench.sqlite", "sqlite")
    if pg:
        import psycopg

        admin = pg.replace("postgresql+psycopg://", "postgresql://", 1)
        schema = f"privcal_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'CREATE SCHEMA "{schema}"')
        try:
            sep = "&" if "?" in pg else "?"
            rows += bench(f"{pg}{sep}options={quote(f'-csearch_path={schema}')}", "postgresql")
        finally:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return rows


def _loop(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def interpreter_ms(n: int = 1_000_000, rounds: int = 5) -> float:
    """Milliseconds the interpreter takes for ``n`` turns of a plain Python loop (best of
    ``rounds``): the machine's speed at pure-Python work. A charge is mostly such work plus
    the database's commit, and raw inserts are mostly the commit, so the ratio of the two
    depends on the machine: compare runs from different machines with this figure beside
    them (bench/RESULTS.md, issue 11)."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        _loop(n)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def print_table(rows: list[Row]) -> None:
    """One markdown table row per (backend, measurement), after a line naming Python, the
    cores and the interpreter's speed (:func:`interpreter_ms`)."""
    print(
        f"# {platform.python_version()}, {os.cpu_count()} cores; interpreter: a 10⁶-turn "
        f"Python loop in {interpreter_ms():.0f} ms"
    )
    w = max(len(r["measurement"]) for r in rows)
    print(f"| backend | {'measurement'.ljust(w)} | result |")
    print(f"|---|{'-' * (w + 2)}|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['measurement'].ljust(w)} | {r['result']} |")
