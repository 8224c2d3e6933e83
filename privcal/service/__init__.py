"""``privcal serve``: the HTTP service (FastAPI), a thin layer over the library.

Needs the ``server`` extra (``pip install 'privcal[server]'``; from a clone
``pip install '.[server]'``). :func:`create_app` builds the application; see
``shared/SERVICE.md`` and the README, "Run the service".
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def create_app(*args: Any, **kwargs: Any) -> Any:
    """The FastAPI app (imported on call, so ``import privcal.service`` stays light)."""
    from privcal.service.app import create_app as _create

    return _create(*args, **kwargs)
