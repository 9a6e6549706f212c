"""GPUs added, reset or removed while the NVML backend runs: found again without a restart.

The fake lists GPUs as NVML does (fixed at the nvmlInit that starts a session) and answers
NVML_ERROR_UNINITIALIZED to any handle, event set or GPM sample of an ended session, counting
it in `stale_uses`; so every test here also proves that no stale handle was used.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pynvml
import pytest

from exporter.backends.nvml import NvmlBackend
from exporter.backends.nvml_rescan import (
    LOST_RESCAN_S,
    RESCAN_S,
    Devices,
    ProbeFailed,
    SubprocessProbe,
    list_devices,
    match,
    parse_answer,
)
from exporter.readings import Collection, GpuReading
from tests.exporter.nvml_backends import Factory, backends, gpus_of
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, hgx_h100

BACKEND, RESCAN = "exporter.backends.nvml", "exporter.backends.nvml_rescan"  # loggers


class Clock:
    """The backend's monotonic clock, moved by hand: no test waits for minutes."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingProbe:
    """The child-process probe's answer, from the fake's view of a fresh session."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake
        self.calls = 0

    def __call__(self) -> Devices:
        self.calls += 1
        return self.fake.fresh_enumeration()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_backend(clock: Clock) -> Iterator[Factory]:
    with backends(clock=clock) as make:

        def make_probed(fake: FakeNvml, *, probe: bool = True, **kwargs: object) -> NvmlBackend:
            kwargs.setdefault("rescan_probe", CountingProbe(fake) if probe else None)
            return make(fake, **kwargs)

        yield make_probed


def by_uuid(collection: Collection) -> dict[str, GpuReading]:
    return {gpu.uuid: gpu for gpu in gpus_of(collection)}


def collect_until(backend: NvmlBackend, done: Callable[[Collection], bool]) -> Collection:
    deadline = time.monotonic() + 3.0
    while True:
        collection = backend.collect()
        if done(collection) or time.monotonic() > deadline:
            return collection
        time.sleep(0.01)


def said(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The lines one logger wrote (the calls' own failure lines are tested elsewhere)."""
    return [r.getMessage() for r in caplog.records if r.name == logger]


def assert_no_stale_use(fake: FakeNvml) -> None:
    assert fake.stale_uses == 0, "a handle, event set or sample of an ended session was used"
    assert fake.shutdown_races == 0, "NVML was shut down under a waiting XID thread"


def new_h100(bus: int) -> FakeGpu:
    return FakeGpu(index=99, bus=bus, power_mw=123_000)


# ----- GPUs added ----------------------------------------------------------------------------


@pytest.mark.parametrize("probe", [True, False], ids=["child-probe", "in-process"])
def test_gpu_added_appears_after_the_rescan(make_backend, clock, caplog, probe):
    fake = hgx_h100(2)
    backend = make_backend(fake, probe=probe)
    assert len(gpus_of(backend.collect())) == 2

    fake.plug(new_h100(bus=0xF0))
    assert len(gpus_of(backend.collect())) == 2  # NVML's list is fixed until a new session
    clock.now += RESCAN_S
    with caplog.at_level(logging.INFO, logger=BACKEND):
        backend.collect()  # rescans at its end
        after = backend.collect()

    added = gpus_of(after)[2]
    assert added.uuid == fake.gpus[2].uuid and added.power_watts == 123.0 and added.healthy
    assert [g.power_watts for g in gpus_of(after)[:2]] == [70.0, 70.0]
    assert fake.calls[("nvmlInit", None)] == 2 and fake.initialized == 1
    assert said(caplog, BACKEND) == [f"NVML: GPU 2 ({added.uuid}) appeared"]
    assert not after.errors
    assert_no_stale_use(fake)

    fake.push_xid(2, 31)  # the new GPU is watched for XID events
    watched = collect_until(backend, lambda c: bool(gpus_of(c)[2].xid_errors))
    assert gpus_of(watched)[2].xid_errors == {31: 1.0}


def test_a_node_that_did_not_change_is_not_reinitialised(make_backend, clock):
    fake = hgx_h100(2)
    probe = CountingProbe(fake)
    backend = make_backend(fake, rescan_probe=probe)
    for _ in range(4):
        backend.collect()
        clock.now += RESCAN_S
    assert probe.calls == 3  # looked every interval (not at start) ...
    assert fake.calls[("nvmlInit", None)] == 1  # ... and never tore the session down


