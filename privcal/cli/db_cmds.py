"""``privcal db``: the ledger's schema (Alembic revisions shipped in privcal/migrations/)."""

from __future__ import annotations

import click

from privcal.cli.app import Settings, emit, json_option, main, pass_settings


@main.group()
def db() -> None:
    """Ledger schema: upgrade, current, check."""


@db.command("upgrade")
@click.option("--beside-other-tables", is_flag=True,
              help="create privcal's schema in a database that holds another application's "
                   "tables (refused without it: its secret and API tokens would sit beside "
                   "them)")
@json_option
@pass_settings
def db_upgrade(settings: Settings, beside_other_tables: bool, as_json: bool) -> None:
    """Create or migrate the ledger schema to this privcal's revision.

    Stop every older privcal using the ledger first (a server, a job): it would go on
    writing in its own way. A migration may restate a dataset's guarantee, always more
    conservatively (e.g. 0004: (ε, δ) charges accepted under the old rule): read `privcal
    budget show` again for each dataset after one ran. A database that holds another
    application's tables and no privcal schema is refused (a mistyped --db-url), unless
    --beside-other-tables."""
    ledger = settings.ledger()
    before = ledger.current()
    rev = ledger.upgrade(beside_other_tables=beside_other_tables)
    # the revision found under the upgrade lock: a concurrent `db upgrade` that migrated
    # first leaves this one nothing to do (red team 23, ledger F6: both said "migrated")
    before = getattr(ledger, "upgraded_from", before) if before is not None else None
    migrated = before is not None and before != rev

    def human() -> None:
        if migrated:
            click.echo(f"ledger {ledger.url} migrated from revision {before} to {rev}; "
                       "a migration may restate a dataset's guarantee (more conservatively): "
                       "read `privcal budget show` again for each dataset")
        else:
            click.echo(f"ledger {ledger.url} at revision {rev}")

    emit({"url": ledger.url, "revision": rev, "from_revision": before}, as_json=as_json,
         human=human)


@db.command("current")
@json_option
@pass_settings
def db_current(settings: Settings, as_json: bool) -> None:
    """Print the ledger's schema revision."""
    ledger = settings.ledger(existing=True)
    rev = ledger.current()
    emit({"url": ledger.url, "revision": rev, "head": ledger.head_revision()}, as_json=as_json,
         human=f"{rev or '(empty)'} (this privcal: {ledger.head_revision()})")


@db.command("check")
@json_option
@pass_settings
def db_check(settings: Settings, as_json: bool) -> None:
    """Exit 0 if the schema is current, 5 if `privcal db upgrade` is needed."""
    ledger = settings.ledger(existing=True)
    rev = ledger.check()
    emit({"url": ledger.url, "revision": rev, "ok": True}, as_json=as_json,
         human=f"ok: ledger {ledger.url} at revision {rev}")
