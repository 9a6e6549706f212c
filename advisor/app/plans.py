"""The app's plans as the pages lay them out: labels, tables, a selection's planned heatmap, and
the selection exported as JSON/YAML and as the kubectl or Slurm commands an operator would run.
The app only ever shows these; it never runs a command or changes the cluster.

The plans themselves come from the pipeline (the served recommendations, or
`advisor.pipeline.queries` for another goal, a what-if or a replay); this module only presents
them.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import yaml

from advisor.model import ClusterModel
from advisor.pipeline.queries import (
    Action,
    Plan,
    mig_switch_steps,
    planned_states,
    reserved_gpus,
    windows,
)


def plan_label(index: int, plan: Plan) -> str:
    kinds = sorted({a.kind for a in plan.actions})
    status = "" if plan.feasible else " (not feasible)"
    return f"{index + 1}. {plan.goal}{status} — {len(plan.actions)} step(s) {'/'.join(kinds)}"


def _where(gpus: Any) -> str:
    return str(gpus) if gpus is not None else "-"


def benefit_text(plan: Plan) -> str:
    """One line: which shapes become schedulable or fit more often; else the plan's reason."""
    if plan.benefit is not None:
        new = plan.benefit.newly_schedulable()
        more = [s for s in plan.benefit.more_jobs_fit() if s not in new]
        parts = []
        if new:
            parts.append("can now start: " + ", ".join(new))
        if more:
            parts.append("more fit: " + ", ".join(more))
        before = plan.benefit.fragmentation_before.get("fgd_fragment_rate")
        after = plan.benefit.fragmentation_after.get("fgd_fragment_rate")
        if before is not None and after is not None and abs(after - before) > 1e-9:
            parts.append(f"fragmentation {before:.1%} → {after:.1%}")
        if parts:
            return "; ".join(parts)
    extra = plan.extra
    if "start_at" in extra:
        return f"job starts in {extra['starts_in_s'] / 3600:.1f} h ({extra['ends_from']})"
    if "waste" in extra:
        w = extra["waste"]
        return f"returns {w['gpu_hours']:.1f} idle GPU-hours, {w['energy_kwh']:.2f} kWh"
    if "gpus_freed" in extra:
        return f"frees {extra['gpus_freed']} GPU(s)"
    if "freed_gpus" in extra:
        return f"GPUs freed per model: {extra['freed_gpus']}"
    return plan.reason


def actions_frame(plan: Plan) -> pd.DataFrame:
    """One row per step: what moves where, and what it costs."""
    rows = []
    for step, action in enumerate(plan.actions, start=1):
        rows.append(
            {
                "step": step,
                "kind": action.kind,
                "job": action.job,
                "tenant": action.tenant,
                "from": _where(action.src),
                "to": _where(action.dst),
                "restarts": action.cost.restarts,
                "restart min": round(action.cost.restart_s / 60.0, 1),
                "GPU-hours lost": round(action.cost.gpu_hours, 3),
                "GPU-hours held idle": round(action.cost.idle_gpu_hours, 3),
                "why": action.reason,
            }
        )
    columns = ["step", "kind", "job", "tenant", "from", "to", "restarts", "restart min"]
    costs = ["GPU-hours lost", "GPU-hours held idle"]
    return pd.DataFrame(rows, columns=[*columns, *costs, "why"])


def plans_frame(plans: Sequence[Plan]) -> pd.DataFrame:
    """One row per plan: kind, cost and benefit, for the overview table."""
    rows = []
    for i, plan in enumerate(plans):
        cost = plan.cost
        rows.append(
            {
                "#": i + 1,
                "goal": plan.goal,
                "feasible": plan.feasible,
                "kinds": "/".join(sorted({a.kind for a in plan.actions})) or "-",
                "steps": len(plan.actions),
                "restarts": cost.restarts,
                "GPU-hours lost": round(cost.gpu_hours, 2),
                "GPU-hours held idle": round(cost.idle_gpu_hours, 2),
                "jobs touched": len(cost.jobs),
                "benefit": benefit_text(plan),
            }
        )
    return pd.DataFrame(rows)