def test_gpu_plugged_in_front_renumbers_the_others_and_their_state_follows(make_backend, clock):
    fake = hgx_h100(2)
    backend = make_backend(fake)
    backend.collect()
    first, second = fake.gpus[0].uuid, fake.gpus[1].uuid
    fake.push_xid(1, 13)
    collect_until(backend, lambda c: bool(gpus_of(c)[1].xid_errors))

    fake.plug(new_h100(bus=0x01))  # a lower PCI bus: listed first from the next session
    clock.now += RESCAN_S
    backend.collect()
    after = backend.collect()

    assert [g.uuid for g in gpus_of(after)][1:] == [first, second]
    assert [g.index for g in gpus_of(after)] == [0, 1, 2]
    assert gpus_of(after)[2].xid_errors == {13: 1.0}  # counted before, kept under index 2
    assert gpus_of(after)[0].xid_errors == {} and gpus_of(after)[0].power_watts == 123.0
    assert {(link.gpu, link.peer) for link in after.nodes[0].links} >= {(1, 2), (2, 1)}
    assert_no_stale_use(fake)


# ----- GPUs removed ---------------------------------------------------------------------------


def test_gpu_removed_is_reported_lost_then_its_series_end(make_backend, clock, caplog):
    fake = hgx_h100(4)
    backend = make_backend(fake, gone_retention=600.0)
    backend.collect()
    gone = fake.unplug(3)

    with caplog.at_level(logging.INFO, logger=BACKEND):
        lost = backend.collect()  # the session still lists it: GPU_IS_LOST
        assert gpus_of(lost)[3].lost and gpus_of(lost)[3].uuid == gone.uuid
        clock.now += LOST_RESCAN_S  # the loss brought the rescan forward from 5 minutes
        backend.collect()
        assert fake.calls[("nvmlInit", None)] == 2
        served = []
        for _ in range(3):
            served.append(backend.collect())
            clock.now += 299.0

    for collection in served:  # still `gpu_lost 1` for the alert, identity kept
        reading = gpus_of(collection)[3]
        assert (reading.index, reading.uuid, reading.lost, reading.healthy) == (
            3,
            gone.uuid,
            True,
            False,
        )
        assert all(not g.lost and g.power_watts == 70.0 for g in gpus_of(collection)[:3])
    assert said(caplog, BACKEND) == [
        f"NVML: GPU 3 ({gone.uuid}) is no longer listed: served as lost for 600s, then dropped"
    ]

    with caplog.at_level(logging.INFO, logger=BACKEND):
        dropped = backend.collect()  # 600 s after it was found gone
    assert [g.uuid for g in gpus_of(dropped)] == [g.uuid for g in fake.gpus]
    assert said(caplog, BACKEND)[-1] == (f"NVML: GPU 3 ({gone.uuid}) dropped: not listed for 600s")
    assert not dropped.errors
    assert_no_stale_use(fake)


def test_gpu_removed_from_the_middle_ends_at_once_when_its_index_is_taken(
    make_backend, clock, caplog
):
    fake = hgx_h100(4)
    backend = make_backend(fake)
    backend.collect()
    fake.push_xid(2, 94)
    collect_until(backend, lambda c: bool(gpus_of(c)[2].xid_errors))
    moved_uuid = fake.gpus[2].uuid
    gone = fake.unplug(1)

    backend.collect()
    clock.now += LOST_RESCAN_S
    with caplog.at_level(logging.INFO, logger=BACKEND):
        backend.collect()
        after = backend.collect()

    # Two series cannot share gpu="1": the gone GPU ends, GpuMissing (fewer GPUs) covers it.
    assert [g.uuid for g in gpus_of(after)] == [g.uuid for g in fake.gpus]
    assert by_uuid(after)[moved_uuid].index == 1
    assert by_uuid(after)[moved_uuid].xid_errors == {94: 1.0}  # the counter did not reset
    assert gone.uuid not in by_uuid(after)
    messages = said(caplog, BACKEND)
    assert messages == [
        f"NVML: GPU 2 ({moved_uuid}) is GPU 1 now",
        f"NVML: GPU 3 ({fake.gpus[2].uuid}) is GPU 2 now",
        f"NVML: GPU 1 ({gone.uuid}) is no longer listed and its index names another GPU now: "
        "its series end",
    ]
    assert_no_stale_use(fake)


