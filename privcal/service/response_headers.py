"""The headers every response of ``privcal serve`` carries.

- ``Cache-Control: no-store``: the service's answers hold budgets, releases, audit entries,
  subjects' counts and, once, a token's secret; no browser or proxy cache may keep one
  (OWASP API security: sensitive responses are not cached). A response that sets its own
  ``Cache-Control`` keeps it (the web view's stylesheet and icon, which hold nothing
  private).
- ``X-Content-Type-Options: nosniff``: a JSON or problem document is never run as a script
  or a page because a browser guessed its type.

uvicorn's ``Server: uvicorn`` header is not sent (:func:`privcal.service.server_options.
uvicorn_options`): it told any client, before authentication, what to attack.
"""

from __future__ import annotations

__all__ = ["STANDARD_HEADERS", "with_standard_headers"]

#: the standard headers, as ASGI header pairs (for responses built by hand on the lean paths)
STANDARD_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"))


def with_standard_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` (an ASGI response's, names lower-case) with each standard header it does
    not set already appended."""
    have = {name for name, _ in headers}
    missing = [h for h in STANDARD_HEADERS if h[0] not in have]
    return [*headers, *missing] if missing else headers
