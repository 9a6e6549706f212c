"""Helios VC files (`<vc>/cluster_sequence_vc.csv`, per minute): one series per VC and the total."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from advisor.forecast.errors import InputError
from advisor.forecast.panel import Panel
from advisor.forecast.readers.checks import on_regular_grid, per_minute
from gpu_defrag_common.messages import one_line

EARTH_TEST = ("2020-05-25", "2020-06-01")


def read_helios_vc(path: str | Path, name: str | None = None) -> tuple[pd.Series, pd.Series]:
    """One Helios `cluster_sequence_vc.csv`: running GPUs and the VC size per minute."""
    path = Path(path)
    raw = pd.read_csv(
        path, usecols=["time", "running_gpu_num", "total_gpu_num"], parse_dates=["time"]
    )
    raw = on_regular_grid(per_minute(path, raw, "running_gpu_num", "total_gpu_num"), "min")
    vc = name or path.parent.name
    return raw["running_gpu_num"].rename(vc).astype(float), raw["total_gpu_num"].rename(vc).astype(
        float
    ).ffill()


def helios_files(path: str | Path) -> list[Path]:
    """The VC files a Helios INPUT reads: the file itself, or a folder's
    `<vc>/cluster_sequence_vc.csv` files."""
    path = Path(path)
    return [path] if path.is_file() else sorted(path.glob("*/cluster_sequence_vc.csv"))


def read_helios(path: str | Path, total: bool = True) -> Panel:
    """A Helios directory of `<vc>/cluster_sequence_vc.csv` (or one such file); adds `<cluster>/total`."""
    path = Path(path)
    files = helios_files(path)
    if not files:
        raise FileNotFoundError(f"no */cluster_sequence_vc.csv under {path}")
    cluster = (path.parent.parent if path.is_file() else path).name.replace("helios-", "")
    vals, caps = {}, {}
    for f in files:
        try:
            v, c = read_helios_vc(f)
        except (OSError, ValueError, KeyError) as error:
            if path.is_file():
                raise  # the INPUT is the file: `load` names it
            # a folder's error names the VC file at fault, not only the folder
            raise InputError(f"{f}: {one_line(error)}") from error
        vals[f"{cluster}/{v.name}"] = v
        caps[f"{cluster}/{v.name}"] = c
    values = pd.DataFrame(vals)
    cap = pd.DataFrame(caps)
    if total and len(files) > 1:
        # The total is masked wherever any VC is masked so the levels stay coherent.
        values[f"{cluster}/total"] = values.sum(axis=1, min_count=len(files)).where(
            values.notna().all(axis=1)
        )
        cap[f"{cluster}/total"] = cap.sum(axis=1, min_count=1)
    first = values.index.min()
    test_from, test_to = None, None
    if len(values.index) and first.year == 2020 and first.month == 5:
        test_from, test_to = pd.Timestamp(EARTH_TEST[0]), pd.Timestamp(EARTH_TEST[1])
    return Panel(values, cap, cluster, test_from, test_to, {"unit": "GPUs"})
