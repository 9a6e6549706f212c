"""What the Kubernetes source reads: one `Resource` per kind, with the API path the client
lists and watches it at, and the RBAC rule it needs (deploy/kubernetes/advisor-rbac.yaml grants
get/list/watch on exactly these; a test keeps the two the same).

Core kinds are required (a 403 on them is an error naming the missing verb and resource); the
custom resources of Kueue, Volcano and the coscheduling plugin are optional: not installed (404)
means simply absent, and forbidden (403) is one note, with the rest of the view served.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    key: str  # short name used in the cache and the notes
    kind: str
    group: str  # "" = core
    version: str
    plural: str
    namespaced: bool
    optional: bool  # a CRD: absent when not installed

    @property
    def api_group(self) -> str:
        """The group as an RBAC rule names it ("" for core)."""
        return self.group

    @property
    def full_name(self) -> str:
        """`pods`, `clusterqueues.kueue.x-k8s.io`: how kubectl and RBAC errors name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/{self.plural}"


NODES = Resource("nodes", "Node", "", "v1", "nodes", False, False)
PODS = Resource("pods", "Pod", "", "v1", "pods", True, False)
QUOTAS = Resource("resourcequotas", "ResourceQuota", "", "v1", "resourcequotas", True, False)
KUEUE = "kueue.x-k8s.io"
CLUSTER_QUEUES = Resource(
    "clusterqueues", "ClusterQueue", KUEUE, "v1beta1", "clusterqueues", False, True
)
LOCAL_QUEUES = Resource("localqueues", "LocalQueue", KUEUE, "v1beta1", "localqueues", True, True)
WORKLOADS = Resource("workloads", "Workload", KUEUE, "v1beta1", "workloads", True, True)
FLAVORS = Resource(
    "resourceflavors", "ResourceFlavor", KUEUE, "v1beta1", "resourceflavors", False, True
)
VOLCANO = "scheduling.volcano.sh"
VOLCANO_QUEUES = Resource("volcano-queues", "Queue", VOLCANO, "v1beta1", "queues", False, True)
VOLCANO_GROUPS = Resource(
    "volcano-podgroups", "PodGroup", VOLCANO, "v1beta1", "podgroups", True, True
)
COSCHEDULING = "scheduling.x-k8s.io"
COSCHEDULING_GROUPS = Resource(
    "coscheduling-podgroups", "PodGroup", COSCHEDULING, "v1alpha1", "podgroups", True, True
)

REQUIRED = (NODES, PODS, QUOTAS)
OPTIONAL = (
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    WORKLOADS,
    FLAVORS,
    VOLCANO_QUEUES,
    VOLCANO_GROUPS,
    COSCHEDULING_GROUPS,
)
ALL = REQUIRED + OPTIONAL
BY_KEY = {r.key: r for r in ALL}
VERBS = ("get", "list", "watch")
# finished pods hold nothing: the API server leaves them out of lists and watches
POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
