"""Which running work a plan may move, and what a move costs: one rule set for every scheduler.

A plan that moves a serving pod breaks a service; one that moves a job nobody restarts loses it.
So a task is migratable only when all of these allow it, in this order:

1. the annotation `gpu-defrag.io/migratable: "true"|"false"` (or the scheduler's equivalent)
   decides whenever it is set: the owner's word beats every default;
2. a priority at or above the threshold (`priority-threshold=` on the source, default
   `DEFAULT_PRIORITY_THRESHOLD`) is not migratable: that is work the cluster protects;
3. work run by a controller that is unsafe to move is not migratable: replicas of a service
   (Deployment, ReplicaSet, StatefulSet, DaemonSet, ReplicationController, LeaderWorkerSet:
   moving one drops its share of the traffic or its identity) and bare pods (nobody recreates
   them). Batch controllers (Job, JobSet, PyTorchJob, MPIJob, TFJob, RayCluster, RayJob,
   Volcano Job, a Kueue workload) recreate an evicted task from its checkpoint.

`gpu-defrag.io/restart-cost: "15m"` sets a task's checkpoint/restart time (the planner's cost of
moving it); without it the policy's `default_restart_s` applies.
"""

from __future__ import annotations

import argparse
import math

from gpu_defrag_common import units

MIGRATABLE_ANNOTATION = "gpu-defrag.io/migratable"
RESTART_COST_ANNOTATION = "gpu-defrag.io/restart-cost"
# The value of the Kubernetes documentation's own "high-priority" PriorityClass example; user
# PriorityClasses for protected work sit at or above it, batch work well below (0 to 10,000), and
# the system classes (2,000,000,000 and up) far above.
DEFAULT_PRIORITY_THRESHOLD = 1_000_000

UNSAFE_CONTROLLERS = frozenset(
    {
        "Deployment",
        "ReplicaSet",
        "StatefulSet",
        "DaemonSet",
        "ReplicationController",
        "LeaderWorkerSet",
    }
)
BATCH_CONTROLLERS = frozenset(
    {
        "Job",
        "CronJob",
        "JobSet",
        "PyTorchJob",
        "MPIJob",
        "TFJob",
        "XGBoostJob",
        "PaddleJob",
        "JAXJob",
        "TrainJob",
        "RayCluster",
        "RayJob",
        "Workload",  # a Kueue workload: admitted, suspended and resumed by Kueue
        "SlurmJob",
    }
)
# volcano's batch Job is kind "Job" in group batch.volcano.sh: the kind alone says batch


def migratable(
    annotation: str | None,
    priority: int,
    controller: str,
    threshold: int = DEFAULT_PRIORITY_THRESHOLD,
) -> tuple[bool, str]:
    """(may a plan move it, why not or ""). `annotation` is the migratable annotation's value
    (None when absent); `controller` the kind of the owner that recreates the task ("" for a
    bare task). An annotation that is neither "true" nor "false" counts as absent, and the
    reason says so, so a typo never unprotects work."""
    bad = ""
    if annotation is not None:
        value = annotation.strip().lower()
        if value == "true":
            return True, ""
        if value == "false":
            return False, f"{MIGRATABLE_ANNOTATION}: false"
        bad = f"{MIGRATABLE_ANNOTATION}: {annotation!r} is not true or false; "
    if priority >= threshold:
        return False, f"{bad}priority {priority} >= threshold {threshold}"
    if controller in UNSAFE_CONTROLLERS:
        return False, f"{bad}run by a {controller} (serving replicas are not moved)"
    if not controller:
        return False, f"{bad}a bare pod: nothing recreates it"
    if controller not in BATCH_CONTROLLERS:
        return False, f"{bad}run by a {controller}, not known to restart its tasks"
    return True, bad.removesuffix("; ")


def restart_cost_s(annotation: str | None) -> tuple[float, str]:
    """(seconds, problem) from the restart-cost annotation ("15m", "90s", "1h", "600"); NaN
    when absent or malformed (the problem says which), so the policy's default applies."""
    if annotation is None:
        return math.nan, ""
    try:
        return units.duration(annotation.strip()), ""
    except argparse.ArgumentTypeError:
        return math.nan, f"{RESTART_COST_ANNOTATION}: {annotation!r} is not a duration (15m, 1h)"