def test_gpu_back_after_a_reset_is_matched_by_uuid(make_backend, clock, caplog):
    fake = hgx_h100(2)
    backend = make_backend(fake)
    backend.collect()
    fake.push_xid(1, 79)
    collect_until(backend, lambda c: bool(gpus_of(c)[1].xid_errors))
    fell = fake.unplug(1)
    assert gpus_of(backend.collect())[1].lost
    fake.plug(dataclasses.replace(fell))  # PCI remove + rescan: the same GPU, a new device

    assert gpus_of(backend.collect())[1].lost  # the old session's device stays lost
    clock.now += LOST_RESCAN_S
    with caplog.at_level(logging.INFO, logger=BACKEND):
        backend.collect()
        back = gpus_of(backend.collect())[1]

    assert back.uuid == fell.uuid and not back.lost and back.power_watts == 70.0
    assert back.xid_errors == {79: 1.0}  # kept across the re-initialisation
    assert not [r for r in caplog.records if "no longer listed" in r.getMessage()]
    assert_no_stale_use(fake)


def test_gpu_still_lost_in_a_fresh_session_is_not_reinitialised_for(make_backend, clock):
    fake = hgx_h100(2)
    probe = CountingProbe(fake)
    backend = make_backend(fake, rescan_probe=probe)
    backend.collect()
    fake.gpus[1].lost = True  # fell off the bus and stays listed

    backend.collect()
    clock.now += LOST_RESCAN_S
    backend.collect()
    assert probe.calls == 1 and fake.calls[("nvmlInit", None)] == 1
    clock.now += LOST_RESCAN_S  # not newly lost: the next look is the regular one
    backend.collect()
    assert probe.calls == 1
    assert gpus_of(backend.collect())[1].lost


# ----- state kept across a re-initialisation ---------------------------------------------------


