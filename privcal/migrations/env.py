"""Alembic environment of the privcal ledger.

privcal calls Alembic programmatically and passes an open connection in
``config.attributes["connection"]`` (already holding the upgrade lock: a
PostgreSQL advisory lock, or SQLite ``BEGIN IMMEDIATE``). Run from the
command line, the URL comes from ``sqlalchemy.url`` or $PRIVCAL_DATABASE_URL.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy.engine import Connection

from privcal.storage.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode copies the table (MLflow/Airflow do the same)
        render_as_batch=connection.dialect.name == "sqlite",
        # with pysqlite's own transaction handling off (privcal.storage.engine), SQLite DDL is
        # transactional, so a failed upgrade leaves the schema as it was
        transactional_ddl=True,
        compare_type=True,
    )
    with context.begin_transaction():
        # under the upgrade lock: what this run migrates from (another run that held the
        # lock first may have migrated already: red team 23, ledger F6)
        config.attributes["from_revision"] = context.get_context().get_current_revision()
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from privcal.storage.engine import make_engine

    url = config.get_main_option("sqlalchemy.url") or os.environ.get("PRIVCAL_DATABASE_URL")
    if not url:
        raise SystemExit("set sqlalchemy.url or PRIVCAL_DATABASE_URL")
    engine = make_engine(url)
    with engine.connect() as conn:
        _run(conn.execution_options(privcal_write=True))
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported for the privcal ledger")
run_migrations_online()
