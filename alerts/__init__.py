"""Prometheus alerting and recording rules, generated from `config.yaml` (see generate.py)."""
