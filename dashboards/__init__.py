"""Grafana dashboards generated from code (see generate.py); JSON in json/, provisioning in provisioning/."""
