"""The HTTP/1.1 connection: uvicorn's httptools protocol with a bounded request head, body
time, response time and pipeline.

uvicorn's httptools protocol reads a request line and headers of any size, on the event loop,
and appends each received piece to the bytes read so far (quadratic): one unauthenticated
connection sending a 100 MiB header froze every other client for 28 s, and a connection
that sends part of a head and then nothing was never closed (red team 18, httpsec F1/F2:
~20 000 such connections exhausted the process's file descriptors). uvicorn has no limit of
its own for either (its h11 protocol has a size limit but no time limit, and is slower).

:class:`BoundedHttpTools` closes a connection

- that has sent more than :data:`MAX_HEAD_BYTES` without completing a request head (request
  line and headers), answering 431 (RFC 6585) with a problem document — so a head is read
  at a cost linear in that limit (a complete head that arrives in one read, at most the
  transport's read size, is parsed as uvicorn does);
- that has not completed a request head :data:`HEAD_TIMEOUT_S` seconds after it was opened
  or after the head's first byte arrived (answering 408 if it sent part of one);
- whose request body is late (answering 408 if no response was started, else closing):
  :data:`BODY_TIMEOUT_S` seconds after its head, plus one second per
  :data:`BODY_MIN_RATE` bytes of body received so far (Apache's ``mod_reqtimeout`` rule,
  ``body=20,MinRate=4096``). A body that never came was held for ever, by anyone: a report's
  token (a made-up one will do) is checked only after its body, and ``/ui/login`` is public,
  so 140 stalled bodies took every slot of a worker limited to 128 connections and every
  request, ``/healthz`` included, was answered 503 until the client let go (red team 21,
  service F7).

  What a real client needs: a device report (under 1 KiB) or a login form arrives with its
  head or a round trip later, far inside 20 s; an upload of the largest body
  (``--max-body``, 16 MiB by default) is never cut while it averages at least 4 KiB/s
  (32 kbit/s, slower than a 2G EDGE link; 16 MiB at that rate takes 68 min) — the rate is
  an average since the head, so stalls of a few seconds in a faster upload cost nothing.
  Time the server itself is not reading is not the client's delay: while uvicorn stops
  reading past 64 KiB until the app asks for more, the body's clock stands still (it moves
  on by the pause when reading resumes, the bytes received kept); a client that waits for a
  ``100 Continue`` is timed from the 100 (:meth:`BoundedHttpTools._watch_reads`). To hold a
  connection, a client must keep sending at least 4 KiB/s on it — bursts past 64 KiB that
  pause the server included (the review of red team 21: a restart at each resume let a
  client at 3.2 KiB/s in 66 KB bursts hold one for ever).

A request's header fields are those of its head: the trailer fields after a chunked body's
last chunk (which llhttp reports as header fields too, and uvicorn appended to the headers of
the request already handed to the app) are ignored — a request whose head had no token was
authenticated, and keyed, by its trailer (red team 22, service F3; RFC 9110 §6.5.1). A
transfer coding other than ``chunked`` alone (``gzip, chunked``: the body was read as if it
were not gzip-coded) is answered 501 (RFC 9112 §6.1), the connection closed after it.

A connection whose client does not take its answers is reset, its requests ended as
disconnected: a client that never read its responses held its connection and task for ever,
unauthenticated, and 64 of them made every request 503 (red team 22, service F1). The send
clock runs while answers wait for the client — writing paused (asyncio's buffer past 64 KiB,
until it is down to 16 KiB) or the connection closed with bytes unsent — and cuts the
connection when, in :data:`SEND_TIMEOUT_S` seconds, the client took fewer than
:data:`SEND_TIMEOUT_S` × :data:`SEND_MIN_RATE` bytes (80 KiB) of them (so fewer waiting must
all go in that time); else it starts again. What is counted is the bytes written and not yet
acknowledged by the client: asyncio's buffer plus, on Linux, the kernel's send queue
(``TIOCOUTQ``). So a client that reads at least 4 KiB/s is never cut, however large the
answer — one written at once (a ``JSONResponse``) included: the clock was the pause's
length, which for one write lasts until nearly all of it is sent, and a 2 MiB answer read at
39 KiB/s was cut after 20 s (the review of red team 22, R1). Elsewhere only asyncio's buffer
is counted, which moves when the kernel's send buffer has room again: there a reader near
the rate behind a large kernel buffer may be cut. At most :data:`MAX_PIPELINED` pipelined
requests are queued (uvicorn: any number); the one that reaches it is answered with
``Connection: close``, and nothing after it is read.

Bodies are bounded in size by the app (``--max-body``, 413) and idle kept-alive connections
by uvicorn's ``timeout_keep_alive``; the number of open connections by ``limit_concurrency``
(:mod:`privcal.service.server_options`), beyond which a request is answered 503
``server-busy`` (a problem document, ``Retry-After: 1``). A public deployment still belongs
behind a reverse proxy (TLS, per-client rate limits and connection counts: README "Run the
service").

Size: one protocol class whose hooks (the head's, the body's and the send clocks, the
pipeline) share the connection's state and uvicorn's; split, each part would reach into the
others'.
"""

