"""Kubernetes as a scheduler source: `k8s:[CONTEXT][?options]` (docs/kubernetes.md).

`spec` parses the source, `resources` names what is read, `client` lists and watches through the
official `kubernetes` client, `records` keeps the few fields of each object that matter,
`convert` turns them into a `SchedulerView`, `cache` keeps a watched copy current, and `source`
is what `advisor.ingest.schedulers` calls.
"""
