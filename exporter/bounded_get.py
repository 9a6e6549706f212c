"""One HTTP GET whose whole answer is bounded: in time by one deadline, in size by a cap.

requests' `timeout` bounds each wait on the socket, not the answer: a server that trickles a byte
a second never times out, and an endless page is read until memory runs out. `get` streams the
body and stops at the first of: the deadline (`timeout` after the call, for connect, headers and
body together, on `time.monotonic`), more than `cap` bytes (decoded: gzip is undone first), or a
Content-Length above `cap` (refused before any of the body is read).

Reads that block inside the libraries (http.client reads a header line, urllib3 a whole chunk)
are ended by a watchdog timer that shuts the connection's socket down at the deadline. The
socket is known from the moment it connects through the connection classes `DeadlineAdapter`
mounts on the session; behind a SOCKS proxy or another session's adapter only once the headers
have come, with each wait before still bounded by `timeout`.

The answer comes back as the usual `requests.Response` with its body read, so `.text` and
`.json()` decode it exactly as they always did (charset from Content-Type, else detected).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from exporter.units import size_text

CHUNK = 64 * 1024  # bytes asked of the stream at a time (decoded, so a gzip bomb stays small)


class AnswerTooSlow(Exception):
    """The answer began (status and headers came) but was not complete by the deadline."""


class AnswerTooLarge(Exception):
    """The body, or its declared Content-Length, is over the cap."""


class _Watch:
    """Shuts down the sockets of one request when its deadline passes, unless it finished."""

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []  # duplicates: shutting one down ends the read
        self._fired = False
        self._done = False
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    @property
    def fired(self) -> bool:
        return self._fired

    def add(self, sock: Any) -> None:
        """Watch `sock` too. A duplicate of its descriptor is kept: the original may be
        detached (wrapped in TLS) or closed by its owner, the connection stays the same."""
        try:
            copy = socket.fromfd(sock.fileno(), sock.family, sock.type)
        except (AttributeError, OSError, ValueError):
            return  # not a socket, or already closed: nothing left to interrupt
        with self._lock:
            if self._done:
                copy.close()
                return
            self._socks.append(copy)
            if self._fired:
                _shutdown(copy)

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._fired = True
            for sock in self._socks:
                _shutdown(sock)

    def finish(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True
            for sock in self._socks:
                sock.close()
            self._socks.clear()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the other side
        sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread


_local = threading.local()  # .watch: the _Watch of the request this thread is making


def _watch_current(sock: Any) -> None:
    watch: _Watch | None = getattr(_local, "watch", None)
    if watch is not None and sock is not None:
        watch.add(sock)


class _Watched:
    """Hands each socket to the calling thread's watch: a new one as soon as it connects (so a
    slow TLS handshake is bounded too), a reused one when its answer is awaited."""

    sock: Any

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        _watch_current(sock)
        return sock

    def getresponse(self) -> Any:
        _watch_current(self.sock)
        return super().getresponse()  # type: ignore[misc]


class _HTTPConnection(_Watched, HTTPConnection):
    pass


class _HTTPSConnection(_Watched, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter with connections whose sockets `get`'s watchdog can shut down."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is urllib3.ProxyManager:  # SOCKS managers keep their own pools
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


def new_session() -> requests.Session:
    """A session `get` can bound from the first byte (its adapters are `DeadlineAdapter`s)."""
    session = requests.Session()
    _mount(session)
    return session


def _mount(session: requests.Session) -> None:
    for prefix in ("https://", "http://"):
        if not isinstance(session.adapters.get(prefix), DeadlineAdapter):
            session.mount(prefix, DeadlineAdapter())


def get(
    url: str,
    timeout: float,
    *,
    cap: int,
    session: requests.Session | None = None,
    params: dict[str, Any] | None = None,
) -> requests.Response:
    """The answer to GET `url`, its body read (whatever the status), within `timeout` seconds
    in all and at most `cap` bytes.

    Raises requests.Timeout when no answer (status and headers) came in time, AnswerTooSlow
    when one began but its body did not end in time, AnswerTooLarge when the body (or its
    Content-Length) is over `cap`, and any other requests.RequestException as requests does.
    A session without `DeadlineAdapter`s gets them mounted; without a session a new one is
    used for this call alone.
    """
    own = session is None
    session = session or new_session()
    _mount(session)
    deadline = time.monotonic() + timeout
    watch = _Watch(timeout)
    outer, _local.watch = getattr(_local, "watch", None), watch
    response: requests.Response | None = None
    try:
        try:
            response = session.get(url, params=params, timeout=timeout, stream=True)
        except requests.RequestException:
            if watch.fired:  # the watchdog ended a read: the deadline, not the server
                raise requests.Timeout(f"no answer within {timeout:g} s") from None
            raise
        if watch.fired:  # cut off mid-headers, which http.client may take for their end
            raise requests.Timeout(f"no answer within {timeout:g} s")
        _watch_current(getattr(getattr(response.raw, "connection", None), "sock", None))
        declared = response.headers.get("Content-Length", "").strip()
        if declared.isdigit() and int(declared) > cap:
            raise AnswerTooLarge(f"Content-Length {declared} is over {size_text(cap)}")
        # requests' own slot for a body read in full: .text and .json() decode it as ever
        response._content = _read(response, deadline, cap, watch)
        return response
    except BaseException:
        if response is not None:
            response.close()  # a connection left mid-answer is not reused
        raise
    finally:
        _local.watch = outer
        watch.finish()
        if own:
            session.close()


def _read(response: requests.Response, deadline: float, cap: int, watch: _Watch) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in response.iter_content(CHUNK):
            size += len(chunk)
            if size > cap:
                raise AnswerTooLarge(f"more than {size_text(cap)}")
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise AnswerTooSlow("deadline passed")
    except (
        requests.RequestException,
        urllib3.exceptions.HTTPError,
        http.client.HTTPException,
        OSError,
    ) as error:
        if watch.fired or time.monotonic() >= deadline:
            raise AnswerTooSlow("deadline passed") from None
        if isinstance(error, requests.RequestException):
            raise
        raise requests.ConnectionError(str(error)) from None
    if watch.fired:  # cut off where a body without a length would end: not the whole page
        raise AnswerTooSlow("deadline passed")
    return b"".join(chunks)
