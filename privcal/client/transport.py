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

__all__ = ["ServiceError", "check_options", "is_number", "positive_finite", "request"]


class ServiceError(PrivcalError):
    """The service answered with a problem document (``status``, ``type``, ``detail``)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem


def check_options(timeout: Any, retries: Any) -> tuple[float, int]:
    """``timeout`` (seconds, a finite number > 0) and ``retries`` (an integer ≥ 0), or a
    one-line :class:`InvalidInput` when the client is made — not at its first call."""
    if not is_number(timeout) or not positive_finite(timeout):
        raise InvalidInput(f"timeout must be a positive number of seconds, not {timeout!r}")
    if isinstance(retries, bool) or not isinstance(retries, numbers.Integral) or retries < 0:
        raise InvalidInput(f"retries must be a whole number ≥ 0, not {retries!r}")
    return float(timeout), int(retries)


def is_number(x: Any) -> bool:
    """A real number as a caller may hold one (int, float, NumPy's, Decimal), not a bool."""
    return not isinstance(x, bool | np_bool()) and isinstance(x, numbers.Real | Decimal)


def positive_finite(x: Any) -> bool:
    """``x`` (a number) is finite and > 0 (a Decimal sNaN, which float() refuses, is not)."""
    try:
        return 0 < float(x) < math.inf
    except (TypeError, ValueError, OverflowError):
        return False


def np_bool() -> type:
    """NumPy's bool type if NumPy is loaded (the client does not import it for this)."""
    import sys

    np = sys.modules.get("numpy")
    return np.bool_ if np is not None else bool


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
