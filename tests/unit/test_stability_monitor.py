"""The stability monitor's decisions, one rule at a time."""

from __future__ import annotations

import math

import pytest

from megatron_lgs.stability import StabilityConfig, StabilityMonitor, alerts


def _warm(monitor: StabilityMonitor, n: int = 10) -> None:
    for i in range(n):
        assert monitor.judge(3.0 + 0.01 * (i % 3), 1.0 + 0.05 * (i % 2)).apply


@pytest.mark.parametrize("loss, grad_norm", [(math.nan, 1.0), (math.inf, 1.0), (3.0, math.nan),
                                             (3.0, math.inf)])
def test_non_finite_loss_or_grad_norm_is_never_applied(loss, grad_norm):
    monitor = StabilityMonitor(StabilityConfig(spike_action="log"))
    verdict = monitor.judge(loss, grad_norm)
    assert not verdict.apply and verdict.reason == "nan"
    assert not monitor.losses  # a refused step does not enter the window


def test_loss_spike_by_zscore_with_each_action():
    for action, applied in (("log", True), ("skip", False), ("rollback", False)):
        monitor = StabilityMonitor(StabilityConfig(spike_action=action, spike_window=10))
        _warm(monitor)
        verdict = monitor.judge(4.0, 1.0)
        assert verdict.reason == "loss spike" and verdict.apply == applied
        assert verdict.rollback == (action == "rollback")
        assert monitor.judge(3.01, 1.0).apply and monitor.judge(3.01, 1.0).reason is None


def test_grad_norm_spike_by_multiple_of_the_window_median():
    monitor = StabilityMonitor(StabilityConfig(spike_action="skip", spike_window=10,
                                               grad_norm_spike_factor=10.0))
    _warm(monitor)
    assert monitor.judge(3.0, 9.0).apply
    verdict = monitor.judge(3.0, 20.0)
    assert not verdict.apply and verdict.reason == "grad norm spike"


def test_no_spike_is_called_without_history():
    monitor = StabilityMonitor(StabilityConfig(spike_action="skip", spike_window=10))
    assert monitor.judge(3.0, 1.0).apply and monitor.judge(300.0, 100.0).apply


def test_window_is_bounded_and_round_trips():
    monitor = StabilityMonitor(StabilityConfig(spike_window=4))
    _warm(monitor, 9)
    assert len(monitor.losses) == 4
    other = StabilityMonitor(StabilityConfig(spike_window=4))
    other.load_state_dict(monitor.state_dict())
    assert other.state_dict() == monitor.state_dict()
    assert other.loss_variance() == monitor.loss_variance() > 0


def test_alert_thresholds_from_the_monitoring_guide():
    assert alerts(1.0, 1e-4, 0.1) == []
    lines = alerts(500.0, 0.5, 0.9)
    assert len(lines) == 3 and all(line.startswith(" WARNING:") for line in lines)
    assert alerts(1e-5, 1e-8, 0.0)[0].startswith(" WARNING: grad norm")
