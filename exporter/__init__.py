"""gpu-defrag exporter: per-node GPU collection behind one backend interface, served to Prometheus.

Never imports `advisor`; the advisor imports the metric-name contract from here.
"""
