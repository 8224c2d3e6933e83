#!/usr/bin/env python3
"""Check a privcal audit log without privcal: an auditor's own verifier (README, "Checking the
log with your own code").

    python verify_log.py --url https://privcal.example --token-file auditor.token \\
        [--expect-head SEQ:HASH ...] [--signed-head head.json ... --trusted-key audit.key.pub] \\
        [--save entries.json]
    python verify_log.py --entries entries.json [...]

It fetches every entry with ``GET /v1/audit/entries`` (an ``auditor`` or ``admin`` token), or
reads a list of entries saved earlier, and checks, with the standard library only (the
``cryptography`` package for signed heads):

- every payload is the RFC 8785 text of ``{"seq", "kind", "data"}`` (re-serialised here, byte
  for byte) and records its own entry's seq and kind;
- the chain: ``leaf = SHA-256(0x00 ‖ payload)``, ``entry = SHA-256(0x01 ‖ prev ‖ leaf)`` on the
  raw 32-byte digests, ``prev`` of entry 1 all zeros, entries 1, 2, 3, … without a gap;
- every kept head (``--expect-head``) and every signed head (``--signed-head``, Ed25519 over the
  RFC 8785 text of ``{"format", "seq", "hash", "time"}``) is in the log.

Prints the head ``SEQ:HASH`` to keep for next time; exits 0 if everything holds, 4 naming the
first entry that does not. It does not recompute guarantees or budgets (``privcal audit
verify`` does, on a copy of the database); it needs no trust in the server that sent the log.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import re
import sys
import urllib.error
import urllib.request
from typing import Any

GENESIS = bytes(32)


def jcs(value: Any) -> str:
    """RFC 8785 text of a JSON value without floats (privcal writes every non-integer number
    as a decimal string): members sorted by the UTF-16 code units of their names, strings
    escaped as ECMAScript's JSON.stringify does (what ``json.dumps`` writes for one string)."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-16-be"))
        return "{" + ",".join(f"{jcs(k)}:{jcs(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(jcs(v) for v in value) + "]"
    if isinstance(value, float):
        raise ValueError("a JSON number with a fraction or exponent: not a privcal payload")
    return json.dumps(value, ensure_ascii=False)


