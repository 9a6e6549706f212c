"""An Alibaba openb pod list: allocated GPUs per minute rebuilt from the pods' times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from advisor.forecast.panel import Panel
from advisor.forecast.readers.checks import MAX_STEPS, check_whole_rows, parse_amounts, refuse_rows

OPENB_EPOCH = pd.Timestamp("2023-01-01")  # the trace's times are seconds from an unnamed start


def read_openb_pods(path: str | Path, start_day: float = 116) -> Panel:
    """Alibaba cluster-trace-gpu-v2023 pod list → allocated GPUs per minute (`alibaba/gpus`).

    A scheduled pod holds num_gpu × gpu_milli/1000 GPUs from scheduled_time to deletion_time;
    never-scheduled pods hold nothing. Before `start_day` almost no pods exist (the note's days
    116–149 are the usable ~800 hours). The calendar is synthetic (seconds from the trace start
    placed at 2023-01-01), so day-of-week features carry no meaning here.
    """
    pods = _pods(path)
    pods = pods[pods["scheduled_time"].notna()]
    if pods.empty:
        raise ValueError("no scheduled pod in the list")
    gpus = pods["num_gpu"].to_numpy(float) * pods["gpu_milli"].to_numpy(float) / 1000.0
    start = (pods["scheduled_time"].to_numpy(float) // 60).astype(int)
    end = (pods["deletion_time"].to_numpy(float) // 60).astype(int)
    n = int(end.max()) + 2
    delta = np.zeros(n)
    np.add.at(delta, start, gpus)
    np.add.at(delta, end, -gpus)
    alloc = np.cumsum(delta)[:-1]
    index = OPENB_EPOCH + pd.to_timedelta(np.arange(len(alloc)), unit="min")
    values = pd.DataFrame({"alibaba/gpus": np.round(alloc, 6)}, index=index)
    later = values[values.index >= OPENB_EPOCH + pd.Timedelta(days=start_day)]
    values = later if len(later) else values  # a shorter pod list: keep all of it
    cap = pd.DataFrame(np.nan, index=values.index, columns=values.columns)
    return Panel(values, cap, "alibaba", meta={"unit": "GPUs"})


LAST_SECOND = MAX_STEPS * 60  # a pod list's grid is per minute from the trace start: 3.8 years


def _pods(path: str | Path) -> pd.DataFrame:
    """An openb pod list whose rows `read_openb_pods` can add up, or ValueError naming the first
    bad row: whole rows; num_gpu 0–64 and gpu_milli 0–1000, never empty; scheduled_time empty
    (never scheduled) or seconds from 0 to `LAST_SECOND`; a scheduled pod's deletion_time in
    that range too and not before its scheduled_time (an empty, infinite or 1e15 deletion_time
    raised IndexError or asked for 121 TiB)."""
    from advisor.ingest.openb import MAX_GPUS  # the replay's pod reader bounds num_gpu alike
    from advisor.model import MILLI

    pods = pd.read_csv(path).reset_index(drop=True)
    check_whole_rows(path)
    parse_amounts(pods["num_gpu"], "num_gpu", MAX_GPUS, "more GPUs than one pod may ask for", False)
    parse_amounts(pods["gpu_milli"], "gpu_milli", MILLI, "more than a whole GPU", False)
    seconds = f"more than {MAX_STEPS:,} minutes after the trace start, the longest grid there is"
    start = parse_amounts(pods["scheduled_time"], "scheduled_time", LAST_SECOND, seconds)
    end = parse_amounts(pods["deletion_time"], "deletion_time", LAST_SECOND, seconds)
    held = start.notna()
    refuse_rows(
        held & end.isna(),
        pods["deletion_time"],
        "deletion_time",
        lambda _i: "empty for a scheduled pod",
    )
    refuse_rows(
        held & (end < start),
        pods["deletion_time"],
        "deletion_time",
        lambda i: f"before the pod's scheduled_time {pods['scheduled_time'].iloc[i]!s}",
    )
    return pods
