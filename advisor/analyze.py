"""`gpu-defrag analyze SOURCE` (fragmentation measures as a table or JSON) and
`gpu-defrag snapshot SOURCE > FILE` (freeze any source into one snapshot file)."""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
from typing import Any, TextIO

import numpy as np

from advisor import scheduler_report, snapshot
from advisor.fragmentation import measures
from advisor.ingest.sources import DEFAULT_TIMEOUT, SOURCE_HELP, SourceError, load_source
from gpu_defrag_common.files import check_file_target, write_text_atomic
from gpu_defrag_common.messages import say_error
from gpu_defrag_common.units import number, positive_duration

GIB = 2**30


def register(subparsers: argparse._SubParsersAction) -> None:
    sources = "SOURCE forms:\n" + SOURCE_HELP
    analyze = subparsers.add_parser(
        "analyze",
        description="Free and stranded GPUs, jobs of each shape that can start now, largest "
        "fitting job, allocated-but-idle GPUs, idle capacity vs demand by GPU model, stranded "
        "GPU memory, the FGD fragment amount and a per-node score.",
        epilog=sources,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    analyze.add_argument("source", metavar="SOURCE", help="where the cluster comes from (below)")
    analyze.add_argument("--json", action="store_true", help="print JSON instead of a table")
    analyze.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="SHAPE",
        help="job shape to count, repeatable: 0.5, 1, 8, 2x8 (2 nodes x 8 in one rack), 4@A100 "
        "(default: 0.5 1 2 4 8 2x8 4x8)",
    )
    analyze.add_argument(
        "--idle-threshold",
        type=number(0, 1),
        default=0.05,
        metavar="RATIO",
        help="utilization below this is idle, 0..1 (default 0.05)",
    )
    analyze.add_argument(
        "--idle-window",
        type=positive_duration,
        default=3600.0,
        metavar="DURATION",
        help="e.g. 3600, 90m or 1h (default 1h)",
    )
    analyze.add_argument(
        "--min-request-memory",
        type=number(0),
        default=10.0,
        metavar="GIB",
        help="free memory below this on a shared GPU is stranded (default 10)",
    )
    analyze.add_argument(
        "--top",
        type=number(0, kind=int),
        default=10,
        metavar="N",
        help="most fragmented nodes shown (table; 0: none)",
    )
    analyze.add_argument(
        "--policy",
        default="",
        metavar="FILE",
        help="policy file (YAML/JSON) whose quotas are merged over a scheduler's (the file "
        "wins); the merged quotas are shown",
    )
    _timeout(analyze)
    analyze.set_defaults(func=run_analyze)

    snap = subparsers.add_parser(
        "snapshot",
        description="Read SOURCE and write its cluster model as a snapshot (docs/snapshot.md).",
        epilog=sources,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    snap.add_argument("source", metavar="SOURCE", help="where the cluster comes from (below)")
    snap.add_argument(
        "-o", "--output", metavar="FILE", help="write here instead of stdout (`-`: stdout)"
    )
    _timeout(snap)
    snap.set_defaults(func=run_snapshot)


def _timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=positive_duration,
        default=DEFAULT_TIMEOUT,
        metavar="DURATION",
        help=f"HTTP timeout per request, e.g. 10 or 10s (default {DEFAULT_TIMEOUT:g}s)",
    )


def _fail(message: str, status: int = 2, command: str = "analyze") -> int:
    """One line on stderr; exit 2 for what the user gave (a source, a flag, a target), 1 for a
    write that failed on the way (a full disk), as every command's results and stdout."""
    say_error(command, message)
    return status


def _emit(text: str) -> int:
    """Print the whole result. A write that fails (`> /dev/full`, a closed standard output,
    `| head`) is `advisor.cli.main`'s, as for every command: one line and exit 1, or quiet for a
    reader that stopped."""
    sys.stdout.write(text)
    return 0


def _snapshot_fail(message: str, status: int = 2) -> int:
    return _fail(message, status, "snapshot")


def run_snapshot(args: argparse.Namespace) -> int:
    to_file = bool(args.output) and args.output != "-"  # `-o -`: standard output, as without -o
    if to_file:
        try:  # before the source is read (a week of Prometheus history), not after
            check_file_target(args.output)
        except OSError as error:
            return _snapshot_fail(f"-o {args.output}: {error.strerror or error}")
    try:
        model = load_source(args.source, timeout=args.timeout)
        text = snapshot.dumps(model)
    except SourceError as error:
        return _snapshot_fail(str(error))
    except snapshot.SnapshotError as error:  # the loader's checks: nothing was written
        return _snapshot_fail(f"{args.source}: {error}")
    if not to_file:
        return _emit(text)
    try:
        write_text_atomic(args.output, text)
    except OSError as error:  # whole or nothing: a file that was there stays as it was
        return _snapshot_fail(f"cannot write {args.output}: {error.strerror or error}", status=1)
    return 0


