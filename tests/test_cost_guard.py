"""The profiling cost guard's arithmetic (capture/cost_guard.py): events, then memory."""

from __future__ import annotations

import pytest

from torchtriage.capture.cost_guard import MIN_ACTIVE, RECORDING_OPTIONS, fit_window
from torchtriage.diagnosis import thresholds as th

ALL_ON = dict.fromkeys(RECORDING_OPTIONS, True)
BYTES = th.PROFILE_BYTES_PER_EVENT.value
SHARE = th.PROFILE_MEMORY_SHARE.value
PLENTY = (1 << 40, "a test's terabyte")


def test_a_cheap_window_is_left_alone():
    fit = fit_window(1_000, warmup=2, active=5, options=ALL_ON, budget=100_000,
                     memory_limit=PLENTY)
    assert (fit.warmup, fit.active, fit.drop, fit.refused) == (2, 5, (), None)
    assert fit.cost.action == "none" and fit.cost.recorded_steps == 6
    assert fit.cost.estimated_bytes == 6 * 1_000 * BYTES
    assert fit.cost.memory_allowed_bytes == int(PLENTY[0] * SHARE)


def test_over_the_event_budget_the_window_shortens_then_records_ops_only():
    fit = fit_window(20_000, warmup=2, active=5, options=ALL_ON, budget=100_000,
                     memory_limit=PLENTY)
    assert (fit.warmup, fit.active, fit.drop) == (1, 5, ())  # recorded warm-up steps go first
    fit = fit_window(60_000, warmup=2, active=5, options=ALL_ON, budget=100_000,
                     memory_limit=PLENTY)
    assert (fit.warmup, fit.active) == (1, MIN_ACTIVE)
    assert fit.drop == RECORDING_OPTIONS and "may still take" in fit.cost.action
    # an ops-only window exports at the ops-only rate, one that keeps shapes at the other
    ops_only_s = fit.cost.estimated_events * th.PROFILE_EXPORT_US_PER_OP_EVENT.value / 1e6
    assert fit.cost.estimated_export_s == round(ops_only_s, 1)
    kept = fit_window(20_000, warmup=2, active=5, options=ALL_ON, budget=100_000,
                      memory_limit=PLENTY).cost
    assert kept.estimated_export_s == round(
        kept.estimated_events * th.PROFILE_EXPORT_US_PER_EVENT.value / 1e6, 1)


def test_a_window_past_its_memory_share_records_one_active_step_ops_only():
    events = 1_000_000  # two steps: 4.8 GB of profiler memory at 2,400 B an event
    limit = int(3 * events * BYTES / SHARE / 2)  # room for 1.5 steps
    fit = fit_window(events, warmup=2, active=5, options={"record_shapes": True},
                     budget=10**9, memory_limit=(limit, "a test's limit"))
    assert (fit.warmup, fit.active, fit.refused) == (1, 1, None)
    assert fit.drop == ("record_shapes",)
    assert fit.cost.recorded_steps == 1 and fit.cost.estimated_bytes == events * BYTES
    assert "one active step recorded" in fit.cost.action and "a test's limit" in fit.cost.action


def test_a_step_that_alone_passes_the_memory_share_and_cannot_be_cut_is_not_recorded():
    """time_sequence_prediction's LBFGS step (6.4 million events, 14 GiB of profiler memory)
    where no slice can be cut (no probe time: a training loop off the main thread)."""
    fit = fit_window(6_436_051, warmup=2, active=5, options=ALL_ON, budget=100_000,
                     memory_limit=(8 << 30, "80% of the memory available"))
    assert fit.refused is not None and fit.cost.recorded_steps == 0
    assert "6,436,051 profiler events" in fit.refused and "14.4 GiB" in fit.refused
    assert "50% of 8.0 GiB (80% of the memory available)" in fit.refused
    assert "\n" not in fit.refused and "not recorded" in fit.cost.action
    assert "may still take" not in fit.cost.action


def test_without_a_memory_limit_only_the_event_budget_applies():
    fit = fit_window(6_436_051, warmup=2, active=5, options=ALL_ON, budget=100_000,
                     memory_limit=None)
    assert fit.refused is None and fit.active == MIN_ACTIVE
    assert fit.cost.memory_allowed_bytes == 0


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_the_memory_fit_keeps_the_prepared_warm_up_step(warmup):
    fit = fit_window(1_000_000, warmup=warmup, active=5, options={}, budget=10**9,
                     memory_limit=(int(1.5 * 1_000_000 * BYTES / SHARE), "limit"))
    assert (fit.warmup, fit.active) == (min(warmup, 1), 1)


def test_a_step_that_alone_passes_the_memory_share_is_recorded_in_part():
    """The slice: the probed step's time x the share of its events that fit x the margin."""
    from torchtriage.capture.cost_guard import SLICE_MARGIN

    events, limit = 6_436_051, 8 << 30
    fit = fit_window(events, warmup=2, active=5, options=ALL_ON, budget=100_000,
                     memory_limit=(limit, "80% of the memory available"), probe_s=60.0)
    part = limit * SHARE / (events * BYTES) * SLICE_MARGIN
    assert fit.refused is None and (fit.warmup, fit.active) == (1, 1)
    assert fit.slice_s == pytest.approx(60.0 * part, abs=1e-3) and 0 < fit.slice_s < 30
    assert fit.cost.slice_s == fit.slice_s and fit.cost.recorded_steps == 1
    assert fit.cost.estimated_events == int(events * part)
    assert fit.cost.estimated_bytes <= limit * SHARE * SLICE_MARGIN
    assert fit.drop == RECORDING_OPTIONS
    assert "window shortened" not in fit.cost.action and "first" in fit.cost.action


def test_a_probe_cut_part_way_makes_the_window_a_slice_whatever_its_count():
    """The probe was stopped when the process had grown by the share: its events are a lower
    bound, so even a count that would fit gives a slice, at most as long as the probe ran."""
    fit = fit_window(10_000, warmup=2, active=5, options=ALL_ON, budget=100_000,
                     memory_limit=(8 << 30, "limit"), probe_s=4.0, probe_cut=True)
    assert fit.refused is None and (fit.warmup, fit.active) == (1, 1)
    assert fit.slice_s == 4.0 and fit.cost.probe_cut  # the share of 10,000 events: capped at 1
    assert "at least" in fit.cost.action and "the probe ran before it was stopped" in \
        fit.cost.action
    fit = fit_window(5_000_000, warmup=2, active=5, options=ALL_ON, budget=100_000,
                     memory_limit=(8 << 30, "limit"), probe_s=4.0, probe_cut=True)
    assert 0 < fit.slice_s < 2.0
