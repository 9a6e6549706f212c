"""The session's real Slurm cluster (tests/slurm/cluster.py) and a clean slate per test."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ci import skip_or_fail
from tests.slurm.cluster import PACKAGE, SlurmCluster, SlurmError, missing_binaries


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """16 nodes x 8 fake A100 in two racks, started once for the session (under a second) and
    stopped at its end with no process left. Missing binaries skip the tests on a developer's
    machine and fail them under CI; a cluster that does not start always fails."""
    missing = missing_binaries()
    if missing:
        skip_or_fail(f"{', '.join(missing)} not installed: apt-get install {PACKAGE}")
    # not under pytest's private tmp dir: slurmrestd runs as nobody and must read slurm.conf
    workdir = Path(tempfile.mkdtemp(prefix="gpu-defrag-slurm-"))
    workdir.chmod(0o755)
    cluster = SlurmCluster(workdir)
    try:
        cluster.start()
    except SlurmError as error:
        cluster.stop()
        pytest.fail(f"the test Slurm cluster did not start: {error}")
    try:
        yield cluster
    finally:
        cluster.stop()
        left = cluster.leftovers()
        if not left:
            shutil.rmtree(workdir, ignore_errors=True)
        assert not left, f"processes left after the Slurm cluster stopped: {left}"


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The cluster with no job, no reservation and every node idle."""
    slurm_cluster.reset()
    return slurm_cluster


@pytest.fixture
def slurmrestd(slurm: SlurmCluster) -> str:
    """The socket of a real slurmrestd in front of the clean cluster (started once)."""
    if shutil.which("slurmrestd") is None:
        skip_or_fail("slurmrestd not installed: apt-get install slurmrestd")
    return slurm.start_slurmrestd()