def run_analyze(args: argparse.Namespace) -> int:
    try:
        shapes = tuple(measures.parse_shape(s) for s in args.shape) or measures.DEFAULT_SHAPES
    except ValueError as error:
        return _fail(str(error))
    from advisor.planner.constraints import PolicyError, load_policy

    try:
        policy = load_policy(args.policy) if args.policy else None
    except PolicyError as error:
        return _fail(str(error))
    try:
        model = load_source(args.source, timeout=args.timeout)
    except SourceError as error:
        return _fail(str(error))
    try:
        for shape in shapes:
            measures.check_models(model, shape)
    except ValueError as error:
        return _fail(str(error))
    settings = measures.Settings(
        shapes=shapes,
        idle=measures.IdlePolicy(args.idle_threshold, args.idle_window),
        min_request_bytes=args.min_request_memory * GIB,
    )
    result = measures.analyze(model, settings)
    result["scheduler"] = scheduler_report.section(model, policy, args.policy)
    if args.json:
        return _emit(json.dumps(to_json(result), indent=2, allow_nan=False) + "\n")
    table = io.StringIO()
    print_table(result, table, top=args.top)
    scheduler_report.print_section(result["scheduler"], table)
    return _emit(table.getvalue())


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None  # JSON has no NaN or inf
    return value


