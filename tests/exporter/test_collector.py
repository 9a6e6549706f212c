from prometheus_client.parser import text_string_to_metric_families

from exporter.collector import CollectorLoop
from tests.exporter.scripted_backend import ScriptedBackend


def value(loop: CollectorLoop, name: str, **labels) -> float | None:
    for family in text_string_to_metric_families(loop.current_page().body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def make(script, clock_box, **kwargs):
    backend = ScriptedBackend(script)
    loop = CollectorLoop(backend, interval_s=10, clock=lambda: clock_box[0], **kwargs)
    return backend, loop


def test_successful_cycle_publishes_page_and_self_metrics():
    now = [1_700_000_000.0]
    _backend, loop = make(["ok"], now)
    assert not loop.health().healthy  # nothing collected yet
    loop.run_once()
    assert loop.health().healthy
    assert value(loop, "gpu_exporter_backend_up", backend="scripted") == 1
    assert value(loop, "gpu_memory_used_bytes", node="node-0", gpu="0") == 40 * 2**30
    assert value(loop, "gpu_exporter_collection_errors_total", call="nvmlDeviceGetPowerUsage") == 1
    assert value(loop, "gpu_exporter_collections_total") == 1


def test_backend_down_is_up_zero_and_restarted_with_backoff():
    now = [1_700_000_000.0]
    backend, loop = make(["down", "down", "ok"], now)
    loop.run_once()
    assert value(loop, "gpu_exporter_backend_up") == 0
    assert "Shared Library Not Found" in loop.health().reason
    first_backoff = loop._backoff_s
    loop.run_once()
    assert loop._backoff_s == 2 * first_backoff
    loop.run_once()
    assert value(loop, "gpu_exporter_backend_up") == 1
    assert backend.starts == 3  # start() retried after each failure
    assert value(loop, "gpu_exporter_collection_errors_total", call="collect") == 2


def test_stale_data_turns_health_red_and_is_dropped_after_the_limit():
    now = [1_700_000_000.0]
    _backend, loop = make(["ok", "down", "down"], now, stale_intervals=3)
    loop.run_once()
    now[0] += 15
    loop.run_once()  # failure within the staleness limit: old GPU series still served
    assert value(loop, "gpu_memory_used_bytes", node="node-0", gpu="0") is not None
    assert not loop.health().healthy
    now[0] += 60
    loop.run_once()  # now older than 3 intervals: GPU series dropped, self-metrics stay
    assert value(loop, "gpu_memory_used_bytes", node="node-0", gpu="0") is None
    assert value(loop, "gpu_exporter_backend_up") == 0
    assert "ago" in loop.health().reason


def test_hung_backend_never_blocks_and_is_not_called_twice():
    now = [1_700_000_000.0]
    backend, loop = make(["ok", "hang"], now, timeout_s=0.2)
    loop.run_once()
    loop.run_once()  # hangs: abandoned after 0.2 s
    assert value(loop, "gpu_exporter_collection_errors_total", call="collect_timeout") == 1
    loop.run_once()  # previous collect still stuck: no second thread
    assert backend.calls == 2
    assert value(loop, "gpu_exporter_collection_errors_total", call="collect_hung") == 1
    backend.release.set()
    loop._worker.join(5)
    loop.run_once()
    assert value(loop, "gpu_exporter_backend_up") == 1


def test_backend_bug_is_contained():
    now = [1_700_000_000.0]
    _backend, loop = make(["bug"], now)
    loop.run_once()
    assert value(loop, "gpu_exporter_backend_up") == 0
    assert "\n" not in loop.health().reason


def test_backoff_stops_at_four_intervals_so_a_recovered_backend_is_seen_soon():
    now = [1_700_000_000.0]
    _backend, loop = make(["down"] * 8, now)
    waits = []
    for _ in range(8):
        loop.run_once()
        waits.append(loop._backoff_s)
    assert waits == [10, 20, 40, 40, 40, 40, 40, 40]  # interval 10 s: at most 4 intervals


def test_loop_failure_counters_exist_at_zero_before_the_first_failure():
    now = [1_700_000_000.0]
    _backend, loop = make(["ok"], now)
    loop.run_once()
    for call in ("collect", "collect_timeout", "collect_hung"):
        assert value(loop, "gpu_exporter_collection_errors_total", call=call) == 0
