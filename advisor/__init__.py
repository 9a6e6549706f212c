"""gpu-defrag advisor: cluster model, fragmentation, forecasting, planning, service and app."""