def node_rows(nodes: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    keys = list(nodes)
    return [
        {key: _plain(value) for key, value in zip(keys, row, strict=True)}
        for row in zip(*(nodes[k].tolist() for k in keys), strict=True)
    ]


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    """The analysis with numpy columns turned into node rows and floats rounded."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [walk(item) for item in value]
        return _plain(value)

    out = walk({key: value for key, value in result.items() if key != "nodes"})
    out["nodes"] = node_rows(result["nodes"])
    return out


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        cells = [
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.write("  " + "  ".join(cells).rstrip() + "\n")
        if n == 0:
            out.write("  " + "  ".join("-" * w for w in widths) + "\n")


def _known(count: int) -> int | None:
    """A per-node count, None where it cannot be known (-1: the node's islands unknown)."""
    return None if count < 0 else count


def _g(value: float | None) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float) and not value.is_integer():
        # two decimals, trailing zeros dropped: GPU shares are quarters and sevenths, and one
        # decimal printed a 0.25-GPU share as 0.2
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    return f"{value:,.0f}"


BLOCKED_TEXT = {
    "rack_unknown": "no job can start on known racks, and no source knows the racks of the "
    "nodes with free GPUs: whether one fits is unknown (give the rack label: "
    "k8s:?rack-label=KEY, or a Slurm topology.conf)",
    "scattered": "enough GPUs are free, but scattered: no node or rack has room for one job",
}


def racks_line(cluster: dict[str, Any]) -> str:
    """Where racks came from, or that they are unknown (never a guess)."""
    unknown = cluster.get("nodes_rack_unknown", 0)
    origin = cluster.get("racks_from")
    if not unknown:
        return f"racks: known for every node (from {origin or 'the source'})"
    if unknown == cluster["nodes"]:
        return (
            f"racks: unknown for all {unknown} nodes (no rack label found): multi-node shapes "
            "are counted on known racks only and marked rack unknown"
        )
    return f"racks: unknown for {unknown} of {cluster['nodes']} nodes (others from {origin})"


def jobs_cell(row: dict[str, Any]) -> str:
    """A shape's count; "0 to 3 (rack unknown)" where the unknown racks decide it."""
    generous = row.get("jobs_if_racks_allow")
    if generous is None:
        return _g(row["jobs_that_fit"])
    return f"{_g(row['jobs_that_fit'])} to {_g(generous)} (rack unknown)"


def print_table(result: dict[str, Any], out: TextIO, *, top: int = 10) -> None:
    cluster, spatial = result["cluster"], result["spatial"]
    temporal, memory, frag = result["temporal"], result["memory"], result["fgd"]
    out.write(f"Cluster {result['source']}\n")
    out.write(
        f"  {cluster['nodes']} nodes, {cluster['gpus']} GPUs ({cluster['usable_gpus']} usable, "
        f"{cluster['unhealthy_gpus']} unhealthy), {_g(cluster['allocated_gpus'])} GPUs allocated, "
        f"{cluster['pending_tasks']} tasks pending\n"
    )
    out.write(f"  {racks_line(cluster)}\n")
    if cluster["owner_unknown_gpus"]:
        out.write(
            f"  {cluster['owner_unknown_gpus']} GPUs in use, owner unknown (busy or holding "
            "memory, no allocation names them): counted allocated, never free\n"
        )
    out.write("\n")
    out.write("Spatial\n")
    _table(
        [
            ["measure", "GPUs"],
            ["free GPUs (whole, usable)", _g(spatial["free_gpus"])],
            ["free capacity incl. partial GPUs", _g(spatial["free_capacity_gpus"])],
            ["free share on partly used GPUs", _g(spatial["partial_free_gpus"])],
            ["free GPUs stranded by host CPU/memory", _g(spatial["stranded_gpus_by_host"])],
            ["largest job on one node", _g(spatial["largest_job"]["single_node_gpus"])],
            ["largest job in one NVLink island", _g(spatial["largest_job"]["nvlink_group_gpus"])],
            [
                "largest k x 8 job in one rack",
                _g(spatial["largest_job"]["multi_node_gpus_in_rack"]),
            ],
        ],
        out,
    )
    out.write("\nJobs that can start now (each shape alone)\n")
    rows = [["shape", "jobs", "free GPUs it cannot use"]]
    for row in spatial["shapes"]:
        stranded = row["stranded_gpus"]
        rows.append([row["shape"], jobs_cell(row), "-" if stranded is None else _g(stranded)])
    _table(rows, out)
    for row in spatial["shapes"]:
        for estimate in row["crosses_nvlink_islands"]:
            out.write(f"  {row['shape']} on {estimate['gpu_model']}: {estimate['text']}\n")
    blocked = [row for row in spatial["shapes"] if row.get("blocked_by")]
    for row in blocked:
        out.write(f"  {row['shape']}: {BLOCKED_TEXT[row['blocked_by']]}\n")
    out.write(
        f"\nTemporal (utilization < {temporal['threshold']:g} over {temporal['window_s']:g} s)\n"
        f"  allocated but idle: {temporal['allocated_idle_gpus']} of "
        f"{temporal['allocated_gpus']} allocated GPUs\n"
    )
    for tenant, gpus in list(temporal["idle_gpus_by_tenant"].items())[:5]:
        out.write(f"    {tenant}: {_g(gpus)} GPUs\n")
    out.write("\nType (idle capacity vs demand by GPU model)\n")
    rows = [["GPU model", "GPUs", "usable", "free", "free capacity", "allocated"]]
    for row in result["type"]["capacity"]:
        rows.append(
            [
                row["gpu_model"] or "(none)",
                _g(row["gpus"]),
                _g(row["usable_gpus"]),
                _g(row["free_gpus"]),
                _g(row["free_capacity_gpus"]),
                _g(row["allocated_gpus"]),
            ]
        )
    _table(rows, out)
    if result["type"]["demand"]:
        rows = [["pending for", "GPU tasks", "GPUs", "free capacity", "shortfall"]]
        for row in result["type"]["demand"]:
            rows.append(
                [
                    row["gpu_spec"],
                    _g(row["pending_tasks"]),
                    _g(row["pending_gpus"]),
                    _g(row["free_capacity_gpus"]),
                    _g(row["shortfall_gpus"]),
                ]
            )
        out.write("\n")
        _table(rows, out)
    out.write(
        f"\nMemory\n  stranded GPU memory: {memory['stranded_memory_bytes'] / GIB:,.1f} GiB on "
        f"{memory['gpus_with_stranded_memory']} GPUs (free memory no request of "
        f"{memory['min_request_bytes'] / GIB:g} GiB can use)\n"
    )
    out.write(
        f"\nFGD fragmentation (workload: {frag['workload']}, {frag['task_types']} task types)\n"
        f"  fragment {frag['fragment_gpus']:,.1f} GPUs = {frag['fragment_pct_of_capacity']:.2f}% "
        f"of capacity, {100 * frag['fragment_rate']:.1f}% of idle GPU\n"
    )
    nodes = result["nodes"]
    order = measures.most_fragmented(nodes, top)
    if top > 0 and not len(order):
        out.write("\nMost fragmented nodes: none (no node has an FGD fragment)\n")
    if len(order):
        out.write(f"\nMost fragmented nodes (top {len(order)} by FGD fragment)\n")
        rows = [
            ["node", "model", "free", "free cap.", "NVLink grp", "idle alloc", "fragment", "score"]
        ]
        for i in order:
            rows.append(
                [
                    str(nodes["node"][i]),
                    str(nodes["gpu_model"][i]),
                    _g(int(nodes["free_gpus"][i])),
                    _g(float(nodes["free_capacity_gpus"][i])),
                    _g(_known(int(nodes["largest_free_nvlink_group"][i]))),
                    _g(int(nodes["allocated_idle_gpus"][i])),
                    f"{nodes['fgd_fragment_gpus'][i]:.2f}",
                    f"{nodes['score'][i]:.2f}",
                ]
            )
        _table(rows, out)
