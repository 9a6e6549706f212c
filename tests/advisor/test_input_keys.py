"""Every input file the advisor reads refuses what it does not know, by its path: the
snapshot (test_snapshot.py), policies (test_planner_borrow_rules.py) and, here, the siblings:
a `--demand` arrival history with a misspelt column, a demand JSON with a key that is no
shape, and a JSON policy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from advisor.forecast.readers.long import read_long
from advisor.planner.constraints import PolicyError, load_policy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _plan(*args: str) -> subprocess.CompletedProcess:
    seed = str(EXAMPLES / "seed-16x8-a100.json")
    return subprocess.run(
        [sys.executable, "-m", "advisor.cli", "plan", seed, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_misspelt_capacity_column_is_refused_not_dropped(tmp_path, suffix) -> None:
    """examples/arrivals.csv with a `capcity` column: it would have been dropped without a
    word (no capacity known); it is one line naming the column and the closest one."""
    frame = pd.read_csv(EXAMPLES / "arrivals.csv").head(48)
    frame["capcity"] = 64
    path = tmp_path / f"arrivals{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path)
    with pytest.raises(ValueError) as error:
        read_long(path)
    assert str(error.value) == (
        "capcity: unknown column (did you mean 'capacity'?); the long format has time, series, "
        "value, capacity"
    )
    run = _plan("--goal", "forecast=6h", "--demand", str(path))
    assert run.returncode == 2 and run.stdout == ""
    assert "capcity: unknown column (did you mean 'capacity'?)" in run.stderr
    frame.rename(columns={"capcity": "capacity"}).to_csv(tmp_path / "ok.csv", index=False)
    assert len(read_long(tmp_path / "ok.csv").capacity.columns)


def test_a_demand_key_that_is_no_shape_is_refused(tmp_path) -> None:
    demand = tmp_path / "demand.json"
    demand.write_text('{"8": 2, "8 jobs": 1}')
    run = _plan("--goal", "forecast=6h", "--demand", str(demand))
    assert run.returncode == 2
    assert "bad shape '8 jobs'" in run.stderr


def test_a_json_policy_refuses_an_unknown_key_by_its_path(tmp_path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(
        '{"quotas": {"rnd": 40, "algorithms": 30}, "borrowing_rules": '
        '[{"lender": "algorithms", "borrower": "rnd", "auto_return": "2h"}]}'
    )
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    assert str(error.value).startswith(
        f"{path}: borrowing_rules[0].auto_return: unknown key (did you mean 'auto_return_timeout'?)"
    )
