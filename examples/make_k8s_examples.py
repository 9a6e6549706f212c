"""Write the seed cases as the Kubernetes objects a live cluster in their state would serve
(run from the repository root):

    .venv/bin/python examples/make_k8s_examples.py

Each `examples/k8s/NAME.json` is `{resource: [objects]}` in the API's own JSON shapes
(`advisor.ingest.kubernetes.manifests`: Nodes with GPU feature discovery and rack labels, Pods,
PodGroups, ResourceQuotas or Kueue queues); the tests serve the same objects
(tests/kubernetes/test_seed_cases.py). To read one through the `k8s:` source without a cluster,
serve it with the loopback API server the tests use:

    .venv/bin/python -m tests.fakes.kube_apiserver examples/k8s/seed-16x8-a100.json \\
        --kubeconfig /tmp/kubeconfig &
    KUBECONFIG=/tmp/kubeconfig gpu-defrag analyze k8s:
    KUBECONFIG=/tmp/kubeconfig gpu-defrag plan k8s: --goal job=8x8

`seed-16x8-a100.json`         the 16 x 8 A100 seed case plus `rnd/pretrain`, an 8 x 8 gang
                              waiting in the queue (a coscheduling PodGroup of minMember 8)
`seed-quota-borrow.json`      the borrowing seed case, its quotas as ResourceQuotas
`seed-quota-borrow-kueue.json` the same with Kueue ClusterQueues (one cohort, borrowing limits
                              from policy-borrow-per-tenant.yaml: Kueue lends per ClusterQueue,
                              not per lender -> borrower pair) and rnd-pretrain as a waiting Workload
`seed-nvlink-islands.json`    the NVLink-islands case (its islands come from the exporters:
                              join it with their pages, k8s:+http://...)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from advisor import snapshot  # noqa: E402
from advisor.ingest.kubernetes.manifests import (  # noqa: E402
    objects_from_model,
    waiting_gang,
    with_objects,
)
from advisor.planner.constraints import load_policy  # noqa: E402

OUT = ROOT / "k8s"


def write(out: Path, name: str, objects: dict[str, list[dict]]) -> None:
    out.mkdir(exist_ok=True)
    (out / name).write_text(json.dumps(objects, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out.name}/{name}: " + ", ".join(f"{len(v)} {k}" for k, v in objects.items()))


def main(out: Path = OUT) -> None:
    seed = snapshot.load(ROOT / "seed-16x8-a100.json")
    gang = waiting_gang("rnd", "pretrain", 8, 8, 500, len(seed.nodes))
    write(out, "seed-16x8-a100.json", with_objects(objects_from_model(seed), gang))
    borrow = snapshot.load(ROOT / "seed-quota-borrow.json")
    policy = load_policy(ROOT / "policy-borrow.yaml")
    write(out, "seed-quota-borrow.json", objects_from_model(borrow, policy=policy))
    write(
        out,
        "seed-quota-borrow-kueue.json",
        objects_from_model(
            borrow,
            policy=load_policy(ROOT / "policy-borrow-per-tenant.yaml"),
            quotas_as="kueue",
        ),
    )
    write(
        out,
        "seed-nvlink-islands.json",
        objects_from_model(snapshot.load(ROOT / "seed-nvlink-islands.json")),
    )


if __name__ == "__main__":
    main()
