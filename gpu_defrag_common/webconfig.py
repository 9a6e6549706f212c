"""TLS and basic auth from a web-config YAML in Prometheus exporter-toolkit's format.

Operators already write these files for node_exporter; accepting the same keys (and rejecting
unknown ones, as the toolkit does) means one file format across their exporters. Every
problem is one `WebConfigError` line raised at start-up, never at the first scrape.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
import threading
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


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)
    _verified: set[bytes] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def auth_required(self) -> bool:
        return bool(self.users)

    def check_password(self, user: str, password: str) -> bool:
        """bcrypt costs ~100 ms at cost 10: remember successful pairs (keyed by a salted
        digest, never the plain password) so a scrape every 15 s does not pay it each time."""
        hashed = self.users.get(user)
        if hashed is None:
            # Spend the same time as a real check so user names cannot be probed by timing.
            bcrypt.checkpw(password.encode(), _DUMMY_HASH)
            return False
        key = hashlib.sha256(hashed + b"\0" + user.encode() + b"\0" + password.encode()).digest()
        with self._lock:
            if any(hmac.compare_digest(key, known) for known in self._verified):
                return True
        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._verified.add(key)
        return True


_DUMMY_HASH = bcrypt.hashpw(b"not-a-user", bcrypt.gensalt(rounds=10))


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
    return config


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
        if not text.startswith(("$2a$", "$2b$", "$2y$")) or len(text) != 60:
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
