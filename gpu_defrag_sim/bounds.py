"""The simulator's bounds, shared by every way a fleet is asked for: the exporter's `--sim.*`
flags, a `sim:` source's `nodes=`, `t=` and `seed=`, and `gpu-defrag demo --sim-speed`.

They exist so that a typo is refused at its flag instead of a collection that never ends: the
simulator's cost grows with nodes, and every collection steps `speed` x interval simulated
seconds, the first one `--sim.start` of them.
"""

from __future__ import annotations

from gpu_defrag_common.units import duration_at_most, number

# 10,000 nodes (80,000 GPUs, beyond the largest real clusters this models; the bench uses 1,000)
# take ~20 s and ~330 MB to build for the two scaled presets, whose build grows as nodes².
MAX_NODES = 10_000
# An hour a second: a simulated day in 24 real seconds. A 15-s collection then steps 15 simulated
# hours, ~14 s for 10,000 nodes, inside the collection's 30-s timeout; faster shows nothing a
# person can follow (the demo runs at 60).
MAX_SPEED = 3600.0
# 30 days: twice the 16 days of past the advisor keeps (`--history.backfill`), and every reader
# of the page re-simulates the fleet from t = 0 (the demo starts at 7d).
MAX_START_S = 30 * 86400.0

seed_flag = number(0, kind=int)  # numpy's generators take no negative seed
nodes_flag = number(1, MAX_NODES, kind=int)
speed_flag = number(0, MAX_SPEED, above=True)  # also `gpu-defrag demo --sim-speed`
start_flag = duration_at_most(MAX_START_S, " of simulated past")  # `--sim.start`
