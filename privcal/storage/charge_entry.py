"""A charge's audit entry, written straight from its columns: the charge's hot path (issue 11).

:func:`charge_prefix` is ``entry_prefix("charge", charge_doc(row, name))`` — the RFC 8785 text
of the charge's entry up to its sequence number (:func:`privcal.storage.audit.payload_at`) —
built from the column → value dict the charge is inserted with, in one pass: RFC 8785 orders
a charge document's ASCII keys as :func:`sorted` does, so the key order is fixed here, and
each value is a None, a safe integer, a string or a Decimal (text: :func:`_text`). Anything
else (a lone surrogate, an unsafe integer, another type) takes the generic writer instead.
``audit verify`` recomputes every entry from :func:`~privcal.storage.audit.charge_doc` with
``rfc8785``; tests/test_hot_path.py checks the two agree byte for byte.
"""

from __future__ import annotations

from decimal import Decimal
from json.encoder import encode_basestring as _encode_str  # type: ignore[attr-defined]
from types import SimpleNamespace
from typing import Any

from privcal.storage.audit import _flat_text, charge_doc, dec, entry_prefix, iso

__all__ = ["charge_prefix"]


def _text(v: Any) -> str | None:
    """The RFC 8785 text of one charge column's value, or None if it is not written here."""
    t = type(v)
    if t is str and v.isascii():  # the usual case; else _flat_text checks the UTF-8
        return _encode_str(v)  # type: ignore[no-any-return]
    if t is Decimal:
        return f'"{dec(v)}"'  # digits, ".", "-": nothing to escape
    return _flat_text(v)


def _opt(key: str, v: Any) -> tuple[str, str | None] | tuple[()]:
    """An optional key's part of the document (absent when ``v`` is None: charge_doc)."""
    return () if v is None else (key, _text(v))


def charge_prefix(charge_id: int, values: dict[str, Any], dataset_name: str) -> str:
    """The entry prefix of the charge ``charge_id`` whose columns (all but ``id``) are
    ``values`` on the dataset named ``dataset_name`` (module docstring)."""
    v = values
    n = "null"
    parts = (
        '{"data":{"charge_id":', _text(charge_id),
        ',"created_at":"', iso(v["created_at"]),
        '","dataset":', _text(dataset_name),
        ',"dataset_id":', _text(v["dataset_id"]),
        ',"delta":', n if (x := v["delta"]) is None else _text(x),
        ',"eps0":', n if (x := v["eps0"]) is None else _text(x),
        ',"epsilon":', n if (x := v["epsilon"]) is None else _text(x),
        ',"idempotency_key":', n if (x := v["idempotency_key"]) is None else _text(x),
        *_opt(',"members_digest":', v["members_digest"]),
        ',"notion":', _text(v["notion"]),
        ',"purpose":', n if (x := v["purpose"]) is None else _text(x),
        *_opt(',"request_digest":', v["request_digest"]),
        ',"requester":', n if (x := v["requester"]) is None else _text(x),
        ',"rho":', n if (x := v["rho"]) is None else _text(x),
        ',"scope":', _text(v["scope"]),
        ',"subjects_accepted":', n if (x := v["subjects_accepted"]) is None else _text(x),
        ',"subjects_rejected":', n if (x := v["subjects_rejected"]) is None else _text(x),
        '},"kind":"charge","seq":',
    )
    if None in parts:  # a value written only by the generic writer (which may refuse it)
        row = SimpleNamespace(id=charge_id, **values)
        return entry_prefix("charge", charge_doc(row, dataset_name))  # type: ignore[arg-type]
    return "".join(parts)  # type: ignore[arg-type]
