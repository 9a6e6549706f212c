"""bounded_get's deadline covers the name lookup too: a resolver that hangs (a dead DNS server)
ends at the deadline like a server that does not answer. No network: `socket.getaddrinfo` is
replaced by one that knows a few made-up names and hands everything else to the real one."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from advisor.ingest.exporter_scrape import SourceUnavailable
from advisor.ingest.prometheus import PrometheusClient
from gpu_defrag_common import bounded_get
from gpu_defrag_common.page_fetch import PageUnavailable, fetch_page
from tests.fakes.page_server import fixed, head, serve_raw

CAP = 2**20
BODY = b"gpu_info 1\n"
PAGE = head(Content_Type="text/plain", Content_Length=str(len(BODY))) + BODY
HANG = 3.0  # seconds a hanging lookup takes (a dead DNS server takes 10-30 s)

_real_getaddrinfo = socket.getaddrinfo


class _Resolver:
    """`socket.getaddrinfo` for the tests: `hang` names wait HANG s and then fail, `fail`
    names fail at once, `alias` names resolve to the addresses listed, the rest as ever.
    Records (host, thread) of every call."""

    def __init__(self) -> None:
        self.hang: set[str] = set()
        self.fail: set[str] = set()
        self.alias: dict[str, list[str]] = {}
        self.calls: list[tuple[str, threading.Thread]] = []
        self.release = threading.Event()  # set at the end of the test: hung lookups end

    def __call__(self, host, port, family=0, type=0, proto=0, flags=0):
        self.calls.append((host, threading.current_thread()))
        if host in self.hang:
            self.release.wait(HANG)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if host in self.fail:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if host in self.alias:
            return [
                info
                for address in self.alias[host]
                for info in _real_getaddrinfo(address, port, family, type, proto, flags)
            ]
        return _real_getaddrinfo(host, port, family, type, proto, flags)


@pytest.fixture
def resolver(monkeypatch) -> Iterator[_Resolver]:
    fake = _Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", fake)  # what urllib3 and bounded_get call
    yield fake
    fake.release.set()


def _timed(call: Callable[[], object], error: type[BaseException]) -> tuple[str, float]:
    """(the message of the `error` that `call` raises, seconds it took)."""
    started = time.monotonic()
    with pytest.raises(error) as caught:
        call()
    return str(caught.value), time.monotonic() - started


def test_a_lookup_that_hangs_ends_at_the_deadline(resolver):
    resolver.hang.add("slow-dns.invalid")
    message, took = _timed(
        lambda: bounded_get.get("http://slow-dns.invalid:9/", 0.5, cap=CAP), requests.Timeout
    )
    assert took < 1.5
    assert message == "no answer within 0.5 s (name lookup of slow-dns.invalid did not finish)"


def test_a_hanging_lookup_does_not_hold_a_scrape_or_a_query_past_the_timeout(resolver):
    """The two callers: the dcgm-exporter backend (inside a scrape) and the Prometheus client."""
    resolver.hang.update({"dead-dns-exporter.invalid", "dead-dns-prometheus.invalid"})
    url = "http://dead-dns-exporter.invalid:9400/metrics"
    message, took = _timed(lambda: fetch_page(url, 0.5), PageUnavailable)
    assert (message, took < 1.5) == (f"{url}: no answer within 0.5 s", True)
    client = PrometheusClient("http://dead-dns-prometheus.invalid:9090", timeout=0.5)
    message, took = _timed(lambda: client.instant("up"), SourceUnavailable)
    assert message == (
        "Prometheus at http://dead-dns-prometheus.invalid:9090 unreachable: no answer within 0.5 s"
    )
    assert took < 1.5


def test_a_second_request_waits_on_the_hung_lookup_rather_than_starting_another(resolver):
    """A dead DNS server holds one thread per name, not one per request."""
    resolver.hang.add("hung-twice.invalid")
    for _ in range(2):
        _, took = _timed(
            lambda: bounded_get.get("http://hung-twice.invalid:9/", 0.3, cap=CAP),
            requests.Timeout,
        )
        assert took < 1.0
    assert [host for host, _ in resolver.calls] == ["hung-twice.invalid"]
    assert resolver.calls[0][1] is not threading.current_thread()


def test_a_proxy_whose_name_hangs_ends_at_the_deadline(resolver):
    """Through an HTTP proxy the proxy's name is the one looked up."""
    resolver.hang.add("slow-proxy.invalid")
    session = bounded_get.new_session()
    session.proxies = {"http": "http://slow-proxy.invalid:3128"}
    with session:
        message, took = _timed(
            lambda: bounded_get.get("http://example.invalid/", 0.5, cap=CAP, session=session),
            requests.Timeout,
        )
    assert took < 1.5
    assert message == "no answer within 0.5 s (name lookup of slow-proxy.invalid did not finish)"


