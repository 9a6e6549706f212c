"""Errors as one line, the form every log line and CLI error of the project takes."""

from __future__ import annotations


def one_line(error: BaseException) -> str:
    """The error's text with line breaks and runs of spaces folded (PyYAML, gRPC and HTTP
    libraries write several lines), or its type where it has no text."""
    return " ".join(str(error).split()) or type(error).__name__
