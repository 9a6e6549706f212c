"""The planner's policy from a scheduler's quotas and a `--policy` file: the file wins.

A scheduler source hands its quotas over on the model (`ClusterModel.scheduler.quotas`, one
`advisor.scheduler_view.Quota` per tenant and GPU model: a Kubernetes ResourceQuota, a Kueue
ClusterQueue, a Volcano Queue, a Slurm QOS). `merged_policy(file_policy, model)` makes one
`Policy` of them:

- quotas merge per (tenant, GPU model): the file's number wins where both name one, the
  scheduler's stands where only it does;
- borrowing: a `borrowing:` section in the file replaces the scheduler's rules whole (the user
  said how loans go); without one, each tenant that the scheduler lets borrow (a ClusterQueue in
  a cohort, a Volcano queue below its capability) gets rules from it: the cohort it borrows in,
  `max_borrow_ratio` = borrowing limit / quota (no limit: everything the cohort holds), and
  `max_lend_gpus` = its lending limit; a tenant that may not borrow gets `max_borrow_ratio` 0 and
  lends nothing outside a cohort;
- everything else (restart time, locality) is the file's.

`merge_lines(...)` says where each quota came from, for `analyze`, `plan` and the service, so a
reader sees which number the plans used and which the file overrode.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace

from advisor.model import ClusterModel
from advisor.planner.constraints import ANY_MODEL, BorrowRules, Policy
from advisor.scheduler_view import Quota


@dataclass(frozen=True)
class QuotaRow:
    """One merged quota and where it came from."""

    tenant: str
    gpu_model: str  # "" = all models
    gpus: float
    origin: str  # "--policy", "ResourceQuota team-a/gpu", ...
    overridden: str = ""  # what the scheduler said, where the file replaced it


def _scheduler_quotas(quotas: tuple[Quota, ...]) -> dict[tuple[str, str], Quota]:
    """The scheduler's quotas by (tenant, model); several for one key (two ResourceQuotas in one
    namespace) keep the smallest, as the API server enforces every one of them."""
    out: dict[tuple[str, str], Quota] = {}
    for quota in quotas:
        key = (quota.tenant, quota.gpu_model)
        if key not in out or quota.gpus < out[key].gpus:
            out[key] = quota
    return out


def _borrow_rules(quotas: dict[tuple[str, str], Quota]) -> dict[str, BorrowRules]:
    """Per-tenant rules from the scheduler's cohorts and limits; {} when no tenant borrows."""
    whole = {t: q for (t, m), q in quotas.items() if m == ANY_MODEL}
    if not any(q.borrows or q.cohort for q in whole.values()):
        return {}
    cohort_total: dict[str, float] = defaultdict(float)
    for q in whole.values():
        if q.cohort:
            cohort_total[q.cohort] += q.gpus
    rules: dict[str, BorrowRules] = {"": BorrowRules(max_borrow_ratio=0.0, lend=False)}
    for tenant, q in whole.items():
        if not (q.borrows and q.cohort):
            rules[tenant] = BorrowRules(max_borrow_ratio=0.0, lend=bool(q.cohort), cohort=q.cohort)
            continue
        others = cohort_total[q.cohort] - q.gpus
        limit = others if q.borrowing_limit is None else min(q.borrowing_limit, others)
        ratio = limit / q.gpus if q.gpus > 0 else 0.0
        rules[tenant] = BorrowRules(
            max_borrow_ratio=ratio if math.isfinite(ratio) else 0.0,
            lend=q.lending_limit is None or q.lending_limit > 0,
            cohort=q.cohort,
            max_lend_gpus=q.lending_limit,
        )
    return rules


def merged_policy(policy: Policy | None, model: ClusterModel | None) -> Policy:
    """`policy` (from a file, or the default) with the model's scheduler quotas under it."""
    base = policy if policy is not None else Policy()
    facts = model.scheduler if model is not None else None
    if facts is None or not facts.quotas:
        return base
    quotas = _scheduler_quotas(facts.quotas)
    merged = {key: q.gpus for key, q in quotas.items()}
    merged.update(base.quotas)
    borrowing = base.borrowing or _borrow_rules(quotas)
    return replace(base, quotas=merged, borrowing=borrowing)


def quota_rows(policy: Policy | None, model: ClusterModel | None) -> list[QuotaRow]:
    """Every quota the merged policy holds, with where it came from (tenant, model order)."""
    file_quotas = policy.quotas if policy is not None else {}
    facts = model.scheduler if model is not None else None
    scheduler = _scheduler_quotas(facts.quotas) if facts is not None else {}
    rows = []
    for key in sorted(set(file_quotas) | set(scheduler)):
        tenant, gpu_model = key
        if key in file_quotas:
            said = scheduler.get(key)
            overridden = f"{said.origin}: {said.gpus:g}" if said is not None else ""
            rows.append(QuotaRow(tenant, gpu_model, file_quotas[key], "--policy", overridden))
        else:
            q = scheduler[key]
            rows.append(QuotaRow(tenant, gpu_model, q.gpus, q.origin))
    return rows


def merge_lines(
    policy: Policy | None, model: ClusterModel | None, policy_file: str = ""
) -> list[str]:
    """One line per quota the plans use, with its origin; [] when there is none."""
    rows = quota_rows(policy, model)
    if not rows:
        return []
    facts = model.scheduler if model is not None else None
    said = [facts.kind] if facts is not None and facts.quotas else []
    said += [policy_file or "--policy"] if policy is not None and policy.quotas else []
    both = "; the file wins where both name one" if len(said) == 2 else ""
    lines = [f"Quotas ({' + '.join(said)}{both})"]
    for row in rows:
        scope = row.gpu_model or "all models"
        origin = row.origin
        if row.overridden:
            origin += f" (replaces {row.overridden})"
        lines.append(f"  {row.tenant}: {row.gpus:g} GPUs on {scope} - {origin}")
    merged = merged_policy(policy, model)
    if merged.borrowing and not (policy is not None and policy.borrowing):
        lines.append("  borrowing: from the scheduler's cohorts and limits")
        for tenant, rules in sorted(merged.borrowing.items()):
            if not tenant:
                continue
            lend = "lends nothing"
            if rules.lend:
                lend = (
                    "lends all unused"
                    if rules.max_lend_gpus is None
                    else (f"lends up to {rules.max_lend_gpus:g}")
                )
            lines.append(
                f"    {tenant}: cohort {rules.cohort or '-'}, borrows up to "
                f"{rules.max_borrow_ratio:g} x its quota, {lend}"
            )
    elif policy is not None and policy.borrowing:
        lines.append(f"  borrowing: {policy_file or '--policy'}'s rules")
    return lines
