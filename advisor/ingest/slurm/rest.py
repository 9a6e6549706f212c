"""slurmrestd, read over HTTP(S) or a local socket. GET only:

    /openapi/v3 (or /openapi)          which /slurm/v0.0.NN versions the server serves
    /slurm/v0.0.NN/nodes               nodes
    /slurm/v0.0.NN/jobs                jobs
    /slurm/v0.0.NN/reservations        reservations
    /slurmdb/v0.0.NN/qos, /associations  quotas (slurmdbd only)

Over HTTP(S) every request carries `X-SLURM-USER-NAME` and `X-SLURM-USER-TOKEN` (a JWT from
`scontrol token`, read from $SLURM_JWT or the spec's token-file=); over a unix socket
slurmrestd's rest_auth/local knows the caller from the socket and no token is sent.
"""

from __future__ import annotations

import getpass
import http.client
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from advisor.ingest.slurm.commands import SlurmUnavailable
from advisor.ingest.slurm.values import SlurmFormatError
from gpu_defrag_common import bounded_get

TOKEN_ENV = "SLURM_JWT"
USER_ENV = "SLURM_USER"
ANSWER_CAP = 1 << 30  # 1 GiB: 100,000 jobs in 24.11's JSON are ~600 MB
KNOWN_APIS = tuple(f"v0.0.{n}" for n in range(37, 45))  # 21.08 .. 25.11
_API = re.compile(r"/slurm/(v0\.0\.\d+)/jobs/?$")


class Rest:
    """GETs against one slurmrestd within one deadline."""

    def __init__(self, base: str, timeout: float, user: str = "", token_file: str = "") -> None:
        self.base = base
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.unix = base.startswith("unix://")
        self.headers: dict[str, str] = {"Accept": "application/json"}
        if not self.unix:
            self.headers["X-SLURM-USER-NAME"] = user or os.environ.get(USER_ENV) or _me()
            token = _token(token_file)
            if token:
                self.headers["X-SLURM-USER-TOKEN"] = token
        self.session: requests.Session | None = None

    def _left(self, path: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SlurmUnavailable(f"slurmrestd {self.base}{path}: no time left of the timeout")
        return left

    def get(self, path: str, *, missing_ok: bool = False) -> Any:
        """The JSON answer to GET `path`; None for a 404 when `missing_ok`."""
        status, body = (self._unix if self.unix else self._http)(path, self._left(path))
        where = f"slurmrestd {self.base}{path}"
        if status == 404 and missing_ok:
            return None
        if status in (401, 403):
            detail = body[:120].decode("utf-8", "replace").strip() or "no detail"
            hint = (
                "set SLURM_JWT (scontrol token) or token-file=FILE and user=NAME"
                if not self.unix
                else "slurmrestd's rest_auth/local refused this process's user"
            )
            raise SlurmUnavailable(f"{where}: refused ({status} {detail}): {hint}")
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            text = body[:80].decode("utf-8", "replace").strip()
            raise SlurmFormatError(f"{where}: answered {status} without JSON: {text!r}") from None
        if status >= 400:
            errors = doc.get("errors") if isinstance(doc, dict) else None
            first = errors[0] if isinstance(errors, list) and errors else {}
            detail = (
                first.get("description") or first.get("error") if isinstance(first, dict) else ""
            )
            raise SlurmUnavailable(f"{where}: answered {status}: {detail or 'no detail'}")
        return doc

    def _http(self, path: str, left: float) -> tuple[int, bytes]:
        if self.session is None:
            self.session = bounded_get.new_session()
            self.session.headers.update(self.headers)
        try:
            response = bounded_get.get(self.base + path, left, cap=ANSWER_CAP, session=self.session)
        except requests.Timeout:
            raise SlurmUnavailable(
                f"slurmrestd {self.base}{path} did not answer within {self.timeout:g} s"
            ) from None
        except bounded_get.AnswerTooSlow:
            raise SlurmUnavailable(
                f"slurmrestd {self.base}{path}: the answer did not end within {self.timeout:g} s"
            ) from None
        except bounded_get.AnswerTooLarge:
            raise SlurmUnavailable(
                f"slurmrestd {self.base}{path}: answer larger than {ANSWER_CAP >> 20} MiB"
            ) from None
        except requests.RequestException as error:
            raise SlurmUnavailable(
                f"slurmrestd {self.base} is unreachable: {_reason(error)}"
            ) from None
        return response.status_code, response.content

    def _unix(self, path: str, left: float) -> tuple[int, bytes]:
        sock_path = urlsplit(self.base).path
        connection = _UnixConnection(sock_path, left)
        try:
            connection.request("GET", path, headers=self.headers)
            response = connection.getresponse()
            body = bytearray()
            while chunk := response.read(1 << 20):
                body += chunk
                if len(body) > ANSWER_CAP:
                    raise SlurmUnavailable(
                        f"slurmrestd {self.base}{path}: answer larger than {ANSWER_CAP >> 20} MiB"
                    )
                if time.monotonic() > self.deadline:
                    raise SlurmUnavailable(
                        f"slurmrestd {self.base}{path}: the answer did not end within "
                        f"{self.timeout:g} s"
                    )
            return response.status, bytes(body)
        except TimeoutError:
            raise SlurmUnavailable(
                f"slurmrestd {self.base}{path} did not answer within {self.timeout:g} s"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            raise SlurmUnavailable(
                f"slurmrestd {self.base} is unreachable: {getattr(error, 'strerror', None) or error}"
            ) from None
        finally:
            connection.close()

    def api_version(self, pinned: str = "") -> str:
        """The OpenAPI version to read: `pinned`, else the newest that both the server (its
        OpenAPI description) and this reader know."""
        if pinned:
            return pinned
        doc = self.get("/openapi/v3", missing_ok=True)
        if doc is None:
            doc = self.get("/openapi")
        return choose_api(doc, f"slurmrestd {self.base}")


def choose_api(openapi: Any, where: str) -> str:
    """The newest /slurm/v0.0.NN version that an OpenAPI description lists and this reader
    knows; SlurmFormatError naming what it lists otherwise."""
    paths = openapi.get("paths", {}) if isinstance(openapi, dict) else {}
    served = {m.group(1) for path in paths for m in [_API.search(path)] if m}
    shared = [v for v in KNOWN_APIS if v in served]
    if not shared:
        raise SlurmFormatError(
            f"{where}: serves no Slurm API this reader knows (it serves "
            f"{', '.join(sorted(served)) or 'none'}; known: {KNOWN_APIS[0]} to "
            f"{KNOWN_APIS[-1]}); is the openapi/slurmctld plugin loaded?"
        )
    return max(shared, key=lambda v: int(v.rsplit(".", 1)[1]))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _me() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _token(token_file: str) -> str:
    if token_file:
        try:
            return Path(token_file).read_text().strip().removeprefix(f"{TOKEN_ENV}=")
        except OSError as error:
            raise SlurmUnavailable(
                f"token-file={token_file}: cannot read: {error.strerror or error}"
            ) from None
    return os.environ.get(TOKEN_ENV, "").strip()


def _reason(error: requests.RequestException) -> str:
    """The innermost cause of a requests error, one line ("Connection refused")."""
    cause: BaseException | None = error
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(getattr(cause, "reason", None) or cause or error)
    match = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return match.group(1) if match else text.splitlines()[0][:160]
