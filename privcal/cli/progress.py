"""Progress of long work on the command line: a transient rich bar on stderr.

A command wraps long work in :func:`task` and calls the returned ``advance``::

    with progress.task("calibrating pcoqs on 10⁶ rows", None, size=n):
        release = run_calibration(...)

and hands :func:`iterate` to a library call that reports its own steps (the audit
verification: ``Accountant.verify(progress=iterate)``; the library itself knows no bar).
Without a listener this costs one context-variable lookup per task (``advance`` is a
no-op). :class:`privcal.cli.app.PrivcalGroup` installs the rich bar (:func:`rich_listener`)
only when stderr is a terminal and ``--json`` is off, and only for work of at least
:data:`MIN_TOTAL` steps, so that scripts, pipes and JSON consumers never see it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

__all__ = ["MIN_TOTAL", "Listener", "iterate", "listening", "rich_listener", "task"]

T = TypeVar("T")

#: work smaller than this many steps (rows, entries) shows no bar (it is over before a bar
#: would help); ``PRIVCAL_PROGRESS_MIN`` overrides it (the tests set it to 0)
MIN_TOTAL = 20_000


def _min_total() -> int:
    try:
        return int(os.environ.get("PRIVCAL_PROGRESS_MIN", MIN_TOTAL))
    except ValueError:
        return MIN_TOTAL


class Listener(Protocol):
    def start(self, description: str, total: int | None) -> Any: ...
    def advance(self, handle: Any, steps: int) -> None: ...
    def stop(self, handle: Any) -> None: ...


_listener: ContextVar[Listener | None] = ContextVar("privcal_progress", default=None)


def _noop(steps: int = 1) -> None:
    return None


@contextmanager
def task(description: str, total: int | None, *, size: int | None = None) -> Iterator[
        Callable[[int], None]]:
    """Report ``total`` steps of work (``None``: one indivisible piece of work, shown as a
    pulsing bar with the time elapsed); yields ``advance(steps=1)``. ``size`` (default
    ``total``) is the amount of work that decides whether it is long enough to show."""
    listener = _listener.get()
    amount = size if size is not None else total
    if listener is None or amount is None or amount < _min_total():
        yield _noop
        return
    handle = listener.start(description, None if total is None else max(int(total), 1))

    def advance(steps: int = 1) -> None:
        listener.advance(handle, steps)

    try:
        yield advance
    finally:
        listener.stop(handle)


def iterate(items: Iterable[T], description: str, total: int) -> Iterator[T]:
    """``items``, reporting one step per item (``total`` of them expected)."""
    with task(description, total) as advance:
        for item in items:
            yield item
            advance()


@contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    """Install ``listener`` for the work done inside the block (``None``: nothing shown)."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


class _RichListener:
    """A transient rich progress bar on stderr."""

    def __init__(self) -> None:
        self.progress: Any = None  # rich is imported when a bar is first shown
        self.active = 0

    def _make(self) -> Any:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        return Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=Console(stderr=True), transient=True,
        )

    def start(self, description: str, total: int | None) -> Any:
        if self.progress is None:
            self.progress = self._make()
        if self.active == 0:
            self.progress.start()
        self.active += 1
        return self.progress.add_task(description, total=total)

    def advance(self, handle: Any, steps: int) -> None:
        self.progress.advance(handle, steps)

    def stop(self, handle: Any) -> None:
        self.progress.remove_task(handle)
        self.active -= 1
        if self.active == 0:
            self.progress.stop()


def rich_listener(*, as_json: bool, stream: Any) -> Listener | None:
    """A rich progress bar if ``stream`` (stderr) is a terminal and ``--json`` is off."""
    isatty = getattr(stream, "isatty", None)
    if as_json or not (callable(isatty) and isatty()):
        return None
    return _RichListener()
