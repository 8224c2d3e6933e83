"""Calibrator versions as a release records them: which wording a version's sentences have.

A clause added to a recorded guarantee from some version on (red teams 14 and 15: who
answered, who reports) is stated by releases of that version and later only, so that
``privcal audit verify`` recomputes an older release's sentences as they were written.
"""

from __future__ import annotations

__all__ = ["at_least", "clause_since"]


def at_least(version: str, since: str) -> bool:
    """``version`` ≥ ``since``, both dotted integers (``"1.4.0"``, or ``"5"``); a version that
    is not is not (red team 15: ``"x.y"`` gave a bare ValueError)."""
    try:
        return tuple(map(int, version.split("."))) >= tuple(map(int, since.split(".")))
    except ValueError:
        return False


def clause_since(text: str, version: str, since: str) -> str:
    """``"; " + text`` for a release of calibrator ``version`` ≥ ``since`` (older releases
    recorded no such clause), else ``""``."""
    return f"; {text}" if at_least(version, since) else ""