def windows_frame(
    plans: Sequence[Plan], forecast: dict[str, Any] | None, model: ClusterModel
) -> pd.DataFrame:
    """When to act on each plan that acts: now, or the forecast's low-demand hour
    (`advisor.planner.timing`), with the expected GPU-hours saved by waiting and its interval."""
    docs = windows(plans, forecast, model)
    rows = []
    for i, doc in enumerate(docs):
        window = doc.get("window")
        if not window:
            continue
        interval = window.get("saving_interval")
        rows.append(
            {
                "#": i + 1,
                "goal": doc["goal"],
                "act": "now" if window["when"] == "now" else wall_time(window["at"]),
                "waiting job": doc.get("waiting_job") or "-",
                "GPU-hours saved by waiting": round(window["saving_gpu_hours"], 2),
                "interval (P90..P10 demand)": "-"
                if not interval
                else f"{interval[0]:.2f} .. {interval[1]:.2f}",
                "reason": window["reason"],
            }
        )
    return pd.DataFrame(rows)


def wall_time(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


# --------------------------------------------------------------------------- selection


def planned_frame(model: ClusterModel) -> pd.DataFrame:
    """`data.gpu_frame` of a planned state: allocated = busy (nothing is observed of a plan),
    and GPUs held by a reservation (the room made for the goal job) as their own state, so the
    after-heatmap shows them."""
    from advisor.app.data import gpu_frame

    frame = gpu_frame(model, planned_states(model))
    frame.loc[reserved_gpus(model), "state"] = "reserved"
    return frame


# --------------------------------------------------------------------------- export


def selection_doc(plan: Plan, steps: Sequence[int], source: str) -> dict[str, Any]:
    chosen = [plan.actions[i - 1] for i in sorted(steps)]
    return {
        "generated_by": "gpu-defrag app (not executed)",
        "source": source,
        "goal": plan.goal,
        "method": plan.method,
        "steps": sorted(int(s) for s in steps),
        "actions": [a.to_dict() for a in chosen],
    }


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"


def to_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(json.loads(json.dumps(doc, default=str)), sort_keys=False)


def _pod(alloc: str) -> tuple[str, str]:
    """(namespace, pod) of a Kubernetes allocation id `ns/pod`; ("", id) otherwise."""
    namespace, sep, pod = alloc.partition("/")
    return (namespace, pod) if sep else ("", alloc)


def _ns(namespace: str) -> str:
    return f"-n {shlex.quote(namespace)} " if namespace else ""


def _gpus_text(gpus: Any) -> str:
    return f"GPUs {','.join(str(g) for g in gpus.gpus)} of {gpus.node}"


def _mig_switches(actions: Sequence[Action]) -> dict[int, tuple[str, int, dict[int, Counter]]]:
    """Per step that switches a GPU to MIG mode (the first MIG-profile share onto it): (node,
    GPU, the node's MIG layout once every switch so far is made: GPU -> profile counts, the
    instances of the whole plan carved at once, as a layout is applied in one go)."""
    first = mig_switch_steps(actions)
    layout: dict[str, dict[int, Counter]] = {}
    for a in actions:
        if a.kind == "share" and a.dst is not None and a.dst.mig_profile:
            for gpu in a.dst.gpus:
                layout.setdefault(a.dst.node, {}).setdefault(gpu, Counter())[a.dst.mig_profile] += 1
    out = {}
    for (node, gpu), step in first.items():
        so_far = {g: c for g, c in layout[node].items() if first[(node, g)] <= step}
        out[step] = (node, gpu, so_far)
    return out


def _mig_parted_config(name: str, gpus: dict[int, Counter]) -> list[str]:
    """The mig-parted config (YAML, as comments) for the GPUs switched on one node; the node's
    other GPUs are for the operator to list as they are (a plain GPU: `mig-enabled: false`)."""
    lines = [f"#   {name}:"]
    for gpu, counts in sorted(gpus.items()):
        devices = ", ".join(f'"{p}": {n}' for p, n in sorted(counts.items()))
        lines.append(f"#     - devices: [{gpu}]")
        lines.append("#       mig-enabled: true")
        lines.append(f"#       mig-devices: {{{devices}}}")
    return lines


def kubectl_commands(actions: Sequence[Action]) -> str:
    """The kubectl an operator would run for each step. Kubernetes places pods on nodes, not
    on GPU indices (the device plugin picks those), so the target GPUs are annotations."""
    lines = ["# gpu-defrag: generated, not executed. Review, then run step by step.", ""]
    switches = _mig_switches(actions)
    for step, a in enumerate(actions, start=1):
        lines.append(f"# step {step}: {a.kind} {a.alloc or ''} — {a.reason}".rstrip())
        ns, pod = _pod(a.alloc)
        q = shlex.quote
        if step in switches:
            node, gpu, layout = switches[step]
            config = f"gpu-defrag-{node}"
            lines += [
                f"# switch {node} GPU {gpu} to MIG mode with NVIDIA's MIG manager: add this "
                "config to its mig-parted ConfigMap,",
                *_mig_parted_config(config, layout),
                "#     (and the node's other GPUs as they are now)",
                f"# then label the node (the MIG manager evicts {node}'s GPU pods while it "
                "applies the layout):",
                f"kubectl label node {q(node)} --overwrite nvidia.com/mig.config={q(config)}",
            ]
        if a.kind == "share" and a.dst is not None and a.dst.mig_profile:
            lines.append(
                f"# its pod template requests nvidia.com/mig-{a.dst.mig_profile}: 1 instead of "
                "nvidia.com/gpu (the device plugin's mixed strategy)"
            )
        if a.kind in ("migrate", "share", "rebalance") and a.dst is not None:
            lines += [
                f"kubectl {_ns(ns)}annotate pod {q(pod)} --overwrite "
                f"gpu-defrag.io/target-node={q(a.dst.node)} "
                f"gpu-defrag.io/target-gpus={','.join(map(str, a.dst.gpus))}"
                + (
                    f" gpu-defrag.io/mig-profile={q(a.dst.mig_profile)}"
                    if a.dst.mig_profile
                    else f" gpu-defrag.io/gpu-milli={a.dst.milli}"
                    + (
                        f" gpu-defrag.io/gpu-limit-milli={a.dst.limit_milli}"
                        if a.dst.limit_milli is not None
                        else ""
                    )
                    if a.dst.milli < 1000
                    else ""
                ),
                f"# pin its controller's pod template to the target: nodeSelector "
                f"kubernetes.io/hostname={a.dst.node}; checkpoint, then:",
                f"kubectl {_ns(ns)}delete pod {q(pod)} --wait=false",
            ]
        elif a.kind == "reserve" and a.dst is not None:
            lines += [
                f"kubectl label node {q(a.dst.node)} --overwrite "
                f"gpu-defrag.io/reserved-for={q(a.job)}",
                f"kubectl taint node {q(a.dst.node)} "
                f"gpu-defrag.io/reserved={q(a.job)}:NoSchedule --overwrite"
                f"  # holds {_gpus_text(a.dst)}",
            ]
        elif a.kind == "reclaim":
            lines.append(f"kubectl {_ns(ns)}delete pod {q(pod)}  # tell {a.tenant or 'its owner'}")
        elif a.kind == "borrow":
            for tenant, gpu_model, delta in a.quota:
                lines.append(
                    f"# quota of {tenant} {'on ' + gpu_model if gpu_model else ''}: {delta:+g} GPUs"
                )
                lines.append(
                    f"kubectl -n {q(tenant)} edit resourcequota  "
                    f"# requests.nvidia.com/gpu {delta:+g}"
                )
        lines.append("")
    return "\n".join(lines)


def slurm_commands(actions: Sequence[Action]) -> str:
    """The scontrol/scancel/sacctmgr an operator would run for each step (JOB = job id)."""
    lines = ["# gpu-defrag: generated, not executed. Review, then run step by step.", ""]
    switches = _mig_switches(actions)
    for step, a in enumerate(actions, start=1):
        lines.append(f"# step {step}: {a.kind} {a.alloc or ''} — {a.reason}".rstrip())
        job = shlex.quote(a.job or a.alloc)
        if a.kind in ("migrate", "share", "rebalance") and a.dst is not None:
            lines += [
                f"scontrol hold {job}",
                f"scontrol requeue {job}  # after its checkpoint",
            ]
            if step in switches:  # the GPU is idle once its one job is requeued
                node, gpu, layout = switches[step]
                profiles = ",".join(p for p, n in sorted(layout[gpu].items()) for _ in range(n))
                lines += [
                    f"# on {node}, GPU {gpu} now idle:",
                    f"nvidia-smi -i {gpu} -mig 1",
                    f"nvidia-smi mig -i {gpu} -cgi {profiles} -C",
                    "# gres.conf: AutoDetect=nvml makes the instances gres; restart slurmd",
                ]
            lines += [
                f"scontrol update JobId={job} ReqNodeList={shlex.quote(a.dst.node)}",
                f"scontrol release {job}",
            ]
        elif a.kind == "reserve" and a.dst is not None:
            lines.append(
                f"scontrol create reservation "
                f"ReservationName={shlex.quote('gpu-defrag-' + (a.alloc or a.job))} "
                f"StartTime=now Duration=UNLIMITED Nodes={shlex.quote(a.dst.node)} "
                f"TRES=gres/gpu={len(a.dst.gpus)} Flags=IGNORE_JOBS"
            )
        elif a.kind == "reclaim":
            lines.append(f"scancel {job}")
        elif a.kind == "borrow":
            for tenant, gpu_model, delta in a.quota:
                lines.append(
                    f"sacctmgr modify account {shlex.quote(tenant)} set GrpTRES=gres/gpu=<limit{delta:+g}>"
                    + (f"  # {gpu_model}" if gpu_model else "")
                )
        lines.append("")
    return "\n".join(lines)


EXPORTS: dict[str, tuple[str, str, str]] = {  # format -> (file extension, code language, MIME)
    "json": ("json", "json", "application/json"),
    "yaml": ("yaml", "yaml", "application/yaml"),
    "kubectl": ("sh", "bash", "text/x-shellscript"),
    "slurm": ("sh", "bash", "text/x-shellscript"),
}


def export_name(goal: str, kind: str) -> str:
    """The download's file name: the plan's goal and, for scripts, the scheduler, so a plan's
    kubectl and Slurm scripts (both `.sh`) never overwrite each other in a download folder."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", goal).strip("-").lower() or "plan"
    extension = EXPORTS[kind][0]
    suffix = f"-{kind}" if extension == "sh" else ""
    return f"gpu-defrag-{slug}{suffix}.{extension}"


def exports(plan: Plan, steps: Sequence[int], source: str) -> dict[str, str]:
    """Every export of the chosen steps: format -> text."""
    chosen = [plan.actions[i - 1] for i in sorted(steps)]
    doc = selection_doc(plan, steps, source)
    return {
        "json": to_json(doc),
        "yaml": to_yaml(doc),
        "kubectl": kubectl_commands(chosen),
        "slurm": slurm_commands(chosen),
    }


def selection_key(plans: Sequence[Plan]) -> str:
    """A short digest of a list of plans: the plan selector's key, so a new list (another goal)
    is a new widget whose labels are the new plans' (a kept key kept the old labels)."""
    import hashlib

    text = "|".join(f"{p.goal}:{len(p.actions)}:{p.feasible}" for p in plans)
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def cost_of(actions: Sequence[Action]) -> Any:
    return Plan("selection", True, tuple(actions)).cost
