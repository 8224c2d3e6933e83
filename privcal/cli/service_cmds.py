"""``privcal serve`` and ``privcal token create|list|revoke``.

Tokens are managed on the ledger directly (not over HTTP), so the first admin token
can be created before the service runs. A new token is printed once; only its SHA-256
is stored.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import click

from privcal.cli.app import FilePath, emit, info, json_option, main, pass_settings, table
from privcal.cli.number_types import FloatRange, Integer, IntRange
from privcal.errors import InvalidInput

_DURATION = re.compile(r"^([0-9]+)([smhdw])$")  # \d is any Unicode digit: not "１d"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


#: the longest --expires: 10 years, privcal.storage.token_secrets.MAX_LIFETIME (not imported:
#: it would load the ledger's stack for `privcal --help`)
_MAX_EXPIRES = 10 * 366 * 86400


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``30d``, ``2w`` → a timedelta (InvalidInput otherwise)."""
    m = _DURATION.match(text.strip())
    if not m or int(m.group(1)) <= 0:
        raise InvalidInput(f"--expires must be a positive duration like 90s, 15m, 12h, 30d or "
                           f"2w, got {text!r}")
    seconds = int(m.group(1)) * _UNITS[m.group(2)]
    if seconds > _MAX_EXPIRES:  # a date past year 9999 overflows (red team 5)
        raise InvalidInput(f"--expires is at most 10 years (3660d), got {text!r}")
    return timedelta(seconds=seconds)


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=8321, show_default=True, type=IntRange(0, 65535),
              help="port (0: a free one, printed on stderr)")
@click.option("--max-body", default=16 * 1024 * 1024, show_default=True,
              type=IntRange(1024), help="request body limit in bytes (413 above)")
@click.option("--report-window", default=0.004, show_default=True,
              type=FloatRange(0.0, 1.0), help="seconds device reports are gathered "
              "before one batched write")
@click.option("--workers", default=1, show_default=True, type=IntRange(1, 64),
              help="server processes sharing the port (each opens the ledger and batches its "
              "own reports)")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@pass_settings
