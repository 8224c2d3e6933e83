"""Shared by the ledger benchmarks: run one benchmark on SQLite and on PostgreSQL, print a table.

SQLite runs in a temporary file; PostgreSQL in a scratch schema of the database
named by ``pg`` (a SQLAlchemy ``postgresql+psycopg://`` URL), dropped afterwards.
"""

from __future__ import annotations

import os
import platform
import tempfile
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


def print_table(rows: list[Row]) -> None:
    """One markdown table row per (backend, measurement), after a Python/cores line."""
    print(f"# {platform.python_version()}, {os.cpu_count()} cores")
    w = max(len(r["measurement"]) for r in rows)
    print(f"| backend | {'measurement'.ljust(w)} | result |")
    print(f"|---|{'-' * (w + 2)}|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['measurement'].ljust(w)} | {r['result']} |")
