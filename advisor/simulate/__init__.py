"""`gpu-defrag simulate`: a discrete-event replay with departures, a queue and the advisor in the loop.

Modules, one job each: `jobs` (the job table, its readers and the load compression), `cluster`
(the live node state with tasks, holds and accounting), `queue` (priority FIFO with backfill),
`schedulers` (node scoring policies by name), `defrag` (the established defragmenters),
`advisor_adapter` (the one place that calls the advisor service's run step), `operator` (applies
the advisor's plans as an operator would), `engine` (the event loop), `outputs` (CSV and plots),
`sim_export` (the simulated fleet's workload as a job CSV) and `cli`.
"""

# What acts on the cluster besides the scheduler (the summary's `advisor` column): nothing, the
# advisor in the loop, or one of the established defragmenters with the advisor off.
ADVISOR_MODES: tuple[str, ...] = ("off", "on", "descheduler", "consolidate")
