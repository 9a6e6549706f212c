"""One HTTP GET whose whole answer is bounded: in time by one deadline, in size by a cap.

requests' `timeout` bounds each wait on the socket, not the answer: a server that trickles a byte
a second never times out, and an endless page is read until memory runs out. `get` streams the
body and stops at the first of: the deadline (`timeout` after the call, for name lookup, connect,
headers and body together, on `time.monotonic`), more than `cap` bytes (decoded: gzip is undone
first), or a Content-Length above `cap` (refused before any of the body is read).

Reads that block inside the libraries (http.client reads a header line, urllib3 a whole chunk)
are ended by a watchdog timer that shuts the connection's socket down at the deadline. The
socket is known from the moment it connects through the connection classes `DeadlineAdapter`
mounts on the session; behind a SOCKS proxy or another session's adapter only once the headers
have come, with each wait before still bounded by `timeout`.

A host name is looked up before there is a socket to shut down, and a resolver that hangs (a
dead DNS server: glibc waits 5 s per try and server) would hold the caller past the deadline.
So those connection classes run `socket.getaddrinfo` in a daemon thread and wait for it only
until the deadline (an IP address or "localhost" is looked up in the calling thread: no wait);
a lookup still running then is left to finish on its own, and a later request for the same
name waits on it rather than starting another. urllib3 then connects to each address in turn
(with its own options and errors), each connect bounded by the time left too. Through an HTTP proxy the proxy's name is the
one looked up, the same way; a SOCKS proxy looks names up in its own connection classes,
outside this bound.

The answer comes back as the usual `requests.Response` with its body read, so `.text` and
`.json()` decode it exactly as they always did (charset from Content-Type, else detected).
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import threading
import time
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util.connection import allowed_gai_family

from gpu_defrag_common.units import size_text

CHUNK = 64 * 1024  # bytes asked of the stream at a time (decoded, so a gzip bomb stays small)


class AnswerTooSlow(Exception):
    """The answer began (status and headers came) but was not complete by the deadline."""


class AnswerTooLarge(Exception):
    """The body, or its declared Content-Length, is over the cap."""


class _Watch:
    """Shuts down the sockets of one request when its deadline passes, unless it finished."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + max(0.0, seconds)
        self.unresolved: str | None = None  # the host whose name lookup did not end in time
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

    @property
    def expired(self) -> bool:
        """The deadline has passed (the timer may not have fired yet)."""
        return self._fired or time.monotonic() >= self.deadline

    def left(self) -> float:
        return self.deadline - time.monotonic()

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


class _LookupUnfinished(Exception):
    """The name lookup did not end by the deadline."""


class _Lookup:
    """One `socket.getaddrinfo` call in a daemon thread, that callers wait on while they may."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: list[Any] = []
        self.error: Exception | None = None


_lookups: dict[tuple[str, int, int], _Lookup] = {}  # running: (host, port, family) -> lookup
_lookups_lock = threading.Lock()


def _resolve(host: str, port: int, family: int, left: float) -> list[Any]:
    """getaddrinfo's answer for `host`, waited for at most `left` seconds (_LookupUnfinished
    after that). An IP address or "localhost" is looked up here and now: nothing to wait on."""
    if host.lower() == "localhost" or _is_address(host):
        return socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    if left <= 0:
        raise _LookupUnfinished
    key = (host, port, int(family))
    with _lookups_lock:
        lookup = _lookups.get(key)
        if lookup is None:
            lookup = _lookups[key] = _Lookup()
            worker = threading.Thread(
                target=_look_up, args=(key, lookup), name=f"getaddrinfo {host}", daemon=True
            )
            try:
                worker.start()
            except BaseException:
                del _lookups[key]  # no thread: no one would ever end it
                raise
    if not lookup.done.wait(left):
        raise _LookupUnfinished
    if lookup.error is not None:
        raise lookup.error
    return lookup.answer


def _look_up(key: tuple[str, int, int], lookup: _Lookup) -> None:
    host, port, family = key
    try:
        lookup.answer = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except Exception as error:  # handed to the callers waiting
        lookup.error = error
    finally:
        with _lookups_lock:
            if _lookups.get(key) is lookup:
                del _lookups[key]
        lookup.done.set()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Watched:
    """Hands each socket to the calling thread's watch: a new one as soon as it connects (so a
    slow TLS handshake is bounded too), a reused one when its answer is awaited. Within a
    watched request the host's name lookup and the connect end at the deadline too."""

    sock: Any
    host: str
    _dns_host: str  # urllib3's name to connect to (the proxy's, through a proxy)
    port: int
    timeout: Any

    def _new_conn(self) -> socket.socket:
        watch: _Watch | None = getattr(_local, "watch", None)
        if watch is None:
            return super()._new_conn()  # type: ignore[misc]
        name = self._dns_host
        try:
            answer = _resolve(name.strip("[]"), self.port, allowed_gai_family(), watch.left())
        except _LookupUnfinished:
            watch.unresolved = self.host
            raise ConnectTimeoutError(self, f"name lookup of {name} did not finish") from None
        except (OSError, UnicodeError):
            answer = []  # urllib3 looks it up again and raises its own error
        # urllib3 connects to each address in turn (an address needs no lookup), with its own
        # errors, options and source address; each connect also ends at the deadline
        addresses = list(dict.fromkeys(info[4][0] for info in answer)) or [name]
        timeout = self.timeout
        try:
            for i, address in enumerate(addresses):
                self._dns_host = address
                if isinstance(timeout, (int, float)):
                    self.timeout = max(0.001, min(timeout, watch.left()))
                try:
                    sock = super()._new_conn()  # type: ignore[misc]
                    break
                except (ConnectTimeoutError, NewConnectionError):
                    if i == len(addresses) - 1 or watch.expired:
                        raise
        finally:
            self._dns_host, self.timeout = name, timeout
        watch.add(sock)
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
    watch = _Watch(timeout)
    deadline = watch.deadline
    outer, _local.watch = getattr(_local, "watch", None), watch
    response: requests.Response | None = None
    try:
        try:
            response = session.get(url, params=params, timeout=timeout, stream=True)
        except requests.RequestException:
            if watch.unresolved is not None:  # the resolver, not the server: say so
                raise requests.Timeout(
                    f"no answer within {timeout:g} s "
                    f"(name lookup of {watch.unresolved} did not finish)"
                ) from None
            if watch.expired:  # the watchdog ended a read, or connect met the deadline
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
