"""Placement policies as in the FGD paper's simulator, plus ours, over one shared replay loop.

Each policy is a small module with a pure scoring function (filter then score, Kubernetes
scheduler-framework style); `make_policy` builds one by its CLI name.
"""

from __future__ import annotations

from advisor.fragmentation.fgd import Workload
from advisor.placement.base import Policy

PAPER_POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
OUR_POLICIES = ("online",)
ALL_POLICIES = PAPER_POLICIES + OUR_POLICIES
# Kubernetes' NodeResourcesFit strategies (the dynamic replay's baselines, `gpu-defrag simulate`)
KUBERNETES_POLICIES = ("leastallocated", "mostallocated")


def make_policy(name: str, workload: Workload | None = None) -> Policy:
    """A fresh policy object; `fgd` needs the target workload (the trace's, in the paper)."""
    from advisor.placement.bestfit import BestFitPolicy
    from advisor.placement.clustering import ClusteringPolicy
    from advisor.placement.dotprod import DotProdPolicy
    from advisor.placement.fgd import FGDPolicy
    from advisor.placement.nodefit import LeastAllocatedPolicy, MostAllocatedPolicy
    from advisor.placement.online import OnlineFGDPolicy
    from advisor.placement.packing import PackingPolicy
    from advisor.placement.random_policy import RandomPolicy

    simple = {
        "random": RandomPolicy,
        "dotprod": DotProdPolicy,
        "clustering": ClusteringPolicy,
        "packing": PackingPolicy,
        "bestfit": BestFitPolicy,
        "online": OnlineFGDPolicy,
        "leastallocated": LeastAllocatedPolicy,
        "mostallocated": MostAllocatedPolicy,
    }
    if name == "fgd":
        if workload is None:
            raise ValueError("the fgd policy needs a target workload")
        return FGDPolicy(workload)
    if name not in simple:
        raise ValueError(
            f"unknown policy {name!r}; choose from {', '.join(ALL_POLICIES + KUBERNETES_POLICIES)}"
        )
    return simple[name]()
