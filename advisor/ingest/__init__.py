"""Ingest: turning trace files, Prometheus answers and snapshots into plain typed data."""
