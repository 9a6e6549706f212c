"""`--json` of the commands that print tables (`replay`, `backtest`, `forecast`): one JSON
document on standard output instead of the tables, so scripts read the same figures the tables
show without parsing them. Tables become lists of records (one object per row); NaN and
infinities become null and times ISO 8601 text, as in the advisor's API (`results.jsonable`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from advisor.results import jsonable

if TYPE_CHECKING:
    import pandas as pd


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of `frame` as JSON objects, its columns as keys."""
    frame = frame.copy()
    for column in frame.columns:
        if str(frame[column].dtype).startswith("datetime64"):
            frame[column] = frame[column].map(lambda t: None if t != t else t.isoformat())
    return jsonable(frame.to_dict(orient="records"))


def dumps(document: dict[str, Any]) -> str:
    """The document as indented JSON text with a final newline (no NaN: it is not JSON)."""
    return json.dumps(jsonable(document), indent=2, allow_nan=False) + "\n"
