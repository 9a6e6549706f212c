"""What a scheduler source knows, in one neutral shape every scheduler fills the same way.

A scheduler source (Kubernetes, kube-state-metrics through Prometheus, Slurm) reads its own
objects and hands over one `SchedulerView`:

- `SchedNode` per node: pool and rack ("" = unknown, never guessed), whether the scheduler may
  place work there (cordoned, drained, tainted = not free capacity, with the reason), GPU model
  and the GPUs it hands out (whole GPUs plus MIG instances by profile), CPU and memory.
- `SchedTask` per task: placed ones name their node; pending GPU work (the queue) has
  `node=None`. `job` is the gang: every task of one distributed job carries the same `job`, and
  `SchedulerView.gang_size[job]` says how many tasks the job needs where the scheduler declares
  it (a PodGroup's minMember, a Kueue workload's pod count, a Slurm job's node count).
- `Quota` per tenant (and GPU model where the scheduler caps one model): the GPUs it may hold and
  the borrowing rules the scheduler applies (cohort, borrowing and lending limits). The planner
  turns them into its `Policy` (`advisor.planner.policy_merge`), where a `--policy` file wins.

`advisor.ingest.combine.build_model` joins a view with a usage model (exporters or Prometheus) by
node name into the one `ClusterModel`; the model keeps `SchedulerFacts` (quotas, gang sizes,
where racks came from, the notes and whether the view is stale) for every later view to show.

Pure data: no I/O, no imports of any scheduler's client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SchedNode:
    """One node as the scheduler sees it."""

    name: str
    pool: str = ""  # "" unknown
    rack: str = ""  # "" unknown
    zone: str = ""
    gpu_model: str = ""
    gpus: int = 0  # whole GPUs the scheduler hands out (allocatable)
    # MIG instances the scheduler hands out: profile ("1g.10gb") -> count
    mig: Mapping[str, int] = field(default_factory=dict)
    physical_gpus: int | None = None  # GPUs on the node where a label says (e.g. gpu.count)
    gpu_memory_bytes: float = math.nan  # per GPU, NaN unknown
    cpu_milli: float = math.nan
    memory_mib: float = math.nan
    schedulable: bool = True
    unschedulable_reason: str = ""  # "cordoned", "taint nvidia.com/gpu=bad:NoSchedule", ...


@dataclass(frozen=True, slots=True)
class SchedTask:
    """One task (a pod, a Slurm job's share of one node). `node` None = waiting (the queue)."""

    id: str  # unique: "namespace/pod", "12345" or "12345/node7"
    job: str  # the gang every task of one distributed job shares
    node: str | None
    num_gpu: int  # GPUs (or MIG instances) per task
    gpu_milli: int = 1000  # guaranteed share of each GPU (1000 = whole)
    gpu_limit_milli: int | None = None  # the share it may burst to, where the source says
    mig_profile: str = ""  # "3g.40gb": a MIG instance of that profile per "GPU"
    tenant: str = ""
    priority: int = 0
    cpu_milli: float = math.nan
    memory_mib: float = math.nan
    gpu_spec: str = ""  # allowed GPU models "A|B", "" = any
    start_time: float = math.nan
    creation_time: float = math.nan
    migratable: bool = True
    migratable_why: str = ""  # why not (annotation, priority, controller), for the views
    restart_cost_s: float = math.nan
    qos: str = ""
    owner: str = ""  # "Job/train-1", "StatefulSet/db": what runs it, for display
    gpu_indices: tuple[int, ...] | None = None  # the devices it holds, where the scheduler says


@dataclass(frozen=True, slots=True)
class Quota:
    """GPUs a tenant may hold, and how it borrows and lends, as the scheduler declares them."""

    tenant: str
    gpus: float
    gpu_model: str = ""  # "" = all GPU models together
    origin: str = ""  # "ResourceQuota ns/name", "ClusterQueue research", "Queue q1"
    cohort: str = ""  # tenants that lend to each other ("" = no borrowing scheduler-side)
    borrowing_limit: float | None = None  # most GPUs it may borrow (None: no limit)
    lending_limit: float | None = None  # most GPUs it lends (None: no limit)
    borrows: bool = False  # whether the scheduler lets it borrow at all


@dataclass(frozen=True)
class SchedulerView:
    """One read of a scheduler: nodes, tasks (placed and waiting), quotas, and what it noted."""

    kind: str  # "kubernetes", "kube-state-metrics", "slurm"
    source: str
    nodes: tuple[SchedNode, ...] = ()
    tasks: tuple[SchedTask, ...] = ()
    quotas: tuple[Quota, ...] = ()
    gang_size: Mapping[str, int] = field(default_factory=dict)
    rack_from: str = ""  # where racks came from ("label topology.kubernetes.io/rack"), "" none
    pool_from: str = ""
    notes: tuple[str, ...] = ()  # one line each: CRDs absent, a bad annotation, ...
    timestamp: float = math.nan
    stale: str = ""  # why the view is an older one ("" = current)
    waiting_reason: Mapping[str, str] = field(default_factory=dict)  # job -> scheduler's why


@dataclass(frozen=True)
class SchedulerFacts:
    """What the model keeps of its scheduler view beyond nodes and allocations."""

    kind: str
    quotas: tuple[Quota, ...] = ()
    gang_size: Mapping[str, int] = field(default_factory=dict)
    rack_from: str = ""
    pool_from: str = ""
    notes: tuple[str, ...] = ()  # the view's notes plus the join's mismatches
    stale: str = ""
    waiting_reason: Mapping[str, str] = field(default_factory=dict)  # job -> scheduler's why

    @property
    def racks_known(self) -> bool:
        return bool(self.rack_from)
