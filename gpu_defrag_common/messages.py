"""Errors as one line, the form every log line and CLI error of the project takes."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def one_line(error: BaseException, *, typed: bool = False) -> str:
    """The error's text with line breaks and runs of spaces folded (PyYAML, gRPC and HTTP
    libraries write several lines), or its type where it has no text. `typed` puts the type
    before the text too (`KeyError: 'x'`), for errors no one expected, whose text alone
    (`'x'`) says little."""
    text = " ".join(str(error).split())
    name = type(error).__name__
    if typed and text:
        return f"{name}: {text}"
    return text or name


def error_line(command: str, message: str) -> str:
    """`gpu-defrag COMMAND: error: MESSAGE`, the wording of every command's failure (argparse's
    own usage errors read the same); `command` "" for the top level."""
    who = f"gpu-defrag {command}" if command else "gpu-defrag"
    return f"{who}: error: {message}"


def say_error(command: str, message: str) -> None:
    """`error_line` on standard error."""
    import sys

    print(error_line(command, message), file=sys.stderr)


def unknown_key(key: str, keys: Iterable[str], what: str, noun: str = "key") -> str:
    """The problem text for a key `what` does not have (a file's typo): the closest known key
    when one is close, then every key it has. `unknown key (did you mean 'migratable'?); an
    allocation has id, job, ...`"""
    known = list(keys)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75) or [
        k for k in known if len(key) >= 4 and (k.startswith(key) or key.startswith(k))
    ]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {noun}{hint}; {what} has {', '.join(known)}"
