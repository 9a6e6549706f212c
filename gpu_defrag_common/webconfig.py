"""TLS and basic auth from a web-config YAML in Prometheus exporter-toolkit's format.

Operators already write these files for node_exporter; accepting the same keys (and rejecting
unknown ones, as the toolkit does) means one file format across their exporters. Every
problem is one `WebConfigError` line raised at start-up, never at the first scrape.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import yaml

from gpu_defrag_common.config_text import load_yaml, parse_problem
from gpu_defrag_common.messages import one_line

TOP_LEVEL_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
}
HTTP_KEYS = {"http2", "headers"}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Headers the toolkit refuses to let a config override.
FORBIDDEN_HEADERS = {"authorization", "www-authenticate", "content-type", "content-encoding"}


class WebConfigError(ValueError):
    """A web-config file that cannot be used; the message names the file and the key."""


BCRYPT_MAX_BYTES = 72  # bcrypt reads no more of a password (htpasswd and Go's bcrypt alike)
BCRYPT_AT_ONCE = 1  # bcrypt checks at a time: at most a core, whatever the clients send
VERIFIED_KEPT = 256  # recent successful credentials remembered (a scrape every 15 s: one)


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)
    _verified: OrderedDict[bytes, None] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _checks: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(BCRYPT_AT_ONCE), repr=False
    )
    _decoys: dict[int, bytes] = field(default_factory=dict, repr=False)
    _decoy_key: bytes = field(default_factory=lambda: secrets.token_bytes(16), repr=False)

    @property
    def auth_required(self) -> bool:
        return bool(self.users)

    def authorized(self, header: str) -> bool:
        """Whether an `Authorization` header value names a user and its password."""
        credentials = basic_credentials(header)
        return credentials is not None and self.check_password(*credentials)

    def needs_check(self, head: bytes) -> bool:
        """Whether answering a request (its raw head) will cost a bcrypt check: auth is on,
        it sends Basic credentials, and they are not among the recent successes. Cheap: the
        connection loop asks it of every request to send those to the bounded auth lane."""
        if not self.users:
            return False
        header = _authorization(head)
        credentials = basic_credentials(header) if header else None
        if credentials is None:
            return False  # 401 at once
        user, password = credentials
        hashed = self.users.get(user)
        return hashed is None or not self._seen(_verified_key(user, hashed, password))

    def check_password(self, user: str, password: str) -> bool:
        """bcrypt costs ~100 ms at cost 10: successful pairs are remembered (keyed by a salted
        digest, never the plain password), so a scrape every 15 s pays it once. An unknown user
        is checked against a decoy hash of a real user's cost, so names cannot be told apart by
        timing; at most `BCRYPT_AT_ONCE` checks run at a time. Never raises: a password over
        72 bytes is cut to 72, as the hash's maker (htpasswd, Go's bcrypt) cut it."""
        secret = password.encode()[:BCRYPT_MAX_BYTES]
        hashed = self.users.get(user)
        if hashed is None:
            self._bcrypt(secret, self._decoy_for(user))
            return False
        key = _verified_key(user, hashed, password)
        if self._seen(key):
            return True
        if not self._bcrypt(secret, hashed):
            return False
        with self._lock:
            self._verified[key] = None
            while len(self._verified) > VERIFIED_KEPT:
                self._verified.popitem(last=False)
        return True

    def _seen(self, key: bytes) -> bool:
        with self._lock:
            if key in self._verified:  # a digest of 256 random-looking bits: no timing to learn
                self._verified.move_to_end(key)
                return True
        return False

    def _bcrypt(self, secret: bytes, hashed: bytes) -> bool:
        with self._checks:
            try:
                return self._checkpw(secret, hashed)
            except ValueError:  # refused input (none expected after the cut): a wrong password
                return False

    @staticmethod
    def _checkpw(secret: bytes, hashed: bytes) -> bool:
        return bcrypt.checkpw(secret, hashed)  # releases the GIL: one core per check

    def _decoy_for(self, user: str) -> bytes:
        """A hash of the cost of a real user's, chosen by a keyed digest of the name: unknown
        names take as long as known ones (with users of mixed costs, as long as one of them)."""
        costs = sorted(_cost(hashed) for hashed in self.users.values())
        digest = hmac.new(self._decoy_key, user.encode(), hashlib.sha256).digest()
        cost = costs[int.from_bytes(digest[:4], "big") % len(costs)]
        with self._lock:
            if cost not in self._decoys:
                self._decoys[cost] = bcrypt.hashpw(
                    secrets.token_bytes(16), bcrypt.gensalt(rounds=cost)
                )
            return self._decoys[cost]

    def prepare_decoys(self) -> WebConfig:
        """Make the decoy hashes now (one per cost), so the first unknown name is not slower
        by the hashing; `load_web_config` does this."""
        for hashed in self.users.values():
            cost = _cost(hashed)
            if cost not in self._decoys:
                self._decoys[cost] = bcrypt.hashpw(
                    secrets.token_bytes(16), bcrypt.gensalt(rounds=cost)
                )
        return self


def basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of a `Basic` Authorization value, or None when it is not one."""
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = (
            base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        )
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (user, password) if user and sep else None


