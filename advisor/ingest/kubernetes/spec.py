"""`k8s:[CONTEXT][?rack-label=KEY&pool-label=KEY&tenant=...&priority-threshold=N]` taken apart.

- CONTEXT: a kubeconfig context (default: the current one of `$KUBECONFIG` or
  `~/.kube/config`; without a kubeconfig, inside a pod, the service account).
- `rack-label=KEY[,KEY...]`: node label(s) naming the rack, tried in order; default
  `DEFAULT_RACK_LABELS` (the first found on any node is used for all). No label found: racks
  are unknown, and every view says so.
- `pool-label=KEY[,KEY...]`: node label(s) naming the pool; default `DEFAULT_POOL_LABELS`.
- `tenant=namespace` (default) | `label:KEY` (a pod label; pods without it fall back to their
  namespace) | `queue` (the Kueue ClusterQueue of the pod's LocalQueue, or the Volcano queue of
  its PodGroup; else the namespace).
- `priority-threshold=N`: work at or above this priority is not migratable unless annotated
  `gpu-defrag.io/migratable: "true"` (default `DEFAULT_PRIORITY_THRESHOLD`, 1,000,000).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs

from advisor.ingest.movability import DEFAULT_PRIORITY_THRESHOLD

PREFIX = "k8s:"
# Rack: the label kube's own topology labels would use, NVIDIA Topograph's leaf switch (it
# writes these for KAI, Kueue TAS and Slurm), EKS's lowest network layer (nodes sharing it are
# closest), GKE's sub-block. A cluster labelling racks otherwise names its key.
DEFAULT_RACK_LABELS = (
    "topology.kubernetes.io/rack",
    "network.topology.nvidia.com/leaf",
    "fabric.topograph.run/tier-0",
    "topology.k8s.aws/network-node-layer-3",
    "cloud.google.com/gce-topology-subblock",
)
# Pool: the node-pool labels of GKE, EKS, Karpenter and AKS, then the advisor's own.
DEFAULT_POOL_LABELS = (
    "gpu-defrag.io/pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
)
OPTIONS = ("rack-label", "pool-label", "tenant", "priority-threshold")


class SpecError(ValueError):
    """A `k8s:` source with a bad option; one line naming it."""


@dataclass(frozen=True)
class KubeSpec:
    text: str
    context: str  # "" = current context (or in-cluster)
    rack_labels: tuple[str, ...] = DEFAULT_RACK_LABELS
    pool_labels: tuple[str, ...] = DEFAULT_POOL_LABELS
    tenant: str = "namespace"  # "namespace", "queue" or "label"
    tenant_label: str = ""
    priority_threshold: int = DEFAULT_PRIORITY_THRESHOLD


def _keys(spec: str, name: str, value: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in value.split(",") if k.strip())
    if not keys:
        raise SpecError(f"{spec}: {name}= needs a node label key, e.g. {name}=example.com/rack")
    return keys


def parse(spec: str) -> KubeSpec:
    """SpecError for an unknown option or a malformed value."""
    text = spec.strip()
    context, _, query = text.removeprefix(PREFIX).partition("?")
    params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    # parse_qs reads '+' as a space; a label key never holds one
    params = {k: v.replace(" ", "+") for k, v in params.items()}
    unknown = sorted(set(params) - set(OPTIONS))
    if unknown:
        raise SpecError(f"{text}: unknown option {unknown[0]!r} (known: {', '.join(OPTIONS)})")
    kwargs: dict = {}
    if "rack-label" in params:
        kwargs["rack_labels"] = _keys(text, "rack-label", params["rack-label"])
    if "pool-label" in params:
        kwargs["pool_labels"] = _keys(text, "pool-label", params["pool-label"])
    tenant = params.get("tenant", "namespace")
    if tenant.startswith("label:") and tenant.removeprefix("label:").strip():
        kwargs["tenant"], kwargs["tenant_label"] = "label", tenant.removeprefix("label:").strip()
    elif tenant in ("namespace", "queue"):
        kwargs["tenant"] = tenant
    else:
        raise SpecError(f"{text}: tenant={tenant!r}: expected namespace, queue or label:KEY")
    if "priority-threshold" in params:
        value = params["priority-threshold"].strip()
        try:
            kwargs["priority_threshold"] = int(value)
        except ValueError:
            raise SpecError(
                f"{text}: priority-threshold={value!r}: expected a whole number (a priority)"
            ) from None
    return KubeSpec(text=text, context=context.strip(), **kwargs)
