"""Connections of the HTTP servers: one thread reads every request whole; a few workers answer.

The standard library's threading server gave each connection a thread for its whole life and
read a request's head line by line without a deadline. Slow clients dripping header lines held
300 threads for 72 s, and a head cut short by the client closing read as complete: 2,000 such
clients closing at once were each answered with the full page, and scrapes went unanswered
for 20 s. Here one thread (`Connections`) owns every socket, non-blocking under `selectors`:

- it reads until a request is whole: its head ends in an empty line and its declared body has
  arrived (the body is counted and dropped: every route is read-only). A connection that
  closes first is dropped unanswered; one that takes longer than `request_timeout_s` from
  its first byte (or from its accept, the TLS handshake included) is closed;
- only whole requests reach a worker (`Lanes`): a bounded pool, so slow or idle connections
  hold a buffer and a descriptor, never a thread; requests that need a bcrypt check go to a
  lane of their own, so wrong passwords cannot keep the workers from scrapes;
- answers go back to this thread, which writes them without blocking (closing a client that
  reads nothing for `write_timeout_s`);
- at most `max_connections` are open: one more evicts the connection that has waited longest
  for its request (a dripper before an idle keep-alive scrape connection).

Pure framing (`frame`) is separate from the I/O so it can be tested byte by byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import logging
import queue
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gpu_defrag_common.messages import one_line

log = logging.getLogger("gpu_defrag_common.server")

RECV_BYTES = 64 * 1024
LINGER_S = 2.0  # at most this long reading a closing client's unread bytes


@dataclass(frozen=True, slots=True)
class Limits:
    """What one server may spend on its clients."""

    max_connections: int = 1024
    workers: int = 8
    auth_workers: int = 1  # bcrypt checks at a time: a core at most, whatever the clients send
    auth_queue: int = 64  # requests waiting for a bcrypt check; more get 503
    request_timeout_s: float = 10.0  # a whole request (with TLS handshake) from its first byte
    idle_timeout_s: float = 120.0  # a keep-alive connection without a request (Prometheus: 5m)
    write_timeout_s: float = 30.0  # an answer the client does not read
    max_head_bytes: int = 32 * 1024  # request line and headers (Prometheus sends < 1 KiB)
    max_body_bytes: int = 1 << 20  # a declared body is read and dropped up to this size


class Body(enum.Enum):
    """What became of a request's declared body (the handler answers the bad ones)."""

    NONE = "none"
    READ = "read"  # read in full and dropped
    BAD_LENGTH = "bad length"  # Content-Length not one run of ASCII digits
    TOO_LARGE = "too large"  # over max_body_bytes: not read
    CHUNKED = "chunked"  # Transfer-Encoding: not read; the connection closes after the answer


@dataclass(frozen=True, slots=True)
class Framed:
    """A whole request found at the start of a buffer."""

    head: bytes  # request line and headers, up to and with the empty line
    body: Body
    body_length: int  # bytes of body that follow the head (to drop)
    head_too_large: bool = False  # no end within max_head_bytes: `head` is a prefix


@dataclass(frozen=True, slots=True)
class Reply:
    """A worker's answer: the bytes to send and whether the connection closes after them."""

    data: bytes
    close: bool


def frame(buffer: bytes | bytearray, limits: Limits) -> Framed | None:
    """The request at the start of `buffer` once its head is whole, else None (read more).
    Leading empty lines are the caller's to strip (RFC 9112 2.2)."""
    end = _head_end(buffer, limits.max_head_bytes)
    if end is None:
        if len(buffer) > limits.max_head_bytes:
            return Framed(bytes(buffer[: limits.max_head_bytes]), Body.NONE, 0, True)
        return None
    head = bytes(buffer[:end])
    body, length = _body_of(head, limits.max_body_bytes)
    return Framed(head, body, length)


def _head_end(buffer: bytes | bytearray, limit: int) -> int | None:
    """Index just after the empty line that ends the head (CRLF or a bare LF, as
    http.client accepts), or None."""
    window = buffer[: limit + 4]
    ends = [i for i in (window.find(b"\n\r\n"), window.find(b"\n\n")) if i >= 0]
    if not ends:
        return None
    first = min(ends)
    end = first + (3 if window.startswith(b"\n\r\n", first) else 2)
    return end if end <= limit else None