from __future__ import annotations

import socket
import struct
import sys
from asyncio import TimerHandle, Transport
from typing import Any

from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from privcal.service.problems import ProblemError, problem_response
from privcal.service.response_headers import with_standard_headers

__all__ = ["BODY_MIN_RATE", "BODY_TIMEOUT_S", "HEAD_TIMEOUT_S", "MAX_HEAD_BYTES",
           "MAX_PIPELINED", "SEND_MIN_RATE", "SEND_TIMEOUT_S", "BoundedHttpTools"]

#: bytes read of a request head (request line + headers) that is still incomplete, at most
#: (nginx's default ``large_client_header_buffers`` is 4 × 8 KiB)
MAX_HEAD_BYTES = 32 * 1024
#: seconds a connection may take to send a complete request head
HEAD_TIMEOUT_S = 20.0
#: seconds a request's body may take after its head, before the credit of :data:`BODY_MIN_RATE`
#: (a report or a form comes with its head or a round trip later)
BODY_TIMEOUT_S = 20.0
#: bytes per second of body a slow upload must average to be never cut: each
#: ``BODY_MIN_RATE`` bytes received extend the body's deadline by one second (4 KiB/s =
#: 32 kbit/s: the default 16 MiB ``--max-body`` takes 68 min at that rate; module docstring)
BODY_MIN_RATE = 4096
#: seconds the client of a connection whose answers wait for it (writing paused, or closed
#: with bytes unsent) has to take :data:`SEND_MIN_RATE` bytes a second of them before it is
#: cut (module docstring)
SEND_TIMEOUT_S = 20.0
#: bytes per second a client must take of the answers waiting for it, counted over each
#: :data:`SEND_TIMEOUT_S` (80 KiB in 20 s; the request body's :data:`BODY_MIN_RATE`)
SEND_MIN_RATE = 4096
#: requests a connection may have queued behind the one being answered (HTTP/1.1
#: pipelining, which no browser does and few clients do)
MAX_PIPELINED = 16
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER 0 s: close resets, unsent bytes dropped


def _kernel_unsent(transport: Transport) -> int:
    """Bytes in the transport's socket's kernel send queue, not yet acknowledged by the peer
    (Linux's ``SIOCOUTQ``, alias ``TIOCOUTQ``); 0 elsewhere or if it cannot be read."""
    if sys.platform != "linux":
        return 0
    import fcntl
    import termios

    try:
        fd = transport.get_extra_info("socket").fileno()
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0])
    except (AttributeError, OSError, ValueError):  # no socket (or a closed one)
        return 0


def _answer(status: int, reason: str, slug: str, detail: str) -> bytes:
    """The bytes of the service's problem response (:func:`problem_response`), written on the
    connection before the app has a request to answer; the connection closes after it."""
    resp = problem_response(ProblemError(status, slug, reason, detail,
                                         headers={"connection": "close"}))
    head = b"".join(k + b": " + v + b"\r\n" for k, v in with_standard_headers(resp.raw_headers))
    return f"HTTP/1.1 {status} {reason}\r\n".encode() + head + b"\r\n" + bytes(resp.body)


