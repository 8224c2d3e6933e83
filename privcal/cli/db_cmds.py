"""``privcal db``: the ledger's schema (Alembic revisions shipped in privcal/migrations/)."""

from __future__ import annotations

from privcal.cli.app import Settings, emit, json_option, main, pass_settings


@main.group()
def db() -> None:
    """Ledger schema: upgrade, current, check."""


@db.command("upgrade")
@json_option
@pass_settings
def db_upgrade(settings: Settings, as_json: bool) -> None:
    """Create or migrate the ledger schema to this privcal's revision."""
    ledger = settings.ledger()
    rev = ledger.upgrade()
    emit({"url": ledger.url, "revision": rev}, as_json=as_json,
         human=f"ledger {ledger.url} at revision {rev}")


@db.command("current")
@json_option
@pass_settings
def db_current(settings: Settings, as_json: bool) -> None:
    """Print the ledger's schema revision."""
    ledger = settings.ledger()
    rev = ledger.current()
    emit({"url": ledger.url, "revision": rev, "head": ledger.head_revision()}, as_json=as_json,
         human=f"{rev or '(empty)'} (this privcal: {ledger.head_revision()})")


@db.command("check")
@json_option
@pass_settings
def db_check(settings: Settings, as_json: bool) -> None:
    """Exit 0 if the schema is current, 5 if `privcal db upgrade` is needed."""
    ledger = settings.ledger()
    rev = ledger.check()
    emit({"url": ledger.url, "revision": rev, "ok": True}, as_json=as_json,
         human=f"ok: ledger {ledger.url} at revision {rev}")
