"""Fragmentation measures over the cluster model (FGD fragment amount and others)."""
