"""Inference that keeps the IPUs busy: the pipeline's fill and drain per host call, the output stream by
output mode, the host's work overlapped by asynchronous loading, latency beside throughput, the regime.

Every expected number below is worked by hand from the rule the docstring states, not by calling the
rule again.
"""

from __future__ import annotations

import dataclasses

import pytest
from fixtures import synthetic, workload

from optimum_ipu.costmodel import HARDWARE
from optimum_ipu.costmodel.hardware import CALIBRATION
from optimum_ipu.costmodel.performance import StageTime, call_timing, estimate_performance, inference_cycles
from optimum_ipu.costmodel.scaleout import host_io_time

MK2 = HARDWARE["mk2"]
MS = 1e-3


def test_a_pipelined_call_fills_and_drains_once_not_once_per_micro_batch():
    # Three stages of 2, 3 and 1 ms, a 0.5 ms copy closing every cycle, 4 device iterations.
    # Cycle c runs micro-batch c - k on stage k: c0 stage 0 (2 + .5), c1 stages 0-1 (3 + .5),
    # c2 and c3 all three (3 + .5), c4 stages 1-2 (3 + .5), c5 stage 2 (1 + .5) = 18 ms.
    stages = [StageTime(0, forward=2 * MS), StageTime(1, forward=3 * MS), StageTime(2, forward=1 * MS)]
    cycles = inference_cycles(stages, 4, 0.5 * MS, pipelined=True)
    assert [round(c / MS, 9) for c in cycles] == [2.5, 3.5, 3.5, 3.5, 3.5, 1.5]
    assert sum(cycles) == pytest.approx(18 * MS)
    # Four more micro-batches in the same call add four steady cycles (4 x 3.5 ms), no second fill/drain.
    assert sum(inference_cycles(stages, 8, 0.5 * MS, pipelined=True)) == pytest.approx(32 * MS)
    # Sharded, each micro-batch walks the stages alone: 4 x (2.5 + 3.5 + 1) = 28 ms.
    assert sum(inference_cycles(stages, 4, 0.5 * MS, pipelined=False)) == pytest.approx(28 * MS)


def test_latency_throughput_and_regime_of_one_call():
    # IPUs 20 ms, host links 3 ms, host's own work 8 ms.
    period, latency, regime = call_timing(20 * MS, 3 * MS, 8 * MS, overlapped=False)
    assert (period, latency, regime) == (pytest.approx(31 * MS), pytest.approx(31 * MS), "IPU-bound")
    # Asynchronous loading hides the host's 8 ms behind the IPUs' 20: 3 + 20 between calls; one batch
    # still waits for all three parts.
    period, latency, regime = call_timing(20 * MS, 3 * MS, 8 * MS, overlapped=True)
    assert (period, latency, regime) == (pytest.approx(23 * MS), pytest.approx(31 * MS), "IPU-bound")
    # IPUs 5 ms against 3 + 8 ms of host: host-bound; overlapped, the host's 8 ms set the pace: 3 + 8.
    period, latency, regime = call_timing(5 * MS, 3 * MS, 8 * MS, overlapped=True)
    assert (period, latency, regime) == (pytest.approx(11 * MS), pytest.approx(16 * MS), "host-bound")


def _with_logits(profile, nbytes: int):
    blocks = [dataclasses.replace(b, output_bytes=nbytes) if b.name == "Head" else b for b in profile.blocks]
    return dataclasses.replace(profile, blocks=blocks)


def test_the_output_stream_follows_the_output_mode():
    profile = _with_logits(synthetic(4), 2_000_000)  # 2 MB of outputs per micro-batch
    placement = profile.placement([2, 2], 2)
    inputs = profile.input_bytes * 8
    for mode, returned in (("all", 8), ("final", 1), ("sum", 1), ("everyn", 2)):
        w = workload(
            training=False, ipus_per_replica=2, device_iterations=8, output_mode=mode, output_period=4
        )
        report = estimate_performance(profile, placement, w, MK2)
        outputs = 2_000_000 * returned  # All: 8 micro-batches; Final, Sum: 1; EveryN(4) of 8: 2
        expected = (
            CALIBRATION.host_call_overhead_s
            + host_io_time(inputs, outputs, w, MK2)
            + (inputs + outputs) / CALIBRATION.host_copy_bandwidth
        )
        assert report.host_time == pytest.approx(expected), mode


def test_report_gives_latency_and_regime_and_overlap_raises_throughput():
    profile = synthetic(4)
    placement = profile.placement([2, 2], 2)
    small = workload(training=False, ipus_per_replica=2, device_iterations=1, micro_batch_size=1)
    report = estimate_performance(profile, placement, small, MK2)
    assert report.latency == pytest.approx(report.device_time + report.host_time)
    assert report.samples_per_second == pytest.approx(report.samples_per_call / report.latency)
    assert report.regime == "host-bound"  # one tiny micro-batch: the 8.4 ms per call dominates
    busy = workload(
        training=False,
        ipus_per_replica=2,
        device_iterations=64,
        micro_batch_size=64,
        pipelined_inference=True,
    )
    sync = estimate_performance(profile, placement, busy, MK2)
    overlapped = estimate_performance(profile, placement, busy.replace(async_data_loading=True), MK2)
    assert sync.regime == overlapped.regime == "IPU-bound"
    assert overlapped.latency == pytest.approx(sync.latency)  # one batch still waits for everything
    # Loading the next call's data while the IPUs run hides the host's fixed cost per call, not its copies of
    # this call's inputs into the stream buffers: the stream callbacks run inside the call, which waits for them.
    assert overlapped.call_time == pytest.approx(sync.call_time - CALIBRATION.host_call_overhead_s)
    assert overlapped.samples_per_second > sync.samples_per_second


def test_bad_output_mode_names_the_choices():
    with pytest.raises(ValueError, match="output_mode='every'.*all, final, sum, everyn"):
        workload(training=False, output_mode="every")
    with pytest.raises(ValueError, match="output_period=0"):
        workload(training=False, output_mode="everyn", output_period=0)