def _authorization(head: bytes) -> str:
    """The first Authorization header of a raw request head ('' without one)."""
    for line in head.split(b"\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"authorization":
            return value.strip().decode("latin-1")
    return ""


def _verified_key(user: str, hashed: bytes, password: str) -> bytes:
    return hashlib.sha256(hashed + b"\0" + user.encode() + b"\0" + password.encode()).digest()


def _cost(hashed: bytes) -> int:
    """The cost field of a `$2b$NN$...` hash (checked at load)."""
    return int(hashed[4:6])


def load_web_config(path: str | os.PathLike[str] | None) -> WebConfig:
    """Parse and check a web-config file; no path means plain HTTP without auth."""
    if path is None or str(path) == "":
        return WebConfig()
    file = Path(path)
    try:
        raw = load_yaml(file.read_text(encoding="utf-8"))
    except OSError as error:
        raise WebConfigError(f"web config {file}: cannot read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise WebConfigError(
            f"web config {file}: not UTF-8 text: {error.reason} at byte offset {error.start}"
        ) from None
    except yaml.YAMLError as error:
        raise WebConfigError(f"web config {file}: not valid YAML: {parse_problem(error)}") from None
    except RecursionError:
        raise WebConfigError(f"web config {file}: not valid YAML: nested too deeply") from None
    if raw is None:
        return WebConfig()
    if not isinstance(raw, dict):
        raise WebConfigError(f"web config {file}: top level must be a mapping")
    _no_unknown(file, "", raw, TOP_LEVEL_KEYS)
    config = WebConfig()
    if raw.get("tls_server_config") is not None:
        config.tls = _tls_context(file, raw["tls_server_config"])
    if raw.get("http_server_config") is not None:
        config.headers = _headers(file, raw["http_server_config"])
    if raw.get("basic_auth_users") is not None:
        config.users = _users(file, raw["basic_auth_users"])
    return config.prepare_decoys()


def _no_unknown(file: Path, where: str, section: dict, allowed: set[str]) -> None:
    unknown = sorted(set(section) - allowed)
    if unknown:
        place = f" in {where}" if where else ""
        raise WebConfigError(
            f"web config {file}: unknown key {unknown[0]!r}{place} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )


def _tls_context(file: Path, section: object) -> ssl.SSLContext:
    if not isinstance(section, dict):
        raise WebConfigError(f"web config {file}: tls_server_config must be a mapping")
    _no_unknown(file, "tls_server_config", section, TLS_KEYS)
    cert, key = section.get("cert_file"), section.get("key_file")
    if not cert or not key:
        missing = "cert_file" if not cert else "key_file"
        raise WebConfigError(f"web config {file}: tls_server_config.{missing} is required")
    cert_path, key_path = _relative(file, cert), _relative(file, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _tls_version(file, "min_version", section.get("min_version", "TLS12"))
    if section.get("max_version"):
        context.maximum_version = _tls_version(file, "max_version", section["max_version"])
    try:
        context.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as error:
        raise WebConfigError(
            f"web config {file}: cannot load cert_file {cert_path} / key_file {key_path}: "
            f"{one_line(error)}"
        ) from None
    auth_type = section.get("client_auth_type", "NoClientCert")
    if auth_type not in CLIENT_AUTH:
        raise WebConfigError(
            f"web config {file}: tls_server_config.client_auth_type {auth_type!r} is not one of "
            f"{', '.join(CLIENT_AUTH)}"
        )
    context.verify_mode = CLIENT_AUTH[auth_type]
    ca = section.get("client_ca_file")
    if auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not ca:
        raise WebConfigError(
            f"web config {file}: client_auth_type {auth_type} needs tls_server_config.client_ca_file"
        )
    if ca:
        try:
            context.load_verify_locations(_relative(file, ca))
        except (OSError, ssl.SSLError) as error:
            raise WebConfigError(
                f"web config {file}: cannot load client_ca_file: {one_line(error)}"
            ) from None
    return context


def _tls_version(file: Path, key: str, value: object) -> ssl.TLSVersion:
    try:
        return TLS_VERSIONS[str(value)]
    except KeyError:
        raise WebConfigError(
            f"web config {file}: tls_server_config.{key} {value!r} is not one of "
            f"{', '.join(TLS_VERSIONS)}"
        ) from None


def _headers(file: Path, section: object) -> dict[str, str]:
    if not isinstance(section, dict):
        raise WebConfigError(f"web config {file}: http_server_config must be a mapping")
    _no_unknown(file, "http_server_config", section, HTTP_KEYS)
    # accepted for exporter-toolkit files (where it is HTTP/2's switch); we serve HTTP/1.1 either way
    if "http2" in section and not isinstance(section["http2"], bool):
        raise WebConfigError(
            f"web config {file}: http_server_config.http2 must be true or false, "
            f"got {section['http2']!r}"
        )
    headers = section.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError(f"web config {file}: http_server_config.headers must be a mapping")
    for name in headers:
        if str(name).lower() in FORBIDDEN_HEADERS:
            raise WebConfigError(f"web config {file}: header {name!r} cannot be overridden")
    return {str(name): str(value) for name, value in headers.items()}


def _users(file: Path, section: object) -> dict[str, bytes]:
    if not isinstance(section, dict):
        raise WebConfigError(f"web config {file}: basic_auth_users must be a mapping")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        text = str(hashed or "")
        cost = text[4:6]
        if (
            not text.startswith(("$2a$", "$2b$", "$2y$"))
            or len(text) != 60
            or not (cost.isascii() and cost.isdigit() and 4 <= int(cost) <= 31)
            or text[6] != "$"
        ):
            raise WebConfigError(
                f"web config {file}: basic_auth_users.{user} is not a bcrypt hash "
                "(generate one with `htpasswd -nBC 10 '' | tr -d ':\\n'`)"
            )
        users[str(user)] = text.encode()
    return users


def _relative(file: Path, value: object) -> str:
    """Paths in the file are relative to the file, as in exporter-toolkit."""
    candidate = Path(str(value))
    return str(candidate if candidate.is_absolute() else file.parent / candidate)
