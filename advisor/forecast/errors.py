"""The error every forecast INPUT problem becomes: one line naming the source."""

from __future__ import annotations


class InputError(ValueError):
    """A forecast INPUT that cannot be read, said in one line that names the source."""
