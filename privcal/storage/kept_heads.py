"""Kept audit heads as :meth:`privcal.storage.Ledger.verify` takes them: one or several
``SEQ:HASH`` texts (or signed heads), each checked against the log."""

from __future__ import annotations

from typing import Any

from privcal.errors import InvalidInput

__all__ = ["parse_head", "several"]


def several(x: Any) -> list[Any]:
    """``x`` as a list: None → [], a list or tuple → itself, anything else → [x]."""
    if x is None:
        return []
    return list(x) if isinstance(x, list | tuple) else [x]


def parse_head(expect_head: Any) -> tuple[int, str]:
    """(seq, hash) of a kept head ``SEQ:HASH`` (InvalidInput if it is not one)."""
    if not isinstance(expect_head, str):
        raise InvalidInput("expect_head must be SEQ:HASH text (an integer and 64 hex "
                           f"digits), got {type(expect_head).__name__}")
    try:
        seq_s, hash_s = expect_head.strip().split(":", 1)
        want = (int(seq_s), hash_s.lower())
        bytes.fromhex(want[1])
        if len(want[1]) != 64 or want[0] < 0:
            raise ValueError
    except ValueError as exc:
        raise InvalidInput("--expect-head must be SEQ:HASH (an integer and 64 hex digits), "
                           f"got {expect_head!r}") from exc
    return want
