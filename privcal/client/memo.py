"""The device's record of its sent answers, for :mod:`privcal.client.http` (standard library
only).

A memo is kept per *token*: its key is the role and the SHA-256 of the token (never the token
itself; not the server URL, which has many spellings) — what the client knows without asking
the server, since a device
or agent token is bound to one session and one subject or agent. The entry records what
``GET /v1/whoami`` said about the token when it first answered (its session and subject or
agent); a later answer that disagrees is refused before anything is drawn or sent. Each
answer is one record keyed by its own id (a report id; a local id for an agent's message),
keeping its round, so that no record is ever overwritten.

The file (JSON, version 2)::

    {"version": 2, "tokens": {KEY: {"session": 3, "subject": "alice", "server": URL,
                                    "reports": {ID: {"report_id": ID, "round": 0,
                                                     "rounds": 5, "value": 1,
                                                     "status": "accepted", "reason": null}}}}}

It is replaced atomically (mode 0600, its directory created 0700), read afresh on each use,
and, on POSIX, used under an exclusive :func:`fcntl.flock` on the sidecar ``PATH.lock``
(:meth:`Memo.locked`), so that two objects or processes sharing the file answer one at a time.
Without :mod:`fcntl` (Windows) there is no such lock: one file must not be shared by two
processes at the same time there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from privcal.errors import InvalidInput, PlanRejected

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (Windows): no lock across processes
    fcntl = None  # type: ignore[assignment]

MEMO_VERSION = 2


def token_key(role: str, token: str) -> str:
    """The memo key of a token's answers: its role and SHA-256 — not the server URL, which
    one server can be reached under several spellings (a token is bound to one server)."""
    return json.dumps([role, hashlib.sha256(token.encode("utf-8")).hexdigest()])


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text``: a 0600 temporary file in its directory (created, 0700),
    synced, then ``os.replace`` — a reader sees the old file or the new one, never part."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself durable (not on every platform)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _role_of(key: str) -> Any:
    """The role of a memo key (:func:`token_key`), or None for a key it did not make."""
    try:
        return json.loads(key)[0]
    except (ValueError, TypeError, IndexError, KeyError):
        return None


def _bound(entry: dict[str, Any]) -> dict[str, Any]:
    """What whoami said about an entry's token (its session and subject or agent)."""
    return {k: v for k, v in entry.items() if k not in ("reports", "server")}


def _describe(binding: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in sorted(binding.items()))


class Memo:
    """A client's sent answers: ``{key: {binding…, "reports": {id: record}}}``, in memory and,
    if ``path``, in a JSON file read afresh on each use (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str] | None, server: str | None = None
                 ) -> None:
        self.path = None if path is None else Path(path)
        #: the server's URL as this client spells it: an entry records it, and only entries
        #: of the same spelling share records across tokens (:meth:`reports`)
        self.server = server
        self._mem: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock on ``PATH.lock`` (POSIX ``flock``; nothing without a file
        or without :mod:`fcntl`)."""
        if self.path is None or fcntl is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _read(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            d = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"the report memo {self.path} is unreadable ({exc}); nothing "
                               "was sent (removing it lets this device answer again)") from exc
        if not isinstance(d, dict) or d.get("version") != MEMO_VERSION \
                or not isinstance(d.get("tokens"), dict):
            raise InvalidInput(f"{self.path} is not a privcal report memo (version "
                               f"{MEMO_VERSION}); nothing was sent")
        return dict(d["tokens"])

    def reports(self, key: str, binding: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The records of ``key`` (the file's, and this object's where the file has none),
        after checking that ``binding`` (whoami's session and subject or agent) is the one
        recorded: else :class:`PlanRejected`, nothing sent.

        With them, those of every *other* token of the same role bound to the same session
        and subject or agent *of the same server* (the URL as this client spells it: two
        servers may both have a session 1 and a subject "alice") (red team 11): a token
        that expired or was revoked while its answer was in flight leaves that answer
        ``pending`` — the server saw it and stored nothing — and the token an admin issues
        in its place must resend it, not draw a second independent answer of the same
        subject. This token's records come first."""
        tokens = self._read()
        out: dict[str, dict[str, Any]] = {}
        mine: dict[str, dict[str, Any]] = {}
        role = _role_of(key)
        for other, entry in [*tokens.items(), *self._mem.items()]:
            if other != key and isinstance(entry, dict) and _role_of(other) == role \
                    and self.server is not None and entry.get("server") == self.server \
                    and _bound(entry) == binding:
                for rid, rec in dict(entry.get("reports") or {}).items():
                    out.setdefault(rid, dict(rec))
        for entry in (tokens.get(key), self._mem.get(key)):
            if not entry:
                continue
            bound = _bound(entry)
            if bound and bound != binding:
                raise PlanRejected(
                    f"the server's answer about this token changed (recorded: "
                    f"{_describe(bound)}; now: {_describe(binding)}): nothing was drawn or "
                    "sent (a token is bound to one session and one subject or agent)")
            for rid, rec in dict(entry.get("reports") or {}).items():
                mine.setdefault(rid, dict(rec))
        return {**out, **mine}

    def put(self, key: str, binding: dict[str, Any], rid: str, rec: dict[str, Any]) -> None:
        """Record ``rec`` under ``rid`` (in memory, then in the file: an error if it cannot
        be written)."""
        head = {**binding, **({} if self.server is None else {"server": self.server})}
        mem = self._mem.setdefault(key, {**head, "reports": {}})
        mem["reports"][rid] = dict(rec)
        if self.path is None:
            return
        tokens = self._read()
        entry = tokens.setdefault(key, {**head, "reports": {}})
        entry.setdefault("reports", {})[rid] = dict(rec)
        write_atomic(self.path, json.dumps({"version": MEMO_VERSION, "tokens": tokens},
                                           indent=1, sort_keys=True))
