"""The simulated fleet: presets that match real layouts, a workload over time, NodeReadings out.

Its own package because both sides run it: the exporter's sim backend serves it, the advisor's
`sim:` source and the service's back-fill re-simulate it. It reads and writes only the contract
(`exporter.readings`) and imports neither the rest of the exporter nor the advisor.

Presets (`PRESETS`): `a100-16x8` (16 DGX A100, hand-made t=0 with exactly 60 free GPUs and only
4 whole free nodes), `mixed-h100-a100-v100` (pools by model, busy H100/A100, idle V100, one MIG
node), `nvlink-islands` (8-GPU nodes with two 4-GPU NVLink islands joined across sockets).
Every preset takes a node-count override (`nodes=`, `--sim.nodes`): `a100-16x8` tiles its
16-node t=0 layout, the others scale their pools; the benchmark uses `a100-16x8` at 1,000 nodes.

Jobs arrive per pool as a Poisson process with a daily/weekly rhythm, sizes from a mix of
fractional, 1/2/4/8-GPU and occasional multi-node jobs, heavy-tailed durations, and activity
that varies per job (some allocated but idle, some with no process); new jobs are placed first
fit on the pool (GPU model) they ask for, wait up to 6 h when nothing fits, then give up.

Use `fleet_at(preset, seed, sim_seconds)` for a one-off snapshot, or `SimFleet` to step time
(`advance(seconds)`, `readings()`, `running_jobs()`, `pending_jobs()`, `arrival_log`). The
state is a pure function of (preset, seed, nodes, simulated time), however it is stepped.
"""

from gpu_defrag_sim.fleet import SimFleet, SimJob, fleet_at
from gpu_defrag_sim.presets import PRESETS
from gpu_defrag_sim.workload import SIM_EPOCH, day_factor, is_working_hours

__all__ = [
    "PRESETS",
    "SIM_EPOCH",
    "SimFleet",
    "SimJob",
    "day_factor",
    "fleet_at",
    "is_working_hours",
]