def test_state_of_gpus_whose_uuid_persists_survives_the_reinitialisation(make_backend, clock):
    fake = hgx_h100(2)
    fake.gpus[0].gpm = {pynvml.NVML_GPM_METRIC_SM_UTIL: 80.0}
    fake.inject("nvmlDeviceGetEncoderUtilization", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    backend = make_backend(fake, probe=False)
    backend.collect()
    fake.push_xid(1, 48)
    collect_until(backend, lambda c: bool(gpus_of(c)[1].xid_errors))
    fake.advance(1.0)
    assert gpus_of(backend.collect())[0].sm_active_ratio == pytest.approx(0.8)

    clock.now += RESCAN_S
    backend.collect()  # re-initialises at its end
    assert fake.calls[("nvmlInit", None)] == 2
    fake.advance(1.0)
    after = backend.collect()

    assert gpus_of(after)[1].xid_errors == {48: 1.0}  # a counter: no reset to 0
    assert gpus_of(after)[0].sm_active_ratio == pytest.approx(0.8)  # no gap in GPM rates
    assert fake.calls[("nvmlDeviceGetEncoderUtilization", 1)] == 1  # still known unsupported
    fake.push_xid(1, 48)
    counted = collect_until(backend, lambda c: gpus_of(c)[1].xid_errors.get(48) == 2.0)
    assert gpus_of(counted)[1].xid_errors == {48: 2.0}
    assert not after.errors
    assert_no_stale_use(fake)


def test_threads_holding_handles_are_stopped_and_resumed_around_each_reinitialisation(
    make_backend, clock
):
    fake = hgx_h100(2)
    backend = make_backend(fake, probe=False, pcie_interval=0.01)
    backend.collect()
    errors = []
    for _ in range(5):  # the XID and PCIe threads are busy all along
        clock.now += RESCAN_S
        errors.append(backend.collect().errors)
    assert fake.calls[("nvmlInit", None)] == 6
    assert_no_stale_use(fake)
    assert not any(errors)

    fake.gpus[1].pcie_rx_kbs = 20
    fake.push_xid(0, 31)
    collection = collect_until(
        backend,
        lambda c: gpus_of(c)[1].pcie_rx_bytes_per_second == 20 * 1024 and gpus_of(c)[0].xid_errors,
    )
    assert gpus_of(collection)[1].pcie_rx_bytes_per_second == 20 * 1024
    assert gpus_of(collection)[0].xid_errors == {31: 1.0}


def test_a_thread_stuck_in_the_driver_postpones_the_rescan(
    make_backend, clock, monkeypatch, caplog
):
    fake = hgx_h100(2)
    backend = make_backend(fake, probe=False)
    backend.collect()
    monkeypatch.setattr(backend._watcher, "stop", lambda: False)

    clock.now += RESCAN_S
    with caplog.at_level(logging.WARNING, logger=RESCAN):
        postponed = backend.collect()
    assert fake.shutdowns == 0 and postponed.errors["rescan"] == 1
    assert said(caplog, RESCAN) == [
        "NVML GPU rescan failed: an XID or PCIe thread is still inside the driver; "
        "the GPUs known are still served (next try in 60s)"
    ]
    assert all(g.power_watts == 70.0 for g in gpus_of(backend.collect()))

    monkeypatch.undo()
    clock.now += 60.0
    backend.collect()
    assert fake.calls[("nvmlInit", None)] == 2
    assert_no_stale_use(fake)


# ----- failed rescans --------------------------------------------------------------------------


def test_failed_rescan_keeps_serving_and_is_one_log_line(make_backend, clock, caplog):
    fake = hgx_h100(2)
    probe = CountingProbe(fake)
    backend = make_backend(fake, rescan_probe=probe)
    backend.collect()
    fake.plug(new_h100(bus=0xF0))
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED  # a fresh session fails now

    clock.now += RESCAN_S
    with caplog.at_level(logging.INFO, logger=RESCAN):
        served = []
        for _ in range(4):
            served.append(backend.collect())
            clock.now += 60.0
        assert probe.calls == 4  # retried every minute
        assert said(caplog, RESCAN) == [
            "NVML GPU rescan failed: Driver Not Loaded; the GPUs known are still served "
            "(next try in 60s)"
        ]
        for collection in served:  # the session was never torn down
            assert [g.power_watts for g in gpus_of(collection)] == [70.0, 70.0]
            assert collection.errors == {"rescan": 1}  # gpu_exporter_collection_errors_total
        assert fake.calls[("nvmlInit", None)] == 1

        fake.init_error = None
        backend.collect()
        assert said(caplog, RESCAN)[-1] == "NVML GPU rescan works again"
    assert len(gpus_of(backend.collect())) == 3
    assert_no_stale_use(fake)


def test_failed_reinitialisation_in_process_keeps_the_state_for_the_retry(
    make_backend, clock, caplog
):
    fake = hgx_h100(2)
    backend = make_backend(fake, probe=False)
    backend.collect()
    fake.push_xid(0, 48)
    collect_until(backend, lambda c: bool(gpus_of(c)[0].xid_errors))
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    clock.now += RESCAN_S
    with caplog.at_level(logging.WARNING, logger=RESCAN):
        during = backend.collect()  # the cycle that re-initialises is served in full
    assert [g.power_watts for g in gpus_of(during)] == [70.0, 70.0]
    assert during.errors["rescan"] == 1
    assert said(caplog, RESCAN) == [
        "NVML GPU rescan failed: re-initialising NVML: Driver Not Loaded; the next "
        "collection retries (next try in 60s)"
    ]
    with pytest.raises(Exception, match="Driver Not Loaded"):  # BackendUnavailable: backoff
        backend.collect()

    fake.init_error = None
    back = backend.collect()
    assert gpus_of(back)[0].xid_errors == {48: 1.0}  # nothing reset by the outage
    assert [g.power_watts for g in gpus_of(back)] == [70.0, 70.0]
    assert_no_stale_use(fake)


# ----- schedule and flags ----------------------------------------------------------------------


def test_a_new_loss_brings_the_rescan_forward_at_most_once_a_minute(make_backend, clock):
    fake = hgx_h100(2)
    probe = CountingProbe(fake)
    backend = make_backend(fake, rescan_probe=probe)
    backend.collect()
    clock.now += 30.0
    fake.gpus[0].lost = True
    backend.collect()
    assert probe.calls == 0  # 30 s after the last look: not yet
    clock.now += 30.0
    backend.collect()
    assert probe.calls == 1
    fake.gpus[0].lost = False
    backend.collect()
    fake.gpus[0].lost = True  # lost again at once: the next look is a minute after the last
    backend.collect()
    clock.now += 59.0
    backend.collect()
    assert probe.calls == 1
    clock.now += 1.0
    backend.collect()
    assert probe.calls == 2


def test_rescans_can_be_turned_off(make_backend, clock):
    fake = hgx_h100(2)
    probe = CountingProbe(fake)
    backend = make_backend(fake, rescan_probe=probe, rescan_interval=0.0)
    backend.collect()
    fake.gpus[0].lost = True
    for _ in range(3):
        clock.now += 10 * RESCAN_S
        backend.collect()
    assert probe.calls == 0 and fake.calls[("nvmlInit", None)] == 1


def test_rescan_interval_flag():
    parser = argparse.ArgumentParser()
    NvmlBackend.add_arguments(parser)
    default = NvmlBackend.from_args(parser.parse_args([]))
    assert default.rescan_interval == 300.0
    assert isinstance(default._rescans.probe, SubprocessProbe)
    assert default._rescans.probe.timeout == 20.0  # init timeout + the child's start-up
    off = NvmlBackend.from_args(parser.parse_args(["--nvml.rescan-interval", "0"]))
    assert off.rescan_interval == 0.0
    assert NvmlBackend.from_args(parser.parse_args(["--nvml.rescan-interval", "2m"])).rescan_interval == 120.0  # fmt: skip
    with pytest.raises(SystemExit):
        parser.parse_args(["--nvml.rescan-interval", "often"])


# ----- matching and the probe -------------------------------------------------------------------


def test_match_follows_uuids_and_places_unreadable_gpus_by_index():
    known = [(0, "GPU-a"), (1, "GPU-b"), (2, "GPU-c"), (-1, "GPU-gone")]
    assert match(known, ["GPU-a", "GPU-b", "GPU-c"]) == [0, 1, 2]
    assert match(known, ["GPU-b", "GPU-c"]) == [1, 2]  # renumbered
    assert match(known, ["GPU-a", None, "GPU-c"]) == [0, 1, 2]  # lost: still GPU-b
    assert match(known, [None, "GPU-a", "GPU-c"]) == [None, 0, 2]  # GPU-a is listed elsewhere
    assert match(known, ["GPU-new", "GPU-gone"]) == [None, 3]  # a gone one comes back by UUID
    assert match(known, [None, None, None, None]) == [0, 1, 2, None]  # never by index -1
    assert match([(0, "")], [None]) == [0]  # never identified: its index is all there is
    assert match(known, ["GPU-a", "GPU-a"]) == [0, None]


def test_probe_answer_is_parsed_or_one_line_of_why_not():
    assert parse_answer('{"devices": ["GPU-a", null]}\n', "", 0) == ["GPU-a", None]
    with pytest.raises(ProbeFailed, match=r"^Driver Not Loaded$"):
        parse_answer('{"error": "Driver\\n Not Loaded"}', "", 1)
    with pytest.raises(ProbeFailed, match=r"^the probe exited with 1: ImportError: no$"):
        parse_answer("", "Traceback (most recent call last):\nImportError: no\n", 1)
    with pytest.raises(ProbeFailed, match="exited with 0"):
        parse_answer('{"devices": [1]}', "", 0)


def test_subprocess_probe_of_this_machine():
    probe = SubprocessProbe(timeout=20.0)
    try:
        devices = probe()
    except ProbeFailed as error:  # the usual case here: no libnvidia-ml
        assert "\n" not in str(error) and str(error)
    else:  # a machine with a GPU: its UUIDs
        assert devices and all(d is None or d.startswith("GPU-") for d in devices)


def test_subprocess_probe_that_hangs_is_killed_and_not_piled_up():
    probe = SubprocessProbe(0.3, command=[sys.executable, "-c", "import time; time.sleep(30)"])
    started = time.monotonic()
    with pytest.raises(ProbeFailed, match=r"^the probe did not finish within 0\.3s$"):
        probe()
    assert time.monotonic() - started < 5.0

    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    probe._stuck = stuck  # as if the kill had not taken (uninterruptible sleep in the driver)
    try:
        with pytest.raises(ProbeFailed, match="still stuck"):
            probe()
    finally:
        stuck.kill()
        stuck.wait()


def test_a_second_init_in_the_same_process_does_not_list_gpus_again():
    fake = hgx_h100(2)
    fake.nvmlInit()  # the exporter's session
    fake.plug(new_h100(bus=0xF0))
    assert len(list_devices(fake)) == 2  # reference counted: the same session, the old list
    assert fake.initialized == 1
    assert len(fake.fresh_enumeration()) == 3  # what the child process sees