def test_a_lookup_that_fails_at_once_is_still_a_connection_error(resolver):
    resolver.fail.add("no-such-host.invalid")
    started = time.monotonic()
    with pytest.raises(requests.ConnectionError) as caught:
        bounded_get.get("http://no-such-host.invalid:9/", 5, cap=CAP)
    assert not isinstance(caught.value, requests.Timeout)
    assert "Failed to resolve 'no-such-host.invalid'" in str(caught.value)
    assert time.monotonic() - started < 1


def test_a_local_server_by_address_answers_and_takes_no_lookup_thread(resolver):
    with serve_raw(fixed(PAGE)) as base:
        assert bounded_get.get(base + "/metrics", 2, cap=CAP).content == BODY
    assert {thread for _, thread in resolver.calls} <= {threading.current_thread()}


def test_a_name_that_resolves_reaches_the_server(resolver):
    resolver.alias["fake-host.test"] = ["127.0.0.1"]
    with serve_raw(fixed(PAGE)) as base:
        port = base.rsplit(":", 1)[1]
        response = bounded_get.get(f"http://fake-host.test:{port}/metrics", 2, cap=CAP)
    assert (response.status_code, response.content) == (200, BODY)
    # the name is looked up once; urllib3 then connects to its address (no lookup there)
    assert [host for host, _ in resolver.calls if host != "127.0.0.1"] == ["fake-host.test"]


def test_each_address_is_tried_in_order(resolver):
    """127.0.0.2 refuses (the server listens on 127.0.0.1 alone); the next address answers."""
    resolver.alias["two-addresses.test"] = ["127.0.0.2", "127.0.0.1"]
    with serve_raw(fixed(PAGE)) as base:
        port = base.rsplit(":", 1)[1]
        assert bounded_get.get(f"http://two-addresses.test:{port}/", 2, cap=CAP).content == BODY


def test_source_address_and_socket_options_still_apply(resolver, monkeypatch):
    resolver.alias["options.test"] = ["127.0.0.1"]
    peers: list[str] = []
    options: list[tuple[int, int, int]] = []
    real_setsockopt = socket.socket.setsockopt

    def setsockopt(sock, *option):
        options.append(option)
        return real_setsockopt(sock, *option)

    def answer(conn, stop):
        peers.append(conn.getpeername()[0])
        conn.sendall(PAGE)

    keepalive = (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    class Adapter(bounded_get.DeadlineAdapter):
        def init_poolmanager(self, *args, **kwargs):
            kwargs.update(source_address=("127.0.0.3", 0), socket_options=[keepalive])
            super().init_poolmanager(*args, **kwargs)

    monkeypatch.setattr(socket.socket, "setsockopt", setsockopt)
    session = requests.Session()
    session.mount("http://", Adapter())
    with session, serve_raw(answer) as base:
        port = base.rsplit(":", 1)[1]
        url = f"http://options.test:{port}/"
        assert bounded_get.get(url, 2, cap=CAP, session=session).content == BODY
    assert peers == ["127.0.0.3"]
    assert keepalive in options


def test_no_thread_is_left_behind_after_a_request(resolver):
    resolver.alias["fake-host.test"] = ["127.0.0.1"]
    with serve_raw(fixed(PAGE)) as base:
        port = base.rsplit(":", 1)[1]
        before = set(threading.enumerate())
        for _ in range(3):
            assert bounded_get.get(f"http://fake-host.test:{port}/", 2, cap=CAP).content == BODY
        started = set(threading.enumerate()) - before
    for thread in started:  # the watchdog timers, the lookups, the server's handlers: ending
        thread.join(timeout=2)
    assert [thread for thread in started if thread.is_alive()] == []
