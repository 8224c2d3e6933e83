"""``privcal audit``: verify the hash-chained log (and every guarantee), its head, reports.

A thin skin over :meth:`privcal.accountant.Accountant.verify`,
:func:`privcal.accountant.report.audit_report` and the ledger's head and signing
(:mod:`privcal.storage.signing`); ``--json`` on every command.
"""

from __future__ import annotations

import click

from privcal.calibrators.bound_floats import float_text
from privcal.cli import progress
from privcal.cli.app import (
    FilePath,
    Settings,
    cell,
    complete_dataset,
    emit,
    json_option,
    main,
    pass_settings,
    table,
)


@main.group()
def audit() -> None:
    """The audit log: verify it (and every guarantee), print its head, report per dataset."""


@audit.command("verify")
@click.option("--expect-head", multiple=True,
              help="SEQ:HASH kept from an earlier `privcal audit head` (repeat: every head "
                   "kept, or received from other auditors, must be in the log)")
@click.option("--signed-head", type=FilePath(), multiple=True,
              help="a file written by `privcal audit head --sign` (needs --trusted-key; "
                   "repeat: every one must be in the log)")
@click.option("--trusted-key", type=FilePath(),
              help="the Ed25519 public key (PEM) the signed head must verify with")
@click.option("--allow-unsigned-tail", is_flag=True,
              help="accept entries after the signed head (they are counted, not trusted)")
@json_option
@pass_settings
def audit_verify(settings: Settings, expect_head: tuple[str, ...],
                 signed_head: tuple[str, ...], trusted_key: str | None,
                 allow_unsigned_tail: bool, as_json: bool) -> None:
    """Recompute every hash, cross-check every row, and recompute every release's coverage and
    privacy guarantee with the installed calibrators (exit 4 naming the first bad entry).

    With --signed-head and --trusted-key, every entry must be covered by a head the key
    holder signed: an entry appended after it (or forged, chain recomputed) fails.
    Without a kept head (--expect-head or --signed-head) a log whose newest entries were
    removed, or one rewritten with every hash recomputed, verifies too: keep heads outside
    the database, every one (an older head alone does not see a rollback to it)."""
    rep = settings.accountant(existing=True).verify(expect_head=list(expect_head),
                                       signed_head=list(signed_head),
                                       trusted_key=trusted_key,
                                       allow_unsigned_tail=allow_unsigned_tail,
                                       progress=progress.iterate)
    emit({"ok": True, **rep.model_dump()}, as_json=as_json, human=rep.summary)


@audit.command("report")
@click.option("--dataset", default=None, help="Only this dataset (default: all).",
              shell_complete=complete_dataset)
@json_option
@pass_settings
def audit_report(settings: Settings, dataset: str | None, as_json: bool) -> None:
    """Per dataset: its releases in order and the budget consumed over time.

    The rows as stored: run `privcal audit verify` first, which compares every dataset,
    charge and release row with the log."""
    from privcal.accountant.report import audit_report as build

    reports = build(settings.accountant(existing=True), dataset)

    def human() -> None:
        if not reports:  # it printed nothing at all (red team 19, newcomer F12)
            click.echo("no datasets in this ledger (privcal dataset create makes one)")
        for rep in reports:
            click.secho(f"dataset {rep.dataset}: {rep.policy}, "
                        f"reporting δ={cell(rep.reporting_delta)}", bold=True)
            click.echo(f"  guarantee: {rep.guarantee}")
            click.echo("  releases:")
            click.echo(table([{
                "id": r.release, "at": r.at.strftime("%Y-%m-%d %H:%M:%S"), "method": r.method,
                "α": r.alpha, "threshold": float_text(r.threshold), "privacy": r.privacy,
            } for r in rep.releases]))
            for r in rep.releases:
                click.echo(f"    #{r.release} coverage: {r.coverage}")
                if r.assumes is not None:
                    click.echo(f"    #{r.release} assuming: {r.assumes}")
            click.echo("  budget over time:")
            click.echo(table([{
                "charge": t.charge, "at": t.at.strftime("%Y-%m-%d %H:%M:%S"), "cost": t.cost,
                "subjects": t.subjects_charged if t.subjects_charged is not None else "",
                "used after": cell(t.used_after), "spent so far after": t.spent_dp_after,
                "purpose": t.purpose or "",
            } for t in rep.timeline]))
            click.echo()

    emit(reports, as_json=as_json, human=human)


@audit.command("head")
@click.option("--sign", "keyfile", type=FilePath(),
              help="verify the log (as `audit verify`), then sign its head with this Ed25519 "
                   "private key (from `privcal audit keygen`) and print the signed head "
                   "document; nothing is signed if the log does not verify (exit 4)")
@click.option("--previous", type=FilePath(),
              help="with --sign: the last head signed with this key; the log must contain "
                   "it (a log rewritten or rolled back since is refused, exit 4)")
@json_option
@pass_settings
def audit_head(settings: Settings, keyfile: str | None, previous: str | None,
               as_json: bool) -> None:
    """Print the head SEQ:HASH (keep it outside the database), or a signed head (--sign)."""
    if previous is not None and keyfile is None:
        raise click.UsageError("--previous goes with --sign KEYFILE")
    if keyfile is not None:
        from privcal.accountant.verification import sign_head

        signed = sign_head(settings.accountant(existing=True), keyfile, previous=previous,
                           progress=progress.iterate)
        # the document itself is the artifact to keep: printed as JSON either way
        emit(signed, as_json=True)
        return
    h = settings.ledger(existing=True).head()
    emit({"seq": h.seq, "hash": h.entry_hash, "head": str(h)}, as_json=as_json, human=str(h))


@audit.command("keygen")
@click.argument("keyfile", type=FilePath())
@click.option("--public", "public", type=FilePath(),
              help="where to write the public key (default KEYFILE.pub)")
@json_option
def audit_keygen(keyfile: str, public: str | None, as_json: bool) -> None:
    """Make an Ed25519 key pair for signing audit heads: KEYFILE (private, mode 0600) and
    KEYFILE.pub. Keep the private key away from the database and its administrators."""
    from privcal.storage.signing import generate_keypair

    priv, pub, kid = generate_keypair(keyfile, public)
    emit({"private_key": str(priv), "public_key": str(pub), "key_id": kid}, as_json=as_json,
         human=f"wrote {priv} (private, keep it outside the database) and {pub} (public); "
               f"key id {kid}")
