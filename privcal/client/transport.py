"""One HTTP request of a device or agent to ``privcal serve``, retried on a transport error
or a 503 with the same body (:mod:`privcal.client.http` sends every call through it), and the
error a problem document becomes (:class:`ServiceError`)."""

from __future__ import annotations

import math
import numbers
import time
from decimal import Decimal
from typing import Any

from privcal.errors import InvalidInput, PrivcalError

__all__ = ["ServiceError", "check_options", "positive_number", "request"]


class ServiceError(PrivcalError):
    """The service answered with a problem document (``status``, ``type``, ``detail``)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem


def check_options(timeout: Any, retries: Any) -> tuple[float, int]:
    """``timeout`` (seconds, a finite number > 0) and ``retries`` (an integer ≥ 0), or a
    one-line :class:`InvalidInput` when the client is made — not at its first call."""
    if not positive_number(timeout):
        raise InvalidInput(f"timeout must be a positive number of seconds, not {timeout!r}")
    if isinstance(retries, bool) or not isinstance(retries, numbers.Integral) or retries < 0:
        raise InvalidInput(f"retries must be a whole number ≥ 0, not {retries!r}")
    return float(timeout), int(retries)


def positive_number(x: Any) -> bool:
    """``x`` is a finite number > 0 as a caller may hold one — an int, a float, NumPy's (its
    bool is not a ``numbers.Real``), a Decimal (its sNaN, which float() refuses, is not) —
    and not a bool."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real | Decimal):
        return False
    try:
        return 0 < float(x) < math.inf
    except (TypeError, ValueError, OverflowError):
        return False


def request(http: Any, method: str, path: str, headers: dict[str, str], retries: int,
            **kw: Any) -> Any:
    """Send one request with ``http`` (an httpx client); a transport error or a 503 is
    retried up to ``retries`` times with the same body (exponential back-off from 50 ms);
    an answer ≥ 400 is a :class:`ServiceError` carrying its problem document."""
    import httpx

    delay = 0.05
    for attempt in range(retries + 1):
        try:
            r = http.request(method, path, headers=headers, **kw)
        except httpx.TransportError:
            if attempt == retries:
                raise
            time.sleep(delay)
            delay *= 2
            continue
        if r.status_code == 503 and attempt < retries:
            time.sleep(delay)
            delay *= 2
            continue
        if r.status_code >= 400:
            try:
                prob = r.json()
            except ValueError:
                prob = {"detail": r.text}
            raise ServiceError(r.status_code, prob)
        return r
    raise AssertionError("unreachable")  # pragma: no cover - retries ≥ 0 (check_options)
