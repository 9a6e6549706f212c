"""What the advisor's processes log: a source's password never shows, and a warning that repeats
on every run shows once an hour.

A source spec may carry credentials (`http://user:pass@host`); the readers name the URL they
read in their warnings and errors. `redact` is the one way a source is shown. The servers
(`advise`, `app`) put both filters on their handlers (`install_log_filters`); a one-shot command
(`analyze`, `snapshot`, `plan`, `backtest`), which configures no handler, has its warnings
printed by Python's last-resort handler, which `redact_last_resort` filters.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence

# scheme://user:password@ (the password may hold a raw '@': the userinfo ends at the last one)
_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/?#@\s:]*)(?P<pw>:[^/?#\s]*)?@"
)


def redact(text: str) -> str:
    """`text` (a source spec, or an error or log line naming it) with the password of every
    URL in it masked: `admin:***@`, and a lone user name, which may be a token, `***@`. The
    one way a source is shown: the metric label, the API's meta and source fields, errors and
    log lines; the reader keeps the real spec."""

    def mask(match: re.Match[str]) -> str:
        user = f"{match['user']}:***" if match["pw"] else "***"
        return f"{match['scheme']}{user}@"

    return _USERINFO.sub(mask, text)


class RedactingFilter(logging.Filter):
    """Passes every record with `redact` applied to all it shows: the message with its
    arguments, the traceback (whose messages, from urllib or an HTTP library, may name the
    source's URL, causes included) and the stack. The traceback is formatted here once and
    kept as text, and the exception dropped, so no handler formats it again from the
    exception itself. A record is redacted once: the service's own pass this filter on their
    logger and again on the process's handlers (`install_log_filters`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "redacted", False):
            return True
        record.redacted = True
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: shown raw, as a handler would, not raised here
            message = f"{record.msg} {record.args!r}"
        record.msg, record.args = redact(message), ()
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class RepeatFilter(logging.Filter):
    """Shows a warning that repeats word for word (a source that keeps serving the same bad
    page warns on every run, every few seconds) once per `every_s`; the next one shown after
    that says how many were held back. Other levels, and a warning that changed, pass."""

    def __init__(
        self, every_s: float = 3600.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self._shown: dict[tuple[str, str], tuple[float, int]] = {}  # -> (when shown, held back)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        try:
            message = record.getMessage()
        except Exception:
            return True  # a bad format string: the handler shows it as it would
        key, now = (record.name, message), self.clock()
        with self._lock:
            shown, held = self._shown.get(key, (-math.inf, 0))
            if now - shown < self.every_s:
                self._shown[key] = (shown, held + 1)
                return False
            self._shown.pop(key, None)  # re-inserted last: the oldest entries go first
            self._shown[key] = (now, 0)
            while len(self._shown) > MAX_REPEATS_KEPT:
                del self._shown[next(iter(self._shown))]
        if held:
            every = f"{self.every_s / 3600:g} h" if self.every_s >= 3600 else f"{self.every_s:g} s"
            record.msg, record.args = f"{message} ({held} more like it held back in {every})", ()
        return True


MAX_REPEATS_KEPT = 1024  # distinct warnings `RepeatFilter` remembers


def install_log_filters(handlers: Sequence[logging.Handler], every_s: float = 3600.0) -> None:
    """The service process's handlers: every record, whichever module logs it, is redacted
    (`RedactingFilter`), and a warning repeated word for word is shown once per `every_s`."""
    repeats = RepeatFilter(every_s)
    for handler in handlers:
        handler.addFilter(RedactingFilter())
        handler.addFilter(repeats)


def redact_last_resort() -> None:
    """Redact what Python's last-resort handler prints (a warning of a process that configured
    no handler: a one-shot command), once per process."""
    handler = logging.lastResort
    if handler is not None and not any(isinstance(f, RedactingFilter) for f in handler.filters):
        handler.addFilter(RedactingFilter())