def serve(settings: Any, host: str, port: int, max_body: int, report_window: float,
          workers: int, log_level: str) -> None:
    """Run the HTTP service on the ledger (needs the server extra: `pip install
    'privcal[server]'`, from a clone `pip install '.[server]'`).

    Prints where it listens on stderr once the port is bound; with --json, also one JSON
    document on stdout: {"listening": URL, "port": N, "workers": N}."""
    import logging
    import socket
    import sys

    try:
        import uvicorn

        from privcal.service.app import create_app
        from privcal.service.server_options import uvicorn_options
    except ImportError as exc:
        raise InvalidInput(f"privcal serve needs the server extra: pip install "
                           f"'privcal[server]' (from a clone: pip install '.[server]') "
                           f"({exc})") from None
    import os

    ledger = settings.ledger(existing=True)  # a typo in --db-url serves no new empty ledger
    ledger.ensure_schema()  # refuse a stale schema before binding (names `privcal db upgrade`)
    from privcal.accountant import Accountant

    logging.basicConfig(level=getattr(logging, log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise InvalidInput(f"cannot bind {host}:{port}: {exc}") from None
    sock.listen(2048)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    info(f"listening on http://{shown}:{bound}")
    if settings.as_json:  # the one document, as soon as the port is known (--port 0)
        emit({"listening": f"http://{shown}:{bound}", "port": bound, "workers": workers},
             as_json=True)
        sys.stdout.flush()
    if workers == 1:
        app: Any = create_app(accountant=Accountant(ledger), body_limit=max_body,
                              report_window=report_window)
        config = uvicorn.Config(app, log_level=log_level, **uvicorn_options())
        uvicorn.Server(config).run(sockets=[sock])
        return
    # several processes on one socket: each builds the app from these variables
    from uvicorn.supervisors import Multiprocess

    from privcal.storage.engine import resolve_url

    os.environ["PRIVCAL_SERVE_DB_URL"] = resolve_url(settings.db_url)[0]
    os.environ["PRIVCAL_SERVE_BODY_LIMIT"] = str(max_body)
    os.environ["PRIVCAL_SERVE_REPORT_WINDOW"] = str(report_window)
    config = uvicorn.Config("privcal.service.app:app_from_env", factory=True,
                            log_level=log_level, workers=workers, **uvicorn_options())
    Multiprocess(config, sockets=[sock]).run()


@main.group("token")
def token() -> None:
    """API tokens of the HTTP service: create (shown once), list, revoke."""


@token.command("create")
@click.option("--role", required=True,
              type=click.Choice(["admin", "analyst", "auditor", "device", "agent", "ingestor"]))
@click.option("--name", help="who this is (recorded as requester role:name)")
@click.option("--dataset", "datasets", multiple=True, help="dataset granted (analyst; repeat)")
@click.option("--session", "session_id", type=Integer(), help="session (device, agent, ingestor)")
@click.option("--subject", help="the device's subject id")
@click.option("--agent", help="the federated agent's id")
@click.option("--expires", help="lifetime: 90s, 15m, 12h, 30d, 2w (default: no expiry)")
@click.option("--count", type=IntRange(1, 1_000_000),
              help="device tokens in bulk: N tokens for --session, one per subject (with "
              "--subject-prefix or --subjects), in one transaction; printed as lines "
              "'SUBJECT<TAB>TOKEN' (--json: a list)")
@click.option("--subject-prefix", help="with --count N: subjects PREFIX0 … PREFIX{N-1}")
@click.option("--subjects", "subjects_file", type=FilePath(allow_dash=True),
              help="device tokens in bulk for the subject ids in this file: a .csv/.parquet/"
              ".npy/.npz read as calibrate --subjects reads it (FILE:COLUMN), any other file "
              "one id per line (blank lines skipped; '-': stdin, read as lines — give a "
              "table by its file name); --count, if given, must match")
@json_option
@pass_settings
def token_create(settings: Any, role: str, name: str | None, datasets: tuple[str, ...],
                 session_id: int | None, subject: str | None, agent: str | None,
                 expires: str | None, count: int | None, subject_prefix: str | None,
                 subjects_file: str | None, as_json: bool) -> None:
    """Create a token — or, with --count/--subjects, one device token per subject of a
    session; every token is printed this once (only its hash is stored).

    \b
    privcal token create --role device --session 1 --count 1000 --subject-prefix phone-
    privcal token create --role device --session 1 --subjects devices.txt --json
    """
    from privcal.accountant import Accountant
    from privcal.service.bound_tokens import create_bound_token

    # an empty --expires (a script's `--expires "$TTL"` with TTL unset) is a malformed
    # duration, not "no expiry" (red team 24, service F1: it minted a permanent token)
    expires_in = parse_duration(expires) if expires is not None else None
    if count is not None or subject_prefix is not None or subjects_file is not None:
        _create_device_tokens(settings, role, name, datasets, session_id, subject, agent,
                              expires_in, count, subject_prefix, subjects_file, as_json)
        return
    # a token bound to a dataset or session needs it in an existing ledger (red team 24, F3)
    needs = {"analyst": "a dataset", "admin": False, "auditor": False}.get(role, "a session")
    new = create_bound_token(
        Accountant(settings.ledger(existing=needs)), role, name=name, datasets=list(datasets),
        session=session_id, subject=subject, agent=agent, expires_in=expires_in)
    if not as_json:
        info(f"token {new.id} ({role}) created; it is shown only now:")
    emit({"id": new.id, "token": new.token, "info": new.info}, as_json=as_json,
         human=new.token)


def _subjects_file(path: str) -> list[str]:
    """``--subjects FILE``'s ids. A ``.csv/.parquet/.npy/.npz`` file (``FILE:COLUMN`` too)
    is read as ``calibrate --subjects`` and ``session submit`` read it — its header, CSV
    quoting, text cells (:func:`~privcal.data.files.load_array`) — so that one person has one
    id, and one per-subject cap, on every path (red team 21, flows M1: the README's
    ``user_ids.csv`` read as lines gave a token to the header and to ``"Smith, J"`` with its
    quotes, a second id and cap for a person the calibrations charge as ``Smith, J``). Any
    other file (or ``-``, stdin: a table piped in is read as lines — the review of red team
    21 found its header made a token; the help says to give a table by its name): one id per
    line, and a line holding a double quote — a table's quoting, not an id — is refused,
    naming the line, and so is an integer spelled as a float (``7.0``: what pandas'
    ``to_csv`` writes of an integer id column with a missing value — another person than
    ``7`` to the per-subject caps; the table readers' rule, red team 22 flows F2)."""
    from privcal.calibrators.validation import check_not_float_spelled
    from privcal.data.files import array_file, load_array

    if path != "-" and array_file(path):
        return [str(x) for x in load_array(path, "subjects", ids=True).tolist()]
    try:
        # utf-8-sig: a list saved with a byte-order mark (Windows Notepad) reads like any
        # other, as privcal's CSV reader does, rather than with U+FEFF on its first id
        with click.open_file(path, encoding="utf-8-sig") as f:
            lines = [line.rstrip("\r\n") for line in f]
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"--subjects {path}: cannot read it: {exc}") from None
    for i, line in enumerate(lines, 1):
        if '"' in line:
            raise InvalidInput(
                f"--subjects {path}: line {i} ({line[:40]!r}) holds a double quote — a "
                "table's quoting? Name the file .csv to have it read as a table (as "
                "calibrate --subjects reads it), or give one plain id per line")
        try:
            check_not_float_spelled([line], f"--subjects {path}")
        except InvalidInput as exc:  # named by its line, as the quote is
            raise InvalidInput(str(exc).replace(": row 0 ", f": line {i} ", 1)) from None
    return [x for x in lines if x.strip()]


def _bulk_subjects(count: int | None, prefix: str | None, path: str | None) -> list[str]:
    """The subjects of ``token create --count/--subject-prefix/--subjects``."""
    if (prefix is None) == (path is None):
        raise InvalidInput("device tokens in bulk need exactly one of --subject-prefix P "
                           "(with --count N: subjects P0 … P{N-1}) or --subjects FILE")
    if path is None:
        if count is None:
            raise InvalidInput("--subject-prefix needs --count N")
        return [f"{prefix}{i}" for i in range(count)]
    subs = _subjects_file(path)
    if not subs:
        raise InvalidInput(f"--subjects {path}: no subject ids in it")
    if count is not None and count != len(subs):
        raise InvalidInput(f"--count {count} but --subjects {path} holds {len(subs)} ids")
    return subs


def _create_device_tokens(settings: Any, role: str, name: str | None,
                          datasets: tuple[str, ...], session_id: int | None,
                          subject: str | None, agent: str | None, expires_in: Any,
                          count: int | None, prefix: str | None, path: str | None,
                          as_json: bool) -> None:
    """``token create --count/--subjects``: one device token per subject, one transaction."""
    from privcal.accountant import Accountant
    from privcal.service.bound_tokens import create_bound_device_tokens
    from privcal.storage.tokens import presented_token

    if role != "device":
        raise InvalidInput(f"--count/--subjects create device tokens; got --role {role}")
    if session_id is None:
        raise InvalidInput("device tokens in bulk need --session")
    given = [o for o, v in (("--name", name), ("--dataset", datasets), ("--subject", subject),
                            ("--agent", agent)) if v is not None and v != ()]
    if given:
        raise InvalidInput(f"{', '.join(given)} cannot be used with --count/--subjects "
                           "(each token is named by its id and bound to its own subject)")
    subs = _bulk_subjects(count, prefix, path)
    toks = create_bound_device_tokens(Accountant(settings.ledger(existing="a session")),
                                      session_id, subs, expires_in)
    rows = [{"subject": sub, "id": (presented_token(tok) or ("", ""))[0], "token": tok}
            for sub, tok in zip(subs, toks, strict=True)]
    if not as_json:
        info(f"{len(rows)} device tokens for session {session_id} created; they are shown "
             "only now (SUBJECT<TAB>TOKEN):")
    emit(rows, as_json=as_json,
         human=lambda: click.echo("".join(f"{r['subject']}\t{r['token']}\n" for r in rows),
                                  nl=False))


@token.command("list")
@json_option
@pass_settings
def token_list(settings: Any, as_json: bool) -> None:
    """Every token: id, role, bindings, expiry, revocation (never a secret)."""
    from privcal.storage.tokens import list_tokens

    toks = list_tokens(settings.ledger(existing=True))
    emit(toks, as_json=as_json, human=lambda: click.echo(table([
        {"id": t.id, "role": t.role, "name": t.name, "datasets": ",".join(t.datasets),
         "session": t.session or "", "subject": t.subject or "", "agent": t.agent or "",
         "expires": t.expires_at.isoformat(timespec="seconds") if t.expires_at else "never",
         "revoked": t.revoked_at.isoformat(timespec="seconds") if t.revoked_at else ""}
        for t in toks])))


@token.command("revoke")
@click.argument("token_id")
@json_option
@pass_settings
def token_revoke(settings: Any, token_id: str, as_json: bool) -> None:
    """Revoke a token now (every later request with it is 401)."""
    from privcal.storage.tokens import revoke_token

    t = revoke_token(settings.ledger(existing=True), token_id)
    emit(t, as_json=as_json, human=f"token {t.id} revoked at {t.revoked_at}")