def _body_of(head: bytes, max_body: int) -> tuple[Body, int]:
    lengths: set[bytes] = set()
    for line in head.split(b"\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return Body.CHUNKED, 0
        if name == b"content-length":
            lengths.add(value.strip())
    if not lengths:
        return Body.NONE, 0
    (length, *others) = lengths
    if others or not length.isdigit():  # isdigit on bytes: ASCII digits only
        return Body.BAD_LENGTH, 0
    if len(length) > len(str(max_body)) or int(length) > max_body:
        return Body.TOO_LARGE, 0
    return (Body.READ, int(length)) if int(length) else (Body.NONE, 0)


class State(enum.Enum):
    HANDSHAKE = "handshake"  # TLS handshake in progress
    AWAIT = "await"  # waiting for (the rest of) a request
    BUSY = "busy"  # a worker has the request
    WRITE = "write"  # sending the answer
    LINGER = "linger"  # answered and closing: reading what the client still sends (see _linger)
    CLOSED = "closed"


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    address: tuple
    state: State
    deadline: float
    waiting_since: float
    buffer: bytearray
    body_left: int = 0  # body bytes still to drop before the request is whole
    pending: Framed | None = None  # the request whose body is being dropped
    out: memoryview | None = None
    close_after: bool = False
    peer_closed: bool = False
    events: int = 0  # what the selector watches for (0: not registered)


Respond = Callable[[Framed, tuple], Reply]  # runs in a worker


class Lanes:
    """Bounded worker threads: a fast lane for most requests, a small lane for those that
    need a bcrypt check (bounded queue: `offer` says False when it is full)."""

    def __init__(self, respond: Respond, done: Callable[[Connection, Reply], None], limits: Limits):
        self._respond = respond
        self._done = done
        self._fast: queue.SimpleQueue = queue.SimpleQueue()
        self._slow: queue.Queue = queue.Queue(maxsize=limits.auth_queue)
        self._threads = [
            threading.Thread(target=self._work, args=(self._fast,), name=f"http-{i}", daemon=True)
            for i in range(limits.workers)
        ] + [
            threading.Thread(target=self._work, args=(self._slow,), name=f"auth-{i}", daemon=True)
            for i in range(limits.auth_workers)
        ]
        self._fast_count = limits.workers
        self._slow_count = limits.auth_workers

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def offer(self, connection: Connection, request: Framed, slow: bool) -> bool:
        if not slow:
            self._fast.put((connection, request))
            return True
        try:
            self._slow.put_nowait((connection, request))
        except queue.Full:
            return False
        return True

    def stop(self) -> None:
        for _ in range(self._fast_count):
            self._fast.put(None)
        for _ in range(self._slow_count):
            with contextlib.suppress(queue.Full):
                self._slow.put_nowait(None)

    def _work(self, jobs: queue.SimpleQueue | queue.Queue) -> None:
        while (job := jobs.get()) is not None:
            connection, request = job
            try:
                reply = self._respond(request, connection.address)
            except Exception as error:  # a route's failure answers 500 before this: a bug
                log.error(
                    "request from %s failed: %s", connection.address, one_line(error, typed=True)
                )
                reply = Reply(b"", True)
            self._done(connection, reply)


def _within_descriptors(limits: Limits) -> Limits:
    """No more connections than the process may open descriptors (keeping 64 for the rest:
    files, the source's sockets); past it every accept would fail."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft - 64 >= limits.max_connections:
        return limits
    allowed = max(16, soft - 64)
    log.warning(
        "--web.max-connections %d is above the open-file limit %d: holding at most %d",
        limits.max_connections,
        soft,
        allowed,
    )
    return dataclasses.replace(limits, max_connections=allowed)


class Connections:
    """The accept-and-read loop; `serve_forever` in its own thread, `close` from another."""

    def __init__(
        self,
        listener: socket.socket,
        respond: Respond,
        *,
        limits: Limits,
        tls: ssl.SSLContext | None = None,
        needs_auth_check: Callable[[bytes], bool] = lambda head: False,
        busy_reply: Callable[[], bytes] = lambda: b"",
    ) -> None:
        self.limits = _within_descriptors(limits)
        self._listener = listener
        self._listener.setblocking(False)
        self._tls = tls
        self._needs_auth_check = needs_auth_check
        self._busy_reply = busy_reply
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._open: dict[int, Connection] = {}
        self._awaiting: OrderedDict[int, Connection] = OrderedDict()  # oldest wait first
        self._lanes = Lanes(respond, self._finished, limits)
        self._stopping = False
        self._accept_paused_until = 0.0
        self._stopped = threading.Event()

    # --- called from other threads ---
    def close(self) -> None:
        """Stop accepting, close every connection, end the workers; returns within ~1 s."""
        self._stopping = True
        self._wake()
        self._stopped.wait(timeout=2.0)

    def _finished(self, connection: Connection, reply: Reply) -> None:
        self._done.put((connection, reply))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: the loop is awake already
            self._wake_w.send(b"\0")

    @property
    def open_connections(self) -> int:
        return len(self._open)

    # --- the loop ---
    def serve_forever(self) -> None:
        self._lanes.start()
        try:
            next_sweep = time.monotonic()
            while not self._stopping:
                timeout = max(0.0, min(0.5, next_sweep - time.monotonic()))
                for key, events in self._selector.select(timeout):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(BlockingIOError):
                            self._wake_r.recv(4096)
                    else:
                        self._ready(key.data, events)
                self._complete_replies()
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + 0.25
                if self._accept_paused_until and now >= self._accept_paused_until:
                    self._accept_paused_until = 0.0
                    self._selector.register(self._listener, selectors.EVENT_READ, None)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._lanes.stop()
        for connection in list(self._open.values()):
            self._close(connection)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self._listener)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self._stopped.set()

    def _accept(self) -> None:
        for _ in range(64):  # a burst of connections, without starving the others
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._out_of_descriptors(error)
                    return
                log.debug("accept failed: %s", error)
                return
            if len(self._open) >= self.limits.max_connections and not self._evict_one():
                sock.close()
                continue
            self._add(sock, address)

    def _out_of_descriptors(self, error: OSError) -> None:
        """No descriptor for a new connection: free one, else stop accepting for 100 ms (the
        listener stays readable, and a loop on it would spin)."""
        if self._evict_one():
            return
        log.debug("accept paused: %s", error)
        self._selector.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + 0.1

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for its request."""
        if not self._awaiting:
            return False
        _, connection = next(iter(self._awaiting.items()))
        log.debug("connection from %s closed: %d open", connection.address, len(self._open))
        self._close(connection)
        return True

    def _add(self, sock: socket.socket, address: tuple) -> None:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = time.monotonic()
        state = State.AWAIT
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError) as error:
                log.debug("TLS with %s failed: %s", address, error)
                sock.close()
                return
            state = State.HANDSHAKE
        connection = Connection(
            sock, address, state, now + self.limits.request_timeout_s, now, bytearray()
        )
        self._open[sock.fileno()] = connection
        self._awaiting[sock.fileno()] = connection
        self._interest(connection, selectors.EVENT_READ)
        if state is State.HANDSHAKE:
            self._handshake(connection)

    def _ready(self, connection: Connection, events: int) -> None:
        if connection.state is State.HANDSHAKE:
            self._handshake(connection)
        elif connection.state is State.AWAIT:
            self._read(connection)
        elif connection.state is State.WRITE:
            self._write(connection)
        elif connection.state is State.LINGER:
            self._drain(connection)

    def _handshake(self, connection: Connection) -> None:
        sock = connection.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._interest(connection, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._interest(connection, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as error:
            log.debug("TLS handshake with %s failed: %s", connection.address, error)
            self._close(connection)
            return
        connection.state = State.AWAIT
        self._interest(connection, selectors.EVENT_READ)
        self._read(connection)  # data may already sit decrypted in the TLS buffer

    def _read(self, connection: Connection) -> None:
        while connection.state is State.AWAIT:
            room = self._room(connection)
            try:
                data = connection.sock.recv(room)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (OSError, ValueError) as error:
                log.debug("client %s went away: %s", connection.address, type(error).__name__)
                self._close(connection)
                return
            if not data:  # the client closed: a request not whole by now is never answered
                connection.peer_closed = True
                self._take_requests(connection)
                if connection.state is State.AWAIT:
                    self._close(connection)
                return
            self._received(connection, data)

    def _room(self, connection: Connection) -> int:
        """Read no more than the head bound allows (or the body left to drop)."""
        if connection.pending is not None:
            return max(1, min(RECV_BYTES, connection.body_left))
        return max(1, min(RECV_BYTES, self.limits.max_head_bytes + 1 - len(connection.buffer)))

    def _received(self, connection: Connection, data: bytes) -> None:
        if not connection.buffer and connection.pending is None:
            # the first byte of a request: its deadline starts now (keep-alive waits longer)
            connection.deadline = time.monotonic() + self.limits.request_timeout_s
        if connection.pending is not None:
            dropped = min(len(data), connection.body_left)
            connection.body_left -= dropped
            data = data[dropped:]
        connection.buffer += data
        self._take_requests(connection)

    def _take_requests(self, connection: Connection) -> None:
        """Hand the next whole request in the buffer to a worker, if there is one."""
        if connection.pending is not None:
            if connection.body_left:
                return
            request, connection.pending = connection.pending, None
            self._dispatch(connection, request)
            return
        while connection.buffer[:1] in (b"\r", b"\n"):  # empty lines before a request
            del connection.buffer[:1]
        request = frame(connection.buffer, self.limits)
        if request is None:
            return
        del connection.buffer[: len(request.head)]
        if request.head_too_large or request.body is not Body.READ:
            self._dispatch(connection, request)
            return
        dropped = min(request.body_length, len(connection.buffer))
        del connection.buffer[:dropped]
        connection.body_left = request.body_length - dropped
        connection.pending = request
        self._take_requests(connection)

    def _dispatch(self, connection: Connection, request: Framed) -> None:
        slow = not request.head_too_large and self._needs_auth_check(request.head)
        connection.state = State.BUSY
        self._awaiting.pop(connection.sock.fileno(), None)
        self._interest(connection, 0)
        if not self._lanes.offer(connection, request, slow):
            self._send(connection, Reply(self._busy_reply(), True))

    def _complete_replies(self) -> None:
        while True:
            try:
                connection, reply = self._done.get_nowait()
            except queue.Empty:
                return
            if connection.state is State.BUSY:
                self._send(connection, reply)

    def _send(self, connection: Connection, reply: Reply) -> None:
        if not reply.data:
            self._close(connection)
            return
        connection.state = State.WRITE
        connection.out = memoryview(reply.data)
        connection.close_after = reply.close or connection.peer_closed
        connection.deadline = time.monotonic() + self.limits.write_timeout_s
        self._write(connection)

    def _write(self, connection: Connection) -> None:
        assert connection.out is not None
        while connection.out:
            try:
                sent = connection.sock.send(connection.out)
            except (BlockingIOError, ssl.SSLWantWriteError):
                self._interest(connection, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._interest(connection, selectors.EVENT_READ)
                return
            except (OSError, ValueError) as error:
                log.debug("client %s went away: %s", connection.address, type(error).__name__)
                self._close(connection)
                return
            connection.out = connection.out[sent:]
        connection.out = None
        if connection.close_after:
            self._linger(connection)
            return
        now = time.monotonic()
        connection.state = State.AWAIT
        connection.deadline = now + self.limits.idle_timeout_s
        connection.waiting_since = now
        self._awaiting[connection.sock.fileno()] = connection
        self._interest(connection, selectors.EVENT_READ)
        if connection.buffer:  # pipelined: the next request may be whole already
            connection.deadline = now + self.limits.request_timeout_s
            self._take_requests(connection)
        if connection.state is State.AWAIT:
            self._read(connection)

    def _linger(self, connection: Connection) -> None:
        """Close after an answer without losing it: closing a socket whose client is still
        sending (the rest of a head over the bound, a body not read) makes the kernel send a
        reset, which can destroy the answer before the client reads it. So: end our side
        (FIN), read and drop what still comes for up to `LINGER_S`, then close."""
        try:
            connection.sock.shutdown(socket.SHUT_WR)
        except (OSError, ValueError):
            self._close(connection)
            return
        connection.state = State.LINGER
        connection.deadline = time.monotonic() + LINGER_S
        connection.buffer.clear()
        self._interest(connection, selectors.EVENT_READ)
        self._drain(connection)

    def _drain(self, connection: Connection) -> None:
        while True:
            try:
                data = connection.sock.recv(RECV_BYTES)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (OSError, ValueError):
                data = b""
            if not data:
                self._close(connection)
                return

    def _interest(self, connection: Connection, events: int) -> None:
        """Watch the connection for `events` (0: not at all, while a worker has it)."""
        if events == connection.events:
            return
        if not connection.events:
            self._selector.register(connection.sock, events, connection)
        elif events:
            self._selector.modify(connection.sock, events, connection)
        else:
            self._selector.unregister(connection.sock)
        connection.events = events

    def _sweep(self, now: float) -> None:
        for connection in [c for c in self._open.values() if c.state is not State.BUSY]:
            if now >= connection.deadline:
                log.debug(
                    "connection from %s timed out (%s)", connection.address, connection.state.value
                )
                self._close(connection)

    def _close(self, connection: Connection) -> None:
        if connection.state is State.CLOSED:
            return
        fileno = connection.sock.fileno()
        if connection.events:
            self._selector.unregister(connection.sock)
            connection.events = 0
        connection.state = State.CLOSED
        self._open.pop(fileno, None)
        self._awaiting.pop(fileno, None)
        with contextlib.suppress(OSError):
            connection.sock.close()
