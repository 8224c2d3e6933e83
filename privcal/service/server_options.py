"""The ``uvicorn.Config`` options of every ``privcal serve`` worker: privcal's HTTP/1.1
connection (:mod:`privcal.service.http_protocol`) and the server's limits."""

from __future__ import annotations

from typing import Any

from privcal.service.http_protocol import BoundedHttpTools

__all__ = ["connection_limit", "uvicorn_options"]


def connection_limit() -> int:
    """Open connections (and tasks) one worker process serves at once before answering 503
    (uvicorn's ``limit_concurrency``): half the process's file-descriptor limit — the rest is
    the ledger's connections, files and the listening socket — and at least 64 (512 where
    the limit cannot be read: no ``resource`` module on Windows)."""
    try:
        import resource
    except ImportError:
        return 512
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(64, soft // 2)


def uvicorn_options() -> dict[str, Any]:
    """The ``uvicorn.Config`` options of every ``privcal serve`` worker (and of the service
    tests' server): :class:`BoundedHttpTools`, :func:`connection_limit`, idle kept-alive
    connections closed after 30 s, no access log of uvicorn's own (the app writes one:
    :mod:`privcal.service.app`), the app's lifespan run, and no ``Server: uvicorn`` header
    (:mod:`privcal.service.response_headers`)."""
    return {"http": BoundedHttpTools, "limit_concurrency": connection_limit(),
            "timeout_keep_alive": 30, "backlog": 2048, "access_log": False, "lifespan": "on",
            "server_header": False}
