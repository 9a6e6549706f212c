"""Who owns a GPU process or a GPU: Kubernetes pods (kubelet pod-resources, cgroups) or Slurm jobs."""
