"""The schedulers a replay compares, by name: each is a placement policy of `advisor.placement`
(one filter and one scoring function over the node state), here given its target workload.

- `leastallocated`: Kubernetes' default NodeResourcesFit scoring (spreads);
- `mostallocated`: its bin-packing strategy;
- `fgd`: the FGD paper's fragmentation descent, told the task shapes of every job of the replay
  in advance (as the paper's runs are: an oracle);
- `ours`: FGD with the workload learned from the arrivals so far (`placement.online`).

The FGD paper's other baselines (`random`, `dotprod`, `clustering`, `packing`, `bestfit`) run
too, under their own names.
"""

from __future__ import annotations

from advisor.fragmentation.fgd import learn_workload
from advisor.placement import ALL_POLICIES, KUBERNETES_POLICIES, make_policy
from advisor.placement.base import Policy
from advisor.simulate.jobs import JobTable

SCHEDULERS: tuple[str, ...] = ("leastallocated", "mostallocated", "fgd", "ours")
ALIASES = {"ours": "online"}
KNOWN: tuple[str, ...] = SCHEDULERS + tuple(
    p for p in ALL_POLICIES + KUBERNETES_POLICIES if p not in SCHEDULERS and p != "online"
)


def make_scheduler(name: str, jobs: JobTable) -> Policy:
    """A fresh policy for one replay; ValueError for an unknown name."""
    if name not in KNOWN:
        raise ValueError(f"unknown scheduler {name!r}; choose from {', '.join(KNOWN)}")
    workload = None
    if name == "fgd":
        repeat = jobs.num_nodes
        workload = learn_workload(
            jobs.cpu_milli.repeat(repeat),
            jobs.num_gpu.repeat(repeat),
            jobs.gpu_milli.repeat(repeat),
            jobs.gpu_spec.repeat(repeat),
        )
    return make_policy(ALIASES.get(name, name), workload)
