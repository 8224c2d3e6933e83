"""The refusals of a database that is not (or not wholly) a privcal ledger, before anything
is read or written: another application's tables without a privcal revision, privcal's
tables missing at the head revision, an ``immutable=1`` open that would not read the
write-ahead log (:class:`SchemaRefusals`, a part of :class:`~privcal.storage.schema.
LedgerSchema`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError

from privcal.errors import LedgerError
from privcal.storage.sqlite_uri import sqlite_uri

__all__ = ["SchemaRefusals"]


class SchemaRefusals:
    """The refusals; ``url``, ``backend``, ``_url``, ``_connect``, ``_unreachable``,
    ``head_revision``, ``_sqlite_uri`` and ``_sqlite_file`` are the Ledger's."""

    url: str
    backend: str
    _url: Any
    _connect: Any
    _unreachable: Any
    head_revision: Any
    _sqlite_uri: Any
    _sqlite_file: Any

    def other_tables(self) -> list[str]:
        """The tables of a database without a privcal revision (no ``alembic_version``, or an
        empty one: another Alembic application's after ``downgrade base``), but the tables a
        PostgreSQL extension owns (PostGIS's ``spatial_ref_sys`` in a database made from a
        PostGIS template); [] for an empty database. Called where ``current()`` is None."""
        with self._connect(write=False) as conn:
            try:
                names = set(inspect(conn).get_table_names()) - {"alembic_version"}
                if names and self.backend == "postgresql":
                    names -= set(conn.execute(text(
                        "SELECT c.relname FROM pg_class c JOIN pg_depend d ON d.objid = c.oid "
                        "AND d.deptype = 'e' WHERE c.relnamespace = "
                        "current_schema()::regnamespace")).scalars())
            except DBAPIError as exc:
                raise self._unreachable(exc) from exc
        return sorted(names)

    def _refuse_other_tables(self) -> None:
        """LedgerError if this database holds another application's tables and no privcal
        schema (red team 19, newcomer F13: a mistyped --db-url at an application's database
        was told "run `privcal db upgrade`", which then wrote privcal's tables — the
        pseudonyms' secret and the API tokens among them — beside the application's)."""
        others = self.other_tables()
        if others:
            shown = ", ".join(others[:5]) + (f", … ({len(others)} in all)"
                                             if len(others) > 5 else "")
            from privcal.storage.models import Base

            what = (f"privcal's tables ({shown}) but no privcal schema revision (its "
                    "alembic_version removed?)" if set(others) <= set(Base.metadata.tables)
                    else f"tables that are not privcal's ({shown}) and no privcal schema")
            raise LedgerError(
                f"{self.url} holds {what}: not a privcal ledger — check --db-url (privcal "
                "keeps a database of its own, or a PostgreSQL schema of its own: CREATE "
                "SCHEMA NAME, then ?options=-csearch_path=NAME in the URL)",
                public="the database holds tables and no privcal schema revision: not a "
                       "privcal ledger (the server's log names it; check its --db-url)")

    def _refuse_missing_tables(self) -> None:
        """LedgerError naming privcal's tables a ledger at the head revision lacks (a partial
        restore, a dropped table): ``db check`` said ok, ``audit verify`` was a traceback, a
        calibration charged and then failed writing its release (red team 23, ledger F3)."""
        from privcal.storage.models import Base

        with self._connect(write=False) as conn:
            try:
                have = set(inspect(conn).get_table_names())
            except DBAPIError as exc:
                raise self._unreachable(exc) from exc
        missing = sorted(set(Base.metadata.tables) - have)
        if missing:
            raise LedgerError(
                f"ledger {self.url} is at revision {self.head_revision()} but lacks privcal's "
                f"table(s) {', '.join(missing)} (restored from a partial dump, or dropped): "
                "restore them from a full backup of this ledger; nothing was read or written",
                public="the ledger lacks some of privcal's tables: an operator must restore "
                       "them")

    def _refuse_unread_wal(self) -> None:
        """LedgerError for an ``immutable=1`` open beside a ``-wal`` with frames (more than
        its 32-byte header): SQLite reads the main file only, so the transactions a running or
        killed writer committed since the last checkpoint — also in a copy or read-only mount
        taken with it — were not there: older budgets and head (red team 23, ledger F5)."""
        uri = sqlite_uri(self._url)  # as SQLite reads it: immutable=on, immutabl%65=1 too
        if uri is None or not uri.flag("immutable"):  # (red team 26, ledger F6)
            return
        path = Path(uri.path)
        wal = Path(f"{path}-wal")
        try:
            size = wal.stat().st_size
        except OSError:
            return
        if size > 32:
            raise LedgerError(
                f"the ledger {path} has a write-ahead log beside it ({wal.name}, "
                f"{size} bytes) whose transactions immutable=1 does not read (its budgets and "
                "head would be older than the ledger's): open it with mode=ro instead, or "
                "checkpoint a writable copy first (sqlite3 COPY 'PRAGMA "
                "wal_checkpoint(TRUNCATE)')",
                public="the ledger's write-ahead log is not read by an immutable open")
