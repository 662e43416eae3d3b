"""Stage times, the pipeline schedule and throughput: hand-computed cases, monotonic behaviour, calibration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures import synthetic, workload

from optimum_ipu.costmodel import HARDWARE
from optimum_ipu.costmodel.hardware import ASSUMPTIONS, CALIBRATION
from optimum_ipu.costmodel.performance import (
    StageTime,
    block_forward_time,
    estimate_performance,
    pipeline_cycles,
)
from optimum_ipu.costmodel.profile import BlockProfile, Matmul

MK2, BOW = HARDWARE["mk2"], HARDWARE["bow"]
PER_OP = CALIBRATION.cycles_per_operation / MK2.clock_hz


def _brute_force_cycles(stages, ga, copy):
    n = len(stages)
    out = []
    for c in range(ga + 2 * n - 2):
        work = []
        for s in stages:
            w = s.forward if 0 <= c - s.ipu < ga else 0.0
            w += s.recompute + s.backward if 0 <= c - (2 * n - 2 - s.ipu) < ga else 0.0
            work.append(w)
        out.append(max(work) + copy)
    return out


def test_pipeline_cycles_by_hand():
    stages = [
        StageTime(0, forward=1, backward=2, recompute=1),
        StageTime(1, forward=1, backward=2, recompute=0),
    ]
    # GA + 2N - 2 = 6 cycles: fill (forward only, then the last IPU's fused forward + backward),
    # steady state (every IPU busy), flush (backwards only).
    assert pipeline_cycles(stages, 4, 0.5) == [1.5, 3.5, 4.5, 4.5, 3.5, 3.5]
    stages.append(StageTime(2, forward=2, backward=4, recompute=2))
    assert pipeline_cycles(stages, 40, 0.1) == pytest.approx(_brute_force_cycles(stages, 40, 0.1))


def test_single_ipu_runs_ga_cycles_without_copies():
    stages = [StageTime(0, forward=1, backward=2)]
    assert pipeline_cycles(stages, 5, 0.0) == [3.0] * 5


def test_block_time_is_flops_at_calibrated_efficiency_plus_fixed_cost_per_operation():
    mm = Matmul(1, 1024, 1024, 1024)
    block = BlockProfile("b", "layer", ("b",), matmuls=[mm], other_ops=3)
    w = workload(ipus_per_replica=1)
    seconds, pieces = block_forward_time(block, MK2, w, budget=MK2.memory_bytes, calibration=CALIBRATION)
    expected = mm.flops / (MK2.fp16_flops * CALIBRATION.matmul_efficiency) + 4 * PER_OP
    assert pieces == 1 and seconds == pytest.approx(expected)
    squeezed, pieces = block_forward_time(block, MK2, w, budget=1_000_000, calibration=CALIBRATION)
    assert pieces > 1 and squeezed == pytest.approx(expected + (pieces - 1) * PER_OP)
    fp32, _ = block_forward_time(
        block, MK2, workload(ipus_per_replica=1, fp32=True), MK2.memory_bytes, CALIBRATION
    )
    assert fp32 - 4 * PER_OP == pytest.approx(4 * (seconds - 4 * PER_OP))  # a quarter of the fp16 peak


def _estimate(profile=None, layers=(2, 2), hardware=MK2, **changes):
    profile = profile or synthetic(sum(layers))
    w = workload(ipus_per_replica=len(layers), **changes)
    return estimate_performance(profile, profile.placement(list(layers), len(layers)), w, hardware)


def test_more_gradient_accumulation_means_higher_pipeline_efficiency():
    reports = [_estimate(gradient_accumulation_steps=ga) for ga in (4, 8, 32, 128)]
    assert [r.pipeline_efficiency for r in reports] == [ga / (ga + 2) for ga in (4, 8, 32, 128)]
    speeds = [r.samples_per_second for r in reports]
    assert speeds == sorted(speeds)
    assert all(len(r.cycles) == ga + 2 for r, ga in zip(reports, (4, 8, 32, 128)))


def test_call_time_adds_host_overhead_once_per_device_iterations():
    one, four = _estimate(), _estimate(device_iterations=4)
    assert four.call_time == pytest.approx(4 * one.update_time + four.host_time)
    assert four.host_time - ASSUMPTIONS.host_call_overhead_s == pytest.approx(
        4 * (one.host_time - ASSUMPTIONS.host_call_overhead_s)
    )
    assert four.samples_per_second > one.samples_per_second


def test_update_time_is_cycles_plus_all_reduce_plus_optimizer():
    alone, replicated = _estimate(), _estimate(replication_factor=4)
    assert alone.allreduce_time == 0 < replicated.allreduce_time
    assert replicated.update_time == pytest.approx(
        sum(replicated.cycles) + replicated.allreduce_time + replicated.optimizer_time
    )
    assert 3.5 < replicated.samples_per_second / alone.samples_per_second <= 4


def test_bow_computes_faster_by_its_clock_but_host_costs_stay():
    mk2, bow = _estimate(), _estimate(hardware=BOW)
    for a, b in zip(mk2.stages, bow.stages):
        assert 1.85 / 1.33 - 0.01 < a.busy / b.busy < 1.41  # clock ratio (the fp16 peak ratio is 1.4)
    assert bow.host_time == mk2.host_time
    assert 1 < bow.samples_per_second / mk2.samples_per_second < 1.41


def test_stages_recompute_except_the_last_unless_every_layer_is_a_checkpoint():
    plain = _estimate(layers=(1, 1, 2))
    assert [s.recompute > 0 for s in plain.stages] == [True, True, False]
    assert plain.stages[2].backward == pytest.approx(2 * plain.stages[2].forward)
    checkpointed = _estimate(layers=(1, 1, 2), recompute_checkpoint_every_layer=True)
    assert all(s.recompute == s.forward for s in checkpointed.stages)
    assert checkpointed.bottleneck_ipu == 2


def test_inference_is_sharded():
    report = _estimate(training=False)
    assert report.pipeline_efficiency == 0.5
    assert report.update_time == pytest.approx(sum(s.forward for s in report.stages) + report.copy_time)
    assert all(s.backward == s.recompute == 0 for s in report.stages)


def test_timeline_has_every_micro_batch_forward_and_backward_on_every_ipu():
    report = _estimate(layers=(1, 1, 2), gradient_accumulation_steps=6)
    segments = report.timeline()
    assert len(segments) == 2 * 6 * 3
    last = [s for s in segments if s["ipu"] == 2]
    forward = {s["micro_batch"]: s["start"] for s in last if s["kind"] == "forward"}
    backward = {s["micro_batch"]: s["start"] for s in last if s["kind"] == "backward"}
    assert all(backward[m] == pytest.approx(forward[m] + report.stages[2].forward) for m in range(6))


def test_calibration_reproduces_published_measurements_within_15_percent():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    for point in calibration.POINTS:
        estimated = calibration.estimate(calibration.prepare(point), CALIBRATION)
        assert abs(estimated / point.measured - 1) < 0.15, (point.name, estimated, point.measured)
