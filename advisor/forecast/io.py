"""Open any forecast INPUT as a `Panel`: the one entry the CLI and the benches call.

The readers, one per format, live in `advisor.forecast.readers`: the generic long CSV/Parquet
format (`long`), the Philly node sequence (`philly`), the Helios VC files (`helios`), an openb pod
list (`openb`) and a Prometheus range query (`prometheus`). `load` picks one by the INPUT's form
and turns every way it can fail into one `InputError` line naming the source.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from advisor.forecast.errors import InputError
from advisor.forecast.panel import Panel, grid_step
from advisor.forecast.readers.checks import step_text
from advisor.forecast.readers.helios import read_helios
from advisor.forecast.readers.long import read_long, unparsable
from advisor.forecast.readers.openb import read_openb_pods
from advisor.forecast.readers.philly import read_philly
from advisor.forecast.readers.prometheus import read_prometheus
from gpu_defrag_common.messages import one_line


def load(source: str, freq: str | None = None) -> Panel:
    """Open any supported INPUT: a Philly CSV, a Helios dir/file, an openb pod list, long
    CSV/Parquet, or prometheus+http(s)://.

    Every way a source can be unreadable (missing file, wrong columns, unparsable values, an
    unreachable Prometheus, no data at all) becomes one `InputError` line naming the source
    (for a Helios folder, the VC file at fault), so the CLI can say what is wrong instead of
    printing a traceback.
    """
    from advisor.ingest.exporter_scrape import SourceUnavailable

    try:
        panel = _open(source, freq)
    except InputError:
        raise  # already names the file at fault (a Helios folder's VC file)
    except pd.errors.ParserError as error:  # a Philly or openb CSV pandas cannot split
        raise InputError(f"{source}: {unparsable(error)}") from error
    except (OSError, ValueError, KeyError, SourceUnavailable) as error:
        raise InputError(f"{source}: {one_line(error)}") from error
    return _with_readings(panel, f"{source}: no readings")


def hourly(panel: Panel, source: str) -> Panel:
    """`panel` by the hour, as every forecast and backtest reads it. An input of which no hour
    holds enough readings is an `InputError`: its forecast would be all NaN."""
    return _with_readings(
        panel.resample("h"),
        f"{source}: no hour holds half the readings its grid step gives it "
        f"({step_text(grid_step(panel.index))}); an hour with fewer is masked",
    )


def _with_readings(panel: Panel, message: str) -> Panel:
    if panel.values.empty or not np.isfinite(panel.values.to_numpy(float)).any():
        raise InputError(message)
    return panel


def _open(source: str, freq: str | None) -> Panel:
    if source.startswith(("prometheus+http://", "prometheus+https://")):
        return read_prometheus(source)
    path = Path(source)
    if path.is_dir():
        return read_helios(path)
    if path.name == "cluster_sequence_vc.csv":
        return read_helios(path)
    if path.suffix == ".csv":
        header = pd.read_csv(path, nrows=0).columns
        if {"active", "total"} <= set(header) and "series" not in header:
            return read_philly(path)
        if {"scheduled_time", "deletion_time", "num_gpu", "gpu_milli"} <= set(header):
            return read_openb_pods(path)
        if {"num_gpu", "gpu_milli"} <= set(header):
            raise ValueError(
                "an openb pod list without scheduled_time and deletion_time has no times to "
                "forecast (the replay's synthetic lists are such)"
            )
    return read_long(path, freq=freq)