def fetch(url: str, token: str, page: int = 1000) -> list[dict[str, Any]]:
    """Every entry, page by page (``after`` = the last seq received; an empty page ends)."""
    out: list[dict[str, Any]] = []
    while True:
        after = out[-1]["seq"] if out else 0
        req = urllib.request.Request(f"{url.rstrip('/')}/v1/audit/entries?after={after}"
                                     f"&limit={page}",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            got = json.load(resp)
        if not isinstance(got, list) or not all(isinstance(e, dict) and "seq" in e for e in got):
            raise ValueError("its answer is not a page of audit entries (another service?)")
        if not got:
            return out
        out.extend(got)


class Failed(Exception):
    """The log does not verify: the message names the first entry that does not."""


def check_chain(entries: list[dict[str, Any]]) -> str:
    """The head ``SEQ:HASH`` of ``entries`` if they form a privcal log; else Failed — also
    for an entry that is not of a privcal log's form (a payload that is not a JSON object's
    text, a float or NaN in it, a hash that is not hex: the server is the party the auditor
    does not trust, so each is a log that does not verify, not a crash: red team 20,
    service F5)."""
    prev = GENESIS
    for i, e in enumerate(entries, start=1):
        where = f"entry {e.get('seq') if isinstance(e, dict) else i}"
        try:
            prev = _check_entry(e, i, prev, where)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise Failed(f"{where}: not an entry of a privcal log ({type(exc).__name__}: "
                         f"{(str(exc).splitlines() or [''])[0][:120]})") from None
    return f"{len(entries)}:{prev.hex()}"


def _check_entry(e: dict[str, Any], i: int, prev: bytes, where: str) -> bytes:
    """Entry ``i`` checked against the previous hash ``prev``; its own hash."""
    if e.get("seq") != i:
        raise Failed(f"{where}: expected entry {i} (an entry missing, or out of order)")
    text = e["payload"]
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise Failed(f"{where}: the payload is not a JSON object")
    if jcs(doc) != text:
        raise Failed(f"{where}: the payload is not RFC 8785 text")
    if doc.get("seq") != i or doc.get("kind") != e.get("kind"):
        raise Failed(f"{where}: the payload records seq {doc.get('seq')} kind "
                     f"{doc.get('kind')!r}")
    if bytes.fromhex(e["prev_hash"]) != prev:
        raise Failed(f"{where}: prev_hash is not the previous entry's hash")
    leaf = hashlib.sha256(b"\x00" + text.encode("utf-8")).digest()
    h = hashlib.sha256(b"\x01" + prev + leaf).digest()
    if h.hex() != e["entry_hash"]:
        raise Failed(f"{where}: the hash does not match its payload")
    return h


def check_head(entries: list[dict[str, Any]], seq: int, hash_hex: str, what: str) -> None:
    """Failed unless the log holds entry ``seq`` with ``hash_hex`` (0: the empty log)."""
    if seq > len(entries):
        raise Failed(f"entry {len(entries) + 1}: missing; the {what} is entry {seq} (entries "
                     "removed, a rollback, or another history)")
    have = entries[seq - 1]["entry_hash"] if seq else GENESIS.hex()
    if have != hash_hex.lower():
        raise Failed(f"entry {seq}: its hash differs from the {what} (log rewritten, or "
                     "another history)")


def check_signed(doc: dict[str, Any], public_pem: bytes) -> tuple[int, str]:
    """(seq, hash) of a signed head whose Ed25519 signature holds; else Failed."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    msg = jcs({k: doc[k] for k in ("format", "seq", "hash", "time")}).encode("utf-8")
    try:
        load_pem_public_key(public_pem).verify(  # type: ignore[union-attr, call-arg]
            base64.b64decode(doc["signature"], validate=True), msg)  # type: ignore[arg-type]
    except (InvalidSignature, ValueError) as exc:
        raise Failed(f"signed head {doc['seq']}:{doc['hash']} (signed {doc['time']}): the "
                     "signature does not verify with the trusted key") from exc
    return int(doc["seq"]), str(doc["hash"])


class Unusable(Exception):
    """The entries cannot be had: a file or the server, and why."""


def _entries(a: argparse.Namespace) -> list[dict[str, Any]]:
    """The entries from ``--url`` (with the token in ``--token-file``) or ``--entries``,
    saved to ``--save`` if given; Unusable naming what failed."""
    try:
        if a.url:
            with open(a.token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
            try:
                entries = fetch(a.url, token)
            except urllib.error.HTTPError as exc:
                why = {401: "the token is not valid (revoked, expired or mistyped)",
                       403: "this needs an auditor's (or an admin's) token"}.get(exc.code, "")
                raise Unusable(f"{a.url} answered {exc.code} {exc.reason}"
                               + (f": {why}" if why else "")) from None
            except (urllib.error.URLError, http.client.HTTPException, ValueError,
                    OSError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise Unusable(f"cannot read the log from {a.url}: {reason}") from None
        else:
            with open(a.entries, encoding="utf-8") as fh:
                entries = json.load(fh)
        if a.save:
            with open(a.save, "w", encoding="utf-8") as fh:
                json.dump(entries, fh)
    except OSError as exc:
        raise Unusable(f"{exc.filename}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise Unusable(f"{a.entries}: not a JSON list of entries ({exc})") from None
    keys = {"seq", "payload", "prev_hash", "entry_hash"}
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and keys <= e.keys() for e in entries):
        raise Unusable(f"{a.url or a.entries}: not a list of privcal audit entries (each with "
                       f"{', '.join(sorted(keys))})")
    return entries


_KEPT = re.compile(r"([0-9]{1,18}):([0-9a-fA-F]{64})")
_SIGNED_KEYS = ("format", "seq", "hash", "time", "signature")


def _heads(a: argparse.Namespace) -> tuple[list[tuple[int, str, str]], bytes | None,
                                            list[tuple[str, dict[str, Any]]]]:
    """The kept heads (seq, hash, as given), the trusted key and the signed heads (file,
    document), each checked for its form first: Unusable naming the one that is not (red
    team 21, service F6: a malformed --expect-head or signed-head file was a traceback)."""
    kept = []
    for text in a.expect_head:
        m = _KEPT.fullmatch(text.strip())
        if m is None:
            raise Unusable(f"--expect-head {text[:80]!r}: not SEQ:HASH (an entry number and "
                           "64 hex digits, as the last run printed it)")
        kept.append((int(m.group(1)), m.group(2), text))
    pem, signed = None, []
    if a.signed_head:
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        try:
            with open(a.trusted_key, "rb") as fh:
                pem = fh.read()
            load_pem_public_key(pem)
        except OSError as exc:
            raise Unusable(f"{exc.filename}: {exc.strerror}") from None
        except (ValueError, TypeError) as exc:
            raise Unusable(f"{a.trusted_key}: not a PEM public key ({exc})") from None
        for path in a.signed_head:
            try:
                with open(path, encoding="utf-8") as fh:
                    doc = json.load(fh)
            except OSError as exc:
                raise Unusable(f"{exc.filename}: {exc.strerror}") from None
            except ValueError:  # not JSON, not UTF-8
                doc = None
            if not (isinstance(doc, dict) and set(_SIGNED_KEYS) <= doc.keys()
                    and type(doc["seq"]) is int and doc["seq"] >= 0
                    and all(isinstance(doc[k], str) for k in _SIGNED_KEYS if k != "seq")
                    and re.fullmatch(r"[0-9a-fA-F]{64}", doc["hash"])):
                raise Unusable(f"{path}: not a privcal signed head (a JSON object with "
                               f"{', '.join(_SIGNED_KEYS)}: `privcal audit head --sign` writes it)")
            signed.append((path, doc))
    return kept, pem, signed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="the privcal service")
    src.add_argument("--entries", help="a JSON list of entries saved earlier (--save)")
    ap.add_argument("--token-file", help="a file holding an auditor token (with --url)")
    ap.add_argument("--expect-head", action="append", default=[], help="SEQ:HASH (repeat)")
    ap.add_argument("--signed-head", action="append", default=[], help="a file (repeat)")
    ap.add_argument("--trusted-key", help="the signer's public key (PEM)")
    ap.add_argument("--save", help="write the entries fetched to this file")
    a = ap.parse_args(argv)
    if a.url and not a.token_file:
        ap.error("--url needs --token-file")
    if a.signed_head and not a.trusted_key:
        ap.error("--signed-head needs --trusted-key")
    try:
        kept, pem, signed = _heads(a)
        entries = _entries(a)
    except Unusable as exc:  # one line, not a traceback (red team 19, newcomer F5)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        head = check_chain(entries)
        for seq, h, text in kept:
            check_head(entries, seq, h, f"kept head {text}")
        for path, doc in signed:
            seq, h = check_signed(doc, pem)  # type: ignore[arg-type]
            check_head(entries, seq, h, f"signed head in {path}")
    except Failed as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 4
    print(f"ok: {len(entries)} entries chain to the head {head}; keep it outside the "
          f"database and pass it next time (--expect-head)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
