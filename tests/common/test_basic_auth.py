"""Basic auth under abuse: long passwords, user-name probing by timing, floods of wrong
passwords. bcrypt itself runs for real (no stand-in): costs are kept low to stay quick."""

from __future__ import annotations

import base64
import logging
import statistics
import threading
import time

import bcrypt
import pytest
import requests

from gpu_defrag_common.connections import Limits
from gpu_defrag_common.server import ExporterServer
from gpu_defrag_common.webconfig import WebConfig, load_web_config
from tests.common.test_connections import CountingPage

LONG = "p" * 72 + "-and-then-some-more"  # 91 bytes


def hashed(password: str, cost: int) -> str:
    """What `htpasswd -B` writes: bcrypt reads the first 72 bytes of a password."""
    return bcrypt.hashpw(password.encode()[:72], bcrypt.gensalt(rounds=cost)).decode()


def web_config(tmp_path, **users: str) -> WebConfig:
    path = tmp_path / "web.yml"
    lines = ["basic_auth_users:"] + [f"  {user}: '{value}'" for user, value in users.items()]
    path.write_text("\n".join(lines) + "\n")
    return load_web_config(path)


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def median_cpu_seconds(*checks, runs: int = 7) -> list[float]:
    """Each check's median CPU seconds in this thread, the checks taken in turn run by run:
    bcrypt's work is what must match, and the machine's other load (other test workers)
    neither counts in CPU time nor falls on one check's runs more than another's."""
    times: list[list[float]] = [[] for _ in checks]
    for _ in range(runs):
        for check, spent in zip(checks, times, strict=True):
            started = time.thread_time()
            check()
            spent.append(time.thread_time() - started)
    return [statistics.median(spent) for spent in times]


def test_a_password_over_72_bytes_is_a_quiet_401_and_a_long_real_one_logs_in(tmp_path, caplog):
    """bcrypt 5 raises ValueError past 72 bytes: no answer at all and an ERROR line per
    request, for any user name. htpasswd and Go's bcrypt hash the first 72 bytes."""
    server = ExporterServer(
        "127.0.0.1:0", CountingPage(), web_config(tmp_path, prometheus=hashed(LONG, 4))
    ).start()
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        with caplog.at_level(logging.INFO):
            for user in ("prometheus", "nobody"):
                for _ in range(5):
                    answer = requests.get(url, auth=(user, "x" * 200), timeout=10)
                    assert answer.status_code == 401
            assert requests.get(url, auth=("prometheus", LONG), timeout=10).status_code == 200
    finally:
        server.close()
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


def test_an_unknown_user_costs_what_a_real_users_wrong_password_costs(tmp_path):
    """The decoy hash for unknown names was always cost 10: a cost-12 user answered wrong
    passwords 3.7 times slower than an unknown name (972 ms against 263 ms)."""
    web = web_config(tmp_path, prometheus=hashed("right", 8))
    known, unknown = median_cpu_seconds(
        lambda: web.check_password("prometheus", "wrong"),
        lambda: web.check_password("mallory", "wrong"),
    )
    assert 0.5 < unknown / known < 2.0, (known, unknown)


def test_with_users_of_mixed_costs_every_unknown_name_takes_one_of_their_costs(tmp_path):
    web = web_config(tmp_path, a=hashed("x", 4), b=hashed("x", 5), c=hashed("x", 5))
    costs = {int(web._decoy_for(f"probe-{n}")[4:6]) for n in range(200)}
    assert costs == {4, 5}
    assert web._decoy_for("probe-1") == web._decoy_for("probe-1")  # one name, one cost


class CountingChecks(WebConfig):
    """Records how many bcrypt checks ran at once (each one a real bcrypt.checkpw)."""

    running = 0
    most = 0
    lock = threading.Lock()

    @classmethod
    def _checkpw(cls, secret: bytes, hashed: bytes) -> bool:
        with cls.lock:
            cls.running += 1
            cls.most = max(cls.most, cls.running)
        try:
            return bcrypt.checkpw(secret, hashed)
        finally:
            with cls.lock:
                cls.running -= 1


def test_wrong_passwords_are_checked_one_at_a_time(tmp_path):
    """20 clients sending wrong passwords ran 20 bcrypt checks at once (bcrypt releases the
    GIL), all cores busy, and slowed authorised scrapes from 4.9 ms to 152 ms median. Checks
    now take turns; bench/server_abuse.py measures the scrapes."""
    users = web_config(tmp_path, prometheus=hashed("right", 6)).users
    web = CountingChecks(users=users).prepare_decoys()
    threads = [
        threading.Thread(target=web.check_password, args=(user, f"wrong-{n}"))
        for n in range(12)
        for user in ("prometheus", "mallory")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert CountingChecks.most == 1


def test_remembered_credentials_skip_the_auth_lane(tmp_path):
    web = web_config(tmp_path, prometheus=hashed("right", 4))
    head = f"GET /metrics HTTP/1.1\r\nAuthorization: {header('prometheus', 'right')}\r\n\r\n"
    assert web.needs_check(head.encode())  # not seen yet: a bcrypt check
    assert web.check_password("prometheus", "right")
    assert not web.needs_check(head.encode())  # remembered: the fast lane
    wrong = head.replace(header("prometheus", "right"), header("prometheus", "wrong"))
    assert web.needs_check(wrong.encode())
    assert not web.needs_check(b"GET /metrics HTTP/1.1\r\n\r\n")  # no credentials: 401 at once
    assert not web.needs_check(b"GET / HTTP/1.1\r\nAuthorization: Bearer x\r\n\r\n")


def test_a_full_auth_queue_answers_503_and_remembered_scrapes_still_pass(tmp_path):
    web = web_config(tmp_path, prometheus=hashed("right", 10))
    server = ExporterServer("127.0.0.1:0", CountingPage(), web, limits=Limits(auth_queue=1)).start()
    url = f"http://127.0.0.1:{server.port}/metrics"
    statuses: list[int] = []
    try:
        assert requests.get(url, auth=("prometheus", "right"), timeout=30).status_code == 200

        def wrong(n: int) -> None:
            answer = requests.get(url, auth=("prometheus", f"wrong-{n}"), timeout=30)
            statuses.append(answer.status_code)
            if answer.status_code == 503:
                assert answer.headers["Retry-After"] == "1"

        threads = [threading.Thread(target=wrong, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(0.1)
        started = time.monotonic()
        assert requests.get(url, auth=("prometheus", "right"), timeout=30).status_code == 200
        remembered = time.monotonic() - started
        for thread in threads:
            thread.join()
    finally:
        server.close()
    assert 503 in statuses and 401 in statuses and set(statuses) <= {401, 503}
    assert remembered < 1.0, remembered  # not behind the bcrypt checks


@pytest.mark.parametrize(
    "value",
    ["$2b$1$" + "a" * 54, "$2b$99$" + "a" * 53, "$2b$10x" + "a" * 53, "$2b$10$short"],
)
def test_a_hash_with_a_bad_cost_is_refused_at_load(tmp_path, value):
    from gpu_defrag_common.webconfig import WebConfigError

    with pytest.raises(WebConfigError, match="not a bcrypt hash"):
        web_config(tmp_path, prometheus=value)
