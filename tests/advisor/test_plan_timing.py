"""When to act on a plan (advisor.planner.timing): worked out by hand on small forecasts."""

from __future__ import annotations

import pytest

from advisor.planner.timing import DemandPoint, PlanCosts, act_window, cost_at, forecast_points

NOW = 1_000_000.0
HOUR = 3600.0


def point(
    hours: float, p50: float, p10: float | None = None, p90: float | None = None
) -> DemandPoint:
    return DemandPoint(NOW + hours * HOUR, p50, 100.0, p10, p90)


def test_cost_adds_restarts_held_hours_by_demand_and_the_wait() -> None:
    costs = PlanCosts(restart_gpu_hours=2.0, held_gpu_hours=10.0, waiting_gpus=8.0)
    # 2 + 10 x 0.5 + 8 GPUs x 3 h
    assert cost_at(costs, NOW, NOW + 3 * HOUR, 0.5) == pytest.approx(31.0)


def test_a_plan_nobody_waits_on_waits_for_the_quietest_hour() -> None:
    costs = PlanCosts(restart_gpu_hours=1.0, held_gpu_hours=10.0)
    now = DemandPoint(NOW, 90.0, 100.0)
    window = act_window(costs, NOW, now, [point(1, 85), point(6, 40, 30, 55), point(24, 88)])
    assert window.when == "window"
    assert window.at == NOW + 6 * HOUR
    # held GPU-hours weigh 0.9 now and 0.4 at the window: 10 x 0.5 saved
    assert window.saving_gpu_hours == pytest.approx(5.0)
    # at P90 demand (0.55) 3.5 saved, at P10 (0.3) 6.0
    assert window.saving_interval == pytest.approx((3.5, 6.0))
    assert window.demand_interval == (30, 55)
    assert window.forecast


def test_a_waiting_job_makes_acting_now_cheaper() -> None:
    costs = PlanCosts(restart_gpu_hours=1.0, held_gpu_hours=10.0, waiting_gpus=8.0)
    now = DemandPoint(NOW, 90.0, 100.0)
    window = act_window(costs, NOW, now, [point(6, 40)])
    # waiting 6 h costs 48 GPU-hours, holding later saves 5: act now
    assert window.when == "now"
    assert "waiting costs more" in window.reason


def test_a_waiting_job_still_waits_when_the_saving_is_larger() -> None:
    costs = PlanCosts(held_gpu_hours=1000.0, waiting_gpus=1.0)
    now = DemandPoint(NOW, 100.0, 100.0)
    window = act_window(costs, NOW, now, [point(1, 50)])
    # 1000 x (1.0 - 0.5) = 500 saved against 1 GPU x 1 h of waiting
    assert window.when == "window" and window.saving_gpu_hours == pytest.approx(499.0)


def test_no_forecast_means_now_and_says_why() -> None:
    window = act_window(PlanCosts(held_gpu_hours=5.0), NOW, DemandPoint(NOW, 50.0, 100.0), [])
    assert window.when == "now" and not window.forecast
    assert "no demand forecast" in window.reason


def test_no_quieter_hour_means_now() -> None:
    window = act_window(
        PlanCosts(held_gpu_hours=5.0), NOW, DemandPoint(NOW, 50.0, 100.0), [point(1, 60)]
    )
    assert window.when == "now" and "no forecast hour has less demand" in window.reason


def test_forecast_points_read_the_served_document() -> None:
    doc = {
        "pools": [
            {
                "pool": "a100",
                "capacity_gpus": 128.0,
                "horizons": [
                    {
                        "horizon": "1h",
                        "available": True,
                        "target": "2026-01-05T10:00:00Z",
                        "point_gpus": 90.0,
                        "quantiles": {"0.1": 80.0, "0.5": 91.0, "0.9": 100.0},
                    },
                    {"horizon": "24h", "available": False, "reason": "needs 36 hours"},
                ],
            }
        ]
    }
    points = forecast_points(doc)["a100"]
    assert len(points) == 1
    assert points[0].p50 == 91.0 and points[0].p10 == 80.0 and points[0].capacity == 128.0
    assert points[0].at == 1767607200.0


def test_served_plans_get_a_window_and_the_job_they_would_start() -> None:
    from advisor.planner.constraints import Policy
    from advisor.planner.reserve import plan_reservations
    from advisor.planner.timing import with_windows
    from tests.advisor.test_planner_reserve import cluster

    model = cluster()
    [plan] = plan_reservations(model, Policy())
    doc = with_windows({"plans": [plan.to_dict(), {"goal": "x", "feasible": False}]}, None, model)
    served, refused = doc["plans"]
    assert served["waiting_job"] == "big"
    assert served["window"]["when"] == "now" and not served["window"]["forecast"]
    assert "window" not in refused
