# One image for the exporter, the advisor and the app (`gpu-defrag <subcommand>`).
# On GPU nodes run it with the NVIDIA container runtime, which mounts libnvidia-ml.so and the
# /dev/nvidia* devices; the image itself carries no CUDA.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/gpu-defrag
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY gpu_defrag_common ./gpu_defrag_common
COPY exporter ./exporter
COPY advisor ./advisor
COPY alerts ./alerts
RUN pip install -c constraints.txt . && rm -rf build *.egg-info

# Unprivileged by default; the Kubernetes DaemonSet and the compose `gpu` profile run the
# exporter as root because the kubelet pod-resources socket and host /proc need it.
USER 65534:65534
EXPOSE 9835 9836 8501
ENTRYPOINT ["gpu-defrag"]
CMD ["exporter", "--backend", "sim", "--sim.preset", "a100-16x8", "--web.listen-address", ":9835"]