_TOO_LARGE = _answer(431, "Request Header Fields Too Large", "header-too-large",
                     f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")
_TOO_SLOW = _answer(408, "Request Timeout", "head-timeout",
                    "the request head was not complete in time")
_BODY_TOO_SLOW = _answer(408, "Request Timeout", "body-timeout",
                         "the request body was not complete in time")
_BAD_REQUEST = _answer(400, "Bad Request", "bad-request", "the request is not valid HTTP/1.1")


def _answering(problem: ProblemError) -> Any:
    """An ASGI app that answers every request with ``problem`` (body unread), the service's
    standard headers on it."""
    resp = problem_response(problem)
    start = {"type": "http.response.start", "status": problem.status,
             "headers": with_standard_headers(resp.raw_headers)}
    body = {"type": "http.response.body", "body": bytes(resp.body)}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(start)
        await send(body)

    return app


#: the app of a request with a transfer coding but ``chunked`` alone
_refuse_coding = _answering(ProblemError(
    501, "transfer-coding-not-implemented", "Not Implemented",
    "the only transfer coding accepted is chunked", headers={"connection": "close"}))
#: the app of a request beyond ``limit_concurrency`` (uvicorn's own was plain text)
_busy = _answering(ProblemError(
    503, "server-busy", "Service Unavailable",
    "the server holds as many connections and requests as it takes; retry later",
    headers={"connection": "close", "retry-after": "1"}))


class BoundedHttpTools(HttpToolsProtocol):
    """:class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` with the request
    head bounded in size and time, its body and response in time (module docstring)."""

    #: seconds to a complete request head (a subclass may set another)
    head_timeout: float = HEAD_TIMEOUT_S
    #: seconds to a complete body, before the rate's credit (a subclass may set another)
    body_timeout: float = BODY_TIMEOUT_S
    #: bytes per second of body that extend its deadline by a second
    body_min_rate: float = BODY_MIN_RATE
    #: seconds in which the client must take send_min_rate × send_timeout bytes waiting
    send_timeout: float = SEND_TIMEOUT_S
    #: bytes per second the client must take of the answers waiting for it
    send_min_rate: float = SEND_MIN_RATE
    #: pipelined requests queued at most
    max_pipelined: int = MAX_PIPELINED

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # waiting for (the rest of) a request head
        self._head_bytes = 0  # bytes received while the current head is incomplete
        self._head_timer: TimerHandle | None = None
        self._events = 0  # heads and messages completed on this connection
        self._body_timer: TimerHandle | None = None
        self._body_start = 0.0  # when the body's clock started (head or 100; pauses add)
        self._body_bytes = 0  # body bytes received since then
        self._expect_pending = False  # the request waits for a 100 Continue not yet sent
        self._paused_at: float | None = None  # when the server stopped reading its body
        self._codings: list[bytes] = []  # the Transfer-Encoding values of the current head
        self._send_timer: TimerHandle | None = None
        self._send_mark = 0  # bytes unsent (_unsent) when the send clock last started
        # the cycles since one was queued: uvicorn told only self.cycle of a lost connection
        self._pipelined: list[Any] = []
        self._over = False  # MAX_PIPELINED reached: nothing more is read

    def send_400_response(self, msg: str) -> None:
        """A request uvicorn cannot parse: the service's problem document with its standard
        headers (uvicorn's was plain text without them; the review of red team 19)."""
        self._refuse(_BAD_REQUEST)

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_reads()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        self._disarm_send()
        self._disconnect_all()
        super().connection_lost(exc)

    def pause_writing(self) -> None:  # the buffer is full (the client is not reading)
        super().pause_writing()
        if self._send_timer is None:
            self._arm_send(self._unsent())

    def resume_writing(self) -> None:
        if not self.transport.is_closing():  # (closing: the clock runs until all is sent)
            self._disarm_send()
        super().resume_writing()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # beyond limit_concurrency uvicorn picks its plain-text 503: the problem document
        super()._start_asgi_task(cycle, _busy if app is service_unavailable else app)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():  # (Connection: close; kept alive, nothing to watch)
            self._watch_close()

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._watch_close()

    def _watch_close(self) -> None:
        """A closed transport with bytes still to send is let go once they are sent: the send
        clock runs until then (below the high-water mark, writing was never paused)."""
        if (self._send_timer is None and self.transport.is_closing()
                and self.transport.get_write_buffer_size()):
            self._arm_send(self._unsent())

    def _unsent(self) -> int:
        """Bytes written and not yet taken by the client: asyncio's buffer and the kernel's
        send queue (module docstring)."""
        return self.transport.get_write_buffer_size() + _kernel_unsent(self.transport)

    def _arm_send(self, unsent: int) -> None:
        self._send_mark = unsent
        self._send_timer = self.loop.call_later(self.send_timeout, self._send_late)

    def _disarm_send(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_late(self) -> None:
        """The send timer: if the client took at least ``send_timeout × send_min_rate`` bytes
        since the clock started, it starts again from here (one timer per slow reader, not
        one per piece); else the requests end as disconnected (``send`` writes nothing, and
        ``receive`` says so) and the connection is reset (a close waits for unsent bytes)."""
        self._send_timer = None
        if not (self.flow.write_paused or self.transport.is_closing()):
            return
        unsent = self._unsent()
        if self._send_mark - unsent >= self.send_timeout * self.send_min_rate:
            self._arm_send(unsent)
            return
        self._disconnect_all()
        try:
            self.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        except (AttributeError, OSError):  # no socket (or a closed one): closed as it can be
            pass
        self.transport.abort()

    def _disconnect_all(self) -> None:
        for cycle in (self.cycle, *self._pipelined):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self._pipelined = []

    def data_received(self, data: bytes) -> None:
        if self._in_head and self._head_timer is None:
            self._arm()
        before = self._events
        super().data_received(data)
        if self._over:
            self._disarm()
            return
        if self.transport.is_closing():
            return
        if not self._in_head:
            # a head whose body is not complete (a request whose body came with its head, the
            # usual case, never starts the timer)
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self.body_timeout, self._body_late)
            return
        if self._events != before:  # a head or a body ended in this piece: count afresh
            self._head_bytes = 0
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(_TOO_LARGE)

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's ``on_header``, for the head's fields only (llhttp calls it for trailer
        fields too: module docstring), noting the Transfer-Encoding values."""
        if not self._in_head:
            return  # a trailer field: never one of the request's headers
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        elif name == b"transfer-encoding":
            self._codings.append(value)
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._over:  # after MAX_PIPELINED: not read (the connection closes)
            return
        before = self.cycle
        self._head_bytes = 0
        self._events += 1
        self._disarm()
        self._body_start, self._body_bytes = self.loop.time(), 0
        self._paused_at = self._body_start if self.flow.read_paused else None
        if self._codings and (len(self._codings) != 1
                              or self._codings[0].strip().lower() != b"chunked"):
            # a coding the service does not decode: this request's app is the 501's
            app, self.app = self.app, _refuse_coding
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()
        if self._codings:
            self._codings = []
        if self.pipeline and self.pipeline[0][0] is self.cycle:  # queued (pipelining)
            live = [c for c in self._pipelined if not c.response_complete]
            if not live and before is not None:
                live.append(before)  # the one being answered
            live.append(self.cycle)
            self._pipelined = live
        self._expect_pending = self.cycle is not None and self.cycle.waiting_for_100_continue

    def _watch_reads(self) -> None:
        """The connection's ``flow.pause_reading`` and ``flow.resume_reading`` wrapped, once
        per connection (one call per ``receive``): a pause the server makes (uvicorn past its
        64 KiB buffer) moves the body's clock on by its length when reading resumes, the
        bytes received kept; the app's first ``receive`` of a request waiting for its ``100
        Continue`` (which that call sends) starts the clock at the 100 — until then the
        client could not send (the review of red team 21, R4: an app that read the body late
        cut a client answering its 100 at once)."""
        flow = self.flow
        pause, resume = flow.pause_reading, flow.resume_reading

        def pause_watched() -> None:
            if not flow.read_paused:
                self._paused_at = self.loop.time()
            pause()

        def resume_watched() -> None:
            if self._over:
                return  # MAX_PIPELINED reached: nothing more is read
            cycle = self.cycle
            if self._expect_pending and cycle is not None and not cycle.waiting_for_100_continue:
                self._expect_pending = False  # the 100 just went out
                self._body_start, self._body_bytes = self.loop.time(), 0
            elif self._paused_at is not None:  # (set exactly while the server is paused)
                self._body_start += self.loop.time() - self._paused_at
            self._paused_at = None
            resume()

        flow.pause_reading = pause_watched  # type: ignore[method-assign]
        flow.resume_reading = resume_watched  # type: ignore[method-assign]

    def on_body(self, body: bytes) -> None:
        if self._over:
            return
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head = True  # the next request's head (its timer starts at its first byte)
        if self._over:
            return
        super().on_message_complete()
        self._events += 1
        self._disarm_body()
        if len(self.pipeline) >= self.max_pipelined:
            # the last request read: Connection: close, reading stays paused (since queued)
            self._over = True
            self.cycle.keep_alive = False

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes or self.cycle is None:
            # part of a head, or nothing at all since the connection opened
            self._refuse(_TOO_SLOW if self._head_bytes else b"")
        # else: an idle kept-alive connection, uvicorn's timeout_keep_alive closes it

    def _disarm_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_late(self) -> None:
        """The body timer: close the connection if its body is past its deadline (module
        docstring), else wait for the deadline (one timer per slow body, not one per piece)."""
        self._body_timer = None
        if self._in_head or self.transport.is_closing():
            return
        now = self.loop.time()
        cycle = self.cycle
        if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
            # the server is not reading this body (yet): not the client's delay — the clock
            # stands still until it reads again (_watch_reads); look again a timeout later
            due = now + self.body_timeout
        else:
            due = self._body_start + self.body_timeout + self._body_bytes / self.body_min_rate
        if now < due:
            self._body_timer = self.loop.call_later(due - now, self._body_late)
            return
        answer = _BODY_TOO_SLOW
        if cycle is not None:
            if cycle.response_started:
                answer = b""  # the app is answering: cut it short, nothing to add
            if not cycle.response_complete:
                # the app's receive() says "disconnected" and its send() writes nothing more
                cycle.disconnected = True
                cycle.message_event.set()
        self._refuse(answer)

    def _refuse(self, answer: bytes) -> None:
        self._disarm()
        if answer:
            self.transport.write(answer)
        self.transport.close()
        self._watch_close()

