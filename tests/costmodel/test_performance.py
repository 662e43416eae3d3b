"""Stage times, the pipeline schedule and throughput: hand-computed cases, monotonic behaviour, calibration."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
from fixtures import synthetic, workload

from optimum_ipu.costmodel import HARDWARE
from optimum_ipu.costmodel.hardware import CALIBRATION, HOST_NIC_BANDWIDTH
from optimum_ipu.costmodel.memory import estimate_memory, pipeline_stages
from optimum_ipu.costmodel.performance import (
    StageTime,
    block_forward_time,
    estimate_performance,
    inference_cycles,
    pipeline_cycles,
)
from optimum_ipu.costmodel.profile import BlockProfile, Matmul
from optimum_ipu.costmodel.scaleout import host_io_time

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


def _tied_head(layers: int = 4):
    """`synthetic` with its head tied to the embedding (on IPU 0, after the last layer) and doing work."""
    profile = synthetic(layers)
    head = dataclasses.replace(
        profile.blocks[-1], on_first_ipu=True, matmuls=[Matmul(1, 128, 256, 1024)], output_bytes=4
    )
    return dataclasses.replace(profile, blocks=profile.blocks[:-1] + [head])


def test_a_tied_head_is_one_pipeline_stage_more_than_ipus_on_ipu_0():
    """PopTorch makes the head that comes back to IPU 0 its own, last, stage: S = N + 1 stages."""
    profile = _tied_head()
    placement = profile.placement([2, 2], 2)
    assert placement["Head"] == 0
    stages = pipeline_stages(profile, placement, 2)
    assert [(ipu, [b.name for b in blocks]) for ipu, blocks in stages] == [
        (0, ["Embedding", "Layer 0", "Layer 1"]), (1, ["Layer 2", "Layer 3"]), (0, ["Head"])
    ]  # fmt: skip
    untied = synthetic(4)
    assert len(pipeline_stages(untied, untied.placement([2, 2], 2), 2)) == 2
    assert len(pipeline_stages(profile, profile.placement([4], 1), 1)) == 1  # one IPU: one stage
    # A second, untied head after the tied one runs on the last IPU in a stage of its own.
    second = dataclasses.replace(synthetic(4).blocks[-1], name="Choice")
    double = dataclasses.replace(profile, blocks=profile.blocks + [second])
    stages = pipeline_stages(double, double.placement([2, 2], 2), 2)
    assert [(ipu, [b.name for b in blocks]) for ipu, blocks in stages][2:] == [(0, ["Head"]), (1, ["Choice"])]


def test_pipeline_cycles_with_a_stage_coming_back_to_the_first_ipu():
    """GA + 2S - 2 cycles; in each, the stages sharing IPU 0 add up, and the cycle lasts as long as the
    busiest IPU (checked by hand and against a brute force)."""
    stages = [
        StageTime(0, forward=1, backward=2, recompute=1),
        StageTime(1, forward=2, backward=4, recompute=2),
        StageTime(0, forward=0.5, backward=1),  # the head: last stage, no recompute
    ]
    # c=0: fwd mb0 on stage 0 (1); c=1: stage 1 fwd (2); c=2: stage 2 fwd+bwd mb0 (1.5) + stage 0 fwd mb2 (1)
    # on IPU 0 = 2.5, stage 1 fwd mb1 (2) -> 2.5; c=3: IPU0 = stage 0 fwd mb3 (1) + head mb1 (1.5); IPU1 =
    # stage 1 fwd mb2 (2) + bwd mb0 (6) = 8 ...
    cycles = pipeline_cycles(stages, 4, 0.0)
    assert len(cycles) == 4 + 2 * 3 - 2
    assert cycles[:4] == [1.0, 2.0, 2.5, 8.0]

    def brute(c):
        work = {}
        for k, s in enumerate(stages):
            w = s.forward if 0 <= c - k < 40 else 0.0
            w += s.recompute + s.backward if 0 <= c - (2 * 3 - 2 - k) < 40 else 0.0
            work[s.ipu] = work.get(s.ipu, 0.0) + w
        return max(work.values()) + 0.1

    assert pipeline_cycles(stages, 40, 0.1) == pytest.approx([brute(c) for c in range(40 + 4)])
    assert max(pipeline_cycles(stages, 40, 0.0)) == 8.0  # steady: IPU 1's 8 against IPU 0's 4 + 1.5


def test_a_tied_head_lengthens_fill_and_drain_and_makes_the_last_ipu_recompute():
    profile = _tied_head()
    placement = profile.placement([2, 2], 2)
    report = estimate_performance(profile, placement, workload(gradient_accumulation_steps=8), MK2)
    assert len(report.stages) == 3 and len(report.cycles) == 8 + 2 * 3 - 2
    assert report.micro_batches == 8 and report.pipeline_efficiency == pytest.approx(8 / 12)
    embedding, last_ipu, head = report.stages
    assert last_ipu.forward > 0 and last_ipu.recompute == pytest.approx(last_ipu.forward)  # not last any more
    assert head.recompute == 0 and embedding.recompute > 0
    assert [s.ipu for s in report.ipu_stages] == [0, 1]
    assert report.ipu_stages[0].forward == pytest.approx(embedding.forward + head.forward)
    segments = [s for s in report.timeline() if s["ipu"] == 0]
    spans = sorted((s["start"], s["start"] + s["duration"]) for s in segments)
    assert all(
        a_end <= b_start + 1e-15 for (_, a_end), (b_start, _) in zip(spans, spans[1:])
    )  # one at a time
    w = workload(training=False, device_iterations=6, pipelined_inference=True)
    inference = estimate_performance(profile, placement, w, MK2)
    assert len(inference.cycles) == 6 + 3 - 1 and inference.micro_batches == 6


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
    need = 3 * (1024**3) ** (2 / 3) * 1472 ** (1 / 3) * 2  # bytes, the 3-D partition by hand
    reexchange = need * (pieces ** (1 / 3) - 1) / MK2.exchange_bandwidth
    assert pieces > 1 and squeezed == pytest.approx(expected + (pieces - 1) * PER_OP + reexchange)
    fp32, _ = block_forward_time(
        block, MK2, workload(ipus_per_replica=1, fp32=True), MK2.memory_bytes, CALIBRATION
    )
    assert fp32 - 4 * PER_OP == pytest.approx(4 * (seconds - 4 * PER_OP))  # a quarter of the fp16 peak


def test_backward_is_two_matmuls_per_matmul_and_gradient_accumulation_costs_an_operation_per_weight():
    from optimum_ipu.costmodel.hardware import ASSUMPTIONS
    from optimum_ipu.costmodel.performance import stage_time

    only_matmul = BlockProfile("m", "layer", ("m",), matmuls=[Matmul(1, 512, 1024, 1024)])
    only_other = BlockProfile("o", "layer", ("o",), other_ops=7, other_bytes=10**8)
    single = workload(ipus_per_replica=1, gradient_accumulation_steps=1)
    for block, ratio in ((only_matmul, 2.0), (only_other, ASSUMPTIONS.backward_other_ratio)):
        stage = stage_time(0, [block], single, MK2)
        assert stage.backward == pytest.approx(ratio * stage.forward)
    weights = dataclasses.replace(only_matmul, trainable_parameters=10**6, trainable_tensors=16)
    no_accumulation = stage_time(0, [weights], single, MK2)
    accumulating = stage_time(0, [weights], workload(ipus_per_replica=1, gradient_accumulation_steps=8), MK2)
    assert accumulating.forward == no_accumulation.forward
    extra = accumulating.backward - no_accumulation.backward
    assert extra == pytest.approx(16 * PER_OP + 10**6 * (2 + 8) / MK2.memory_bandwidth)


def test_a_higher_matmul_proportion_is_faster_until_memory_runs_out():
    # A matmul whose full-speed working memory (~2.6 GB) exceeds the IPU: Poplar must serialize it,
    # into fewer pieces the more memory it may use, until the temporaries crowd out everything else.
    profile = synthetic(2)
    big = Matmul(1, 8192, 8192, 8192)
    profile.blocks = [
        dataclasses.replace(b, matmuls=[big]) if b.kind == "layer" else b for b in profile.blocks
    ]
    speeds, fits = [], []
    for proportion in (0.005, 0.01, 0.02, 0.05, 0.1, 0.3, 0.6, 0.9):
        w = workload(ipus_per_replica=1, matmul_proportion=(proportion,))
        placement = profile.placement([2], 1)
        speeds.append(estimate_performance(profile, placement, w, MK2).samples_per_second)
        fits.append(estimate_memory(profile, placement, w, MK2).fits)
    assert speeds == sorted(speeds) and len(set(speeds)) == len(speeds)
    assert fits[0] and not fits[-1]  # past some proportion the temporaries no longer fit


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


def test_an_accumulation_too_short_to_fill_the_pipeline_is_noted():
    """A real compile refuses GA < 2S−1 (PopART); the estimate still prices it, and says so."""
    assert not _estimate(gradient_accumulation_steps=3).notes
    short = _estimate(gradient_accumulation_steps=4, profile=_tied_head())
    assert any("2S−1 = 5 pipeline stages" in note for note in short.notes), short.notes
    assert not _estimate(gradient_accumulation_steps=5, profile=_tied_head()).notes


def test_call_time_adds_host_overhead_once_per_call():
    one, four = _estimate(), _estimate(device_iterations=4)
    assert four.call_time == pytest.approx(4 * one.update_time + four.host_time)
    overhead = CALIBRATION.host_call_overhead_s
    assert four.host_time - overhead == pytest.approx(4 * (one.host_time - overhead))  # inputs x4
    assert four.samples_per_second > one.samples_per_second


def test_host_io_runs_each_direction_at_its_published_rate_and_shares_the_host_nic():
    """Inputs go in at 3.3 GB/s per IPU and outputs out at 2.9 GB/s (gc-hosttraffictest); one host's
    replicas share its 12.5 GB/s NIC, so beyond ~4 replicas per host the NIC bounds a call."""
    mb = 1e6
    one = workload(training=False, ipus_per_replica=1, replication_factor=1)
    assert host_io_time(mb, 0, one, MK2) == pytest.approx(mb / (26.41e9 / 8))
    assert host_io_time(0, mb, one, MK2) == pytest.approx(mb / (23.46e9 / 8))
    assert host_io_time(0, mb, one, MK2) > host_io_time(mb, 0, one, MK2)  # out is the slower way
    two, sixteen = (workload(training=False, ipus_per_replica=1, replication_factor=r) for r in (2, 16))
    assert host_io_time(mb, mb, two, MK2) == pytest.approx(host_io_time(mb, mb, one, MK2))  # links
    assert host_io_time(mb, mb, sixteen, MK2) == pytest.approx(16 * 2 * mb / HOST_NIC_BANDWIDTH)  # NIC


def test_the_host_writes_every_calls_outputs_into_new_tensors_at_the_fitted_rate():
    """PopTorch returns each call's outputs in tensors it allocates for that call, and the host writes
    every byte into them after the links carried it: one process (here one a host) writes the outputs of all
    its replicas."""
    profile = synthetic(4)
    blocks = [
        dataclasses.replace(b, output_bytes=2_000_000) if b.name == "Head" else b for b in profile.blocks
    ]
    profile = dataclasses.replace(profile, blocks=blocks)  # logits of 2 MB per micro-batch
    assert profile.output_bytes == 2_000_000
    placement = profile.placement([2, 2], 2)
    for replicas in (1, 4, 16):
        w = workload(training=False, ipus_per_replica=2, replication_factor=replicas, device_iterations=4)
        inputs, outputs = profile.input_bytes * 4, profile.output_bytes * 4
        report = estimate_performance(profile, placement, w, MK2)
        links = host_io_time(inputs, outputs, w, MK2)
        copied = min(replicas, 16 // 2) * (inputs + outputs) / CALIBRATION.host_copy_bandwidth  # 8 a host
        assert report.host_time == pytest.approx(CALIBRATION.host_call_overhead_s + links + copied)
        slower = dataclasses.replace(CALIBRATION, host_copy_bandwidth=CALIBRATION.host_copy_bandwidth / 2)
        assert estimate_performance(profile, placement, w, MK2, slower).host_time == pytest.approx(
            report.host_time + copied
        )


def test_the_host_copies_every_calls_inputs_into_the_stream_buffers_at_the_same_rate():
    """PopART's input stream callbacks copy each micro-batch's input from the tensor the program passed
    into Poplar's stream buffer (`InputDatastream::read` and `readPrefetch`, a `memcpy` each), as the output
    callbacks copy out: a training call streaming images pays that copy for all of one host's replicas
    (training returns only the loss, so inputs are all it copies)."""
    profile = dataclasses.replace(synthetic(4), input_bytes=150_528)  # one 224 x 224 x 3 image in bytes
    placement = profile.placement([2, 2], 2)
    for replicas in (1, 4, 16):
        w = workload(ipus_per_replica=2, replication_factor=replicas)
        inputs = profile.input_bytes * w.gradient_accumulation_steps * w.device_iterations
        trained = estimate_performance(profile, placement, w, MK2)
        copied = min(replicas, 16 // 2) * inputs / CALIBRATION.host_copy_bandwidth  # 8 replicas per host
        assert trained.host_time == pytest.approx(
            CALIBRATION.host_call_overhead_s + host_io_time(inputs, 0, w, MK2) + copied
        )


def test_each_host_process_copies_its_own_replicas_inputs_at_once_with_the_others():
    """Every process (`poprun --num-instances`) runs its own Poplar stream callbacks: the copies of one
    process's replicas follow one another, different processes copy at the same time. 16 replicas of 4
    IPUs on a Pod64 (4 a host) as 8 processes copy 2 replicas' inputs one after another, not 4."""
    profile = dataclasses.replace(synthetic(4), input_bytes=150_528)
    placement = profile.placement([1, 1, 1, 1], 4)
    w = workload(ipus_per_replica=4, replication_factor=16, gradient_accumulation_steps=16)
    inputs = profile.input_bytes * 16
    one, eight = (
        estimate_performance(profile, placement, w.replace(processes=k), MK2).host_time for k in (1, 8)
    )
    assert one - eight == pytest.approx((4 - 2) * inputs / CALIBRATION.host_copy_bandwidth)
    sixteen = estimate_performance(profile, placement, w.replace(processes=16), MK2).host_time
    assert eight - sixteen == pytest.approx((2 - 1) * inputs / CALIBRATION.host_copy_bandwidth)
    with pytest.raises(ValueError, match="processes=17: give between 1 and the 16 replicas"):
        w.replace(processes=17)


@pytest.mark.parametrize("layers", [(1,), (2, 2), (1, 1, 1, 1)])
def test_more_device_iterations_mean_less_host_time_per_sample_in_inference(layers):
    reports = [_estimate(layers=layers, training=False, device_iterations=di) for di in (1, 2, 4, 8, 16)]
    per_sample = [r.host_time / r.samples_per_call for r in reports]
    assert per_sample == sorted(per_sample, reverse=True) and len(set(per_sample)) == len(per_sample)
    speeds = [r.samples_per_second for r in reports]
    assert speeds == sorted(speeds)


def test_inference_is_sharded_unless_pipelined_execution_is_asked_for():
    stages = [StageTime(0, forward=1.0), StageTime(1, forward=3.0), StageTime(2, forward=2.0)]
    # DI + N - 1 cycles: fill and drain as long as the stages running in them, the rest the slowest + copy
    assert inference_cycles(stages, 5, 0.5) == [1.5, 3.5, 3.5, 3.5, 3.5, 3.5, 2.5]
    assert inference_cycles(stages, 2, 0.5) == [1.5, 3.5, 2.0] * 2  # DI < N: one IPU at a time
    assert inference_cycles(stages, 5, 0.5, pipelined=False) == [1.5, 3.5, 2.0] * 5
    sharded = _estimate(layers=(1, 1, 1, 1), training=False, device_iterations=8)
    pipelined = _estimate(layers=(1, 1, 1, 1), training=False, device_iterations=8, pipelined_inference=True)
    assert not sharded.pipelined and sharded.pipeline_efficiency == pytest.approx(1 / 4)
    assert pipelined.pipelined and pipelined.pipeline_efficiency == pytest.approx(8 / 11)
    # The device time of a call (the host overhead, a fitted constant, is the same for both).
    assert sum(sharded.cycles) > 1.5 * sum(pipelined.cycles)
    assert pipelined.samples_per_second > sharded.samples_per_second
    for report in (sharded, pipelined):
        segments = report.timeline()
        assert len(segments) == 8 * 4
        assert {(s["ipu"], s["micro_batch"]) for s in segments} == {
            (k, m) for k in range(4) for m in range(8)
        }


def test_replicas_across_pods_lower_the_efficiency_per_ipu():
    # 4-IPU pipelines: 16 replicas fill one POD64; 32 and 64 span 2 and 4 PODs over GW-Links.
    per_ipu = []
    for replicas in (1, 4, 16, 32, 64):
        report = _estimate(layers=(2, 2, 2, 2), replication_factor=replicas)
        per_ipu.append(report.samples_per_second / (4 * replicas))
    assert per_ipu == sorted(per_ipu, reverse=True) and len(set(per_ipu)) == len(per_ipu)
    one_pod, two_pods = (
        _estimate(layers=(2, 2, 2, 2), replication_factor=16),
        _estimate(layers=(2, 2, 2, 2), replication_factor=32),
    )
    # Crossing PODs adds the GW-Link all-reduce of each IPU's shard on top of the IPU-Link rings.
    assert two_pods.allreduce_time > one_pod.allreduce_time


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
    checkpointed = _estimate(layers=(1, 1, 2), recompute_checkpoint_every_layer=True)
    assert all(s.recompute == s.forward for s in checkpointed.stages)
    assert checkpointed.bottleneck_ipu == 2


def test_inference_with_fewer_device_iterations_than_ipus_is_sharded():
    report = _estimate(training=False)
    assert report.pipeline_efficiency == 0.5 and not report.pipelined
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


def test_leave_one_out_error_is_recomputed_from_the_published_points():
    """Refit without each published point and predict it; the README reports these figures."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    pairs = [(point, calibration.prepare(point)) for point in calibration.POINTS]
    assert len(pairs) >= 6
    assert {p.training for p, _ in pairs} == {True, False}
    assert (
        len({p.ipu_config.get("replication_factor", 1) * p.ipu_config["ipus_per_replica"] for p, _ in pairs})
        >= 2
    )
    held_out = calibration.leave_one_out(pairs)
    errors = {point.name: abs(estimate / point.measured - 1) for point, estimate, _ in held_out}
    training = [errors[p.name] for p, _ in pairs if p.training]
    inference = [errors[p.name] for p, _ in pairs if not p.training]
    # The figures docs/planning.md reports: over all nineteen points mean 8.9 %, max 17.9 % (targets 15 %
    # and 30 %); over the ten training points mean 7.5 %, max 13.0 % (targets 8 % and 20 %); over the nine
    # inference points mean 10.5 %, max 17.9 % (targets 12 % and 20 %). Bounds a little above them, so a
    # model change that makes cross-validation worse fails here.
    assert sum(errors.values()) / len(errors) <= 0.092 and max(errors.values()) < 0.185, errors
    assert sum(training) / len(training) <= 0.078 and max(training) < 0.135, errors
    assert sum(inference) / len(inference) <= 0.108 and max(inference) < 0.185, errors
    # Where the IPUs bound the call (96 and 2,048 samples per call), leave-one-out within 10 %.
    busy = [p.name for p, _ in pairs if not p.training and not p.evaluate_calls]
    assert len(busy) >= 2 and all(errors[name] < 0.10 for name in busy), errors
    residuals = []
    for point, prepared in pairs:
        estimated = calibration.estimate(prepared, CALIBRATION)
        bound = 0.15 if point.training else 0.10  # ViT on a Bow Pod64 +11.6 %, GPT-2's evaluation +8.5 %
        assert abs(estimated / point.measured - 1) < bound, (point.name, estimated, point.measured)
        residuals.append(math.log(estimated / point.measured))
    # The prior's weight is the fit's own residual scatter (points less fitted constants), not a free choice.
    scatter = math.sqrt(sum(r * r for r in residuals) / (len(pairs) - len(calibration._RANGES)))
    assert scatter == pytest.approx(calibration.POINT_SCATTER, rel=0.25)


def test_the_recorded_constants_are_the_fit_of_the_published_points():
    """`hardware.CALIBRATION` and the bench's `HOST_CPU_RATIO` are copied by hand from `--fit`: both must
    be what fitting every published point gives now (to their rounding), or a refit was left half done."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    fitted = calibration.fit([(point, calibration.prepare(point)) for point in calibration.POINTS])
    recorded = calibration.with_host_ratio(CALIBRATION)
    assert recorded.host_cpu_ratio == calibration.HOST_CPU_RATIO
    for name, value in dataclasses.asdict(recorded).items():
        assert getattr(fitted, name) == pytest.approx(value, rel=0.005), name


def test_the_vit_training_rows_are_estimated_as_docs_planning_reports():
    """Graphcore's ViT rows on ImageNet, priced as their commands ran them: pretraining images as bytes
    (`--byteio true`), the Pod64 run as 8 processes of 2 replicas (`poprun --num-instances=8`), every run
    loading asynchronously. docs/planning.md reports them -0.3 % (Pod64, pre-SDK 2.5), -4.8 % (Pod16),
    +11.6 % (Pod64, SDK 3.0) and -2.8 % (fine-tuning, fp16 images)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    reported = {"Bow Pod64": -0.003, "Bow Pod16, SDK 3.0": -0.048, "Bow Pod64, SDK 3.0": 0.116,
                "fine-tuning ImageNet-1k, Bow Pod16, SDK 3.0": -0.028}  # fmt: skip
    points = {p.name.split("ImageNet-1k, ")[-1] if "pretraining" in p.name else p.name.split("/16 ")[1]: p
              for p in calibration.POINTS if "ImageNet-1k" in p.name}  # fmt: skip
    assert sorted(points) == sorted(reported)
    for key, error in reported.items():
        point = points[key]
        assert point.byte_images == ("pretraining" in point.name) and point.async_loading
        assert point.processes == (8 if "Pod64" in key else 1)
        estimated = calibration.estimate(calibration.prepare(point), CALIBRATION)
        assert estimated / point.measured - 1 == pytest.approx(error, abs=0.005), point.name


def test_the_held_out_image_training_run_needs_the_hosts_copy_of_its_inputs():
    """OpenMMLab's ViT-B/16 fine-tuning (16 IPUs, 4 replicas on one host, fp16 images), held out before its
    estimate was computed: docs/planning.md reports it +5.7 % with the host's copy of a call's inputs and
    +38.0 % without it (the copy's rate made free, the constants kept)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    point = next(p for p in calibration.HELD_OUT if "OpenMMLab" in p.name)
    prepared = calibration.prepare(point)
    assert calibration.estimate(prepared, CALIBRATION) / point.measured - 1 == pytest.approx(0.057, abs=0.005)
    free = dataclasses.replace(CALIBRATION, host_copy_bandwidth=1e15)
    assert calibration.estimate(prepared, free) / point.measured - 1 == pytest.approx(0.380, abs=0.005)


def test_the_held_out_training_run_is_estimated_within_its_reported_error():
    """Graphcore's BERT-Large SQuAD tutorial run (8 IPUs x 2 replicas, Mk2), never fitted: docs/planning.md
    reports it -0.4 % off (+0.2 % before the host's copies of a call's inputs and the ViT table rows, 0.5 %
    before the notebooks' host work was measured with their own software, 0.3 % before the packed BERT
    evaluation joined the fit, 1.1 % before the IPU-bound inference points)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    point = next(p for p in calibration.HELD_OUT if p.training and "8 IPUs x 2 replicas" in p.name)
    estimated = calibration.estimate(calibration.prepare(point), CALIBRATION)
    assert abs(estimated / point.measured - 1) < 0.02, (point.name, estimated, point.measured)


def test_the_held_out_bow_mlperf_runs_are_estimated_as_docs_planning_reports():
    """MLPerf v2.0's BERT-Large on a Bow Pod64 and a Bow Pod128 (200,000 sequences per median block of the
    published logs, 28.067 s and 15.788 s, 2 per pack), never fitted: docs/planning.md reports the estimates
    7.1 % and 15.8 % too fast, where the same application's fitted Mk2 runs of v1.1 on a POD64 and a POD128
    are 8.3 % and 1.1 % too slow."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    reported = {"Bow Pod64": (3563, 0.071), "Bow Pod128": (6334, 0.158)}
    points = [p for p in calibration.HELD_OUT if "v2.0" in p.name]
    assert sorted(p.name.rsplit(", ", 1)[1] for p in points) == sorted(reported)
    for point in points:
        measured, error = reported[point.name.rsplit(", ", 1)[1]]
        assert point.hardware == "bow" and point.measured == pytest.approx(measured, abs=1)
        estimated = calibration.estimate(calibration.prepare(point), CALIBRATION)
        assert estimated / point.measured - 1 == pytest.approx(error, abs=0.005), point.name


def test_the_published_call_latencies_are_compared_as_docs_planning_reports():
    """The text-embeddings notebook prints each call's latency beside its throughput (2,048 sentences a
    call); docs/planning.md compares the latency `plan --inference` prints with it: +9.2 % (E5-large,
    fitted), -39.8 % and +18.8 % (MPNet-base at sequence 514 and 512, held out), +13.0 % (Sentence-T5-base,
    held out)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    reported = {"E5-large": 0.092, "MPNet-base (all-mpnet-base-v2) embeddings seq 514": -0.398,
                "MPNet-base (all-mpnet-base-v2) embeddings seq 512": 0.188, "Sentence-T5": 0.130}  # fmt: skip
    points = [p for p in calibration.POINTS + calibration.HELD_OUT if p.latency_s]
    assert sorted(next(k for k in reported if k in p.name) for p in points) == sorted(reported)
    for point in points:
        # The two published figures agree: the throughput is the call's 2,048 sentences over its latency.
        assert point.latency_s * point.measured == pytest.approx(2048, rel=1e-4), point.name
        error = next(e for key, e in reported.items() if key in point.name)
        planned = calibration.performance(calibration.prepare(point), CALIBRATION).latency
        assert planned / point.latency_s - 1 == pytest.approx(error, abs=0.005), point.name


def test_the_held_out_embedding_calls_are_estimated_as_docs_planning_reports():
    """The text-embeddings notebook's calls never fitted: docs/planning.md reports MPNet-base at sequence 514
    and 512 +66.0 % and -15.8 %, Sentence-T5-base (T5's encoder alone, built as T5EncoderModel, returning one
    pooled vector a sentence as the notebook's model does) -11.5 %."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    reported = {"Sentence-T5": -0.115, "MPNet-base (all-mpnet-base-v2) embeddings seq 514": 0.660,
                "MPNet-base (all-mpnet-base-v2) embeddings seq 512": -0.158}  # fmt: skip
    points = [p for p in calibration.HELD_OUT if not p.training]
    assert sorted(next(k for k in reported if k in p.name) for p in points) == sorted(reported)
    for point in points:
        error = next(e for key, e in reported.items() if key in point.name)
        estimated = calibration.estimate(calibration.prepare(point), CALIBRATION)
        assert estimated / point.measured - 1 == pytest.approx(error, abs=0.005), point.name


def test_a_constant_no_point_informs_is_fitted_to_the_middle_of_its_measured_span():
    """`host_copy_bandwidth` matters only to an evaluation returning a language model's logits and to
    training that streams images. Fitted without such points, it must land where its prior, the span
    `bench/host_work.py` measured, puts it (the geometric middle), not at whichever end a 0.1 % effect on
    the other points pushes it to."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    lo, hi = calibration.PRIORS["host_copy_bandwidth"]
    small_copies = [
        p for p in calibration.POINTS if "MLM" not in p.name and not (p.training and "image_size" in p.inputs)
    ]
    fitted = calibration.fit([(p, calibration.prepare(p)) for p in small_copies])
    assert math.log(fitted.host_copy_bandwidth / math.sqrt(lo * hi)) == pytest.approx(0, abs=0.05)


def test_an_evaluation_is_estimated_over_the_samples_its_run_counted():
    """Optimum Graphcore 0.3.0 divided `eval_runtime` into the data set's length, samples the dropped last
    batch never ran included (CoLA: 1,043 over 52 calls of 20); the estimate divides the same count."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    cola = next(p for p in calibration.POINTS if "CoLA" in p.name)
    assert cola.reported_samples == 1043
    counted = calibration.estimate(calibration.prepare(cola), CALIBRATION)
    run = calibration.estimate(
        calibration.prepare(dataclasses.replace(cola, reported_samples=None)), CALIBRATION
    )
    assert counted / run == pytest.approx(1043 / (52 * 20))


def test_the_packed_bert_evaluation_carries_its_data_loading_and_the_notebooks_call():
    """The packed BERT notebook's evaluation: 1,024 packs of 256 tokens a call (8 x 32 device iterations x 4
    replicas of one IPU), 9 calls, and the host's building of each batch and of the one the loop draws to
    check compilation (synchronous loading) as the
    measured `host_work_s`; without that work the estimate is +53 % (+49 % with the constants before it joined
    the fit), as docs/planning.md reports."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    packed = next(p for p in calibration.POINTS if "Packed BERT" in p.name)
    prepared = calibration.prepare(packed)
    assert calibration.performance(prepared, CALIBRATION).samples_per_call == 1024
    assert packed.evaluate_calls * 1024 == pytest.approx(packed.measured * 5.0264, abs=1)
    assert 0.5 < packed.host_work_s < 3.0
    without = calibration.estimate(calibration.prepare(dataclasses.replace(packed, host_work_s=0.0)), CALIBRATION)
    assert without / packed.measured - 1 == pytest.approx(0.530, abs=0.01)


def test_an_evaluation_adds_the_host_work_its_timer_also_covered():
    """The NER notebook's eval_runtime also timed its metric (gathering the logits, seqeval): the point
    carries that CPU time as `bench/host_work_env.sh` measured it here, and the estimate adds it once, in
    the notebook host's seconds: times the fitted ratio of that host's CPU time to this machine's."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import calibration

    ner = next(p for p in calibration.POINTS if "NER" in p.name)
    assert 0.3 < ner.host_work_s < 1.5
    prepared = calibration.prepare(ner)
    without = calibration.estimate(calibration.prepare(dataclasses.replace(ner, host_work_s=0.0)), CALIBRATION)
    samples = 162 * 20
    # The planner's constants alone: the ratio recorded beside them.
    with_work = calibration.estimate(prepared, CALIBRATION)
    assert samples / with_work - samples / without == pytest.approx(ner.host_work_s * calibration.HOST_CPU_RATIO)
    for ratio in (1.0, 2.5):
        constants = calibration.NotebookHostCalibration(**dataclasses.asdict(CALIBRATION), host_cpu_ratio=ratio)
        with_work = calibration.estimate(prepared, constants)
        assert samples / with_work - samples / without == pytest.approx(ner.host_work_s * ratio)


def test_the_host_work_bench_stays_runnable_by_the_notebooks_python():
    """`bench/host_work_env.sh` runs `bench/host_work.py` (and `bench/machine.py`, which it imports) under
    CPython 3.8 with the libraries of 2022, the notebooks' software: both must parse as Python 3.8 and
    import nothing of this project or of libraries the script does not install."""
    import ast

    bench = Path(__file__).resolve().parents[2] / "bench"
    allowed = {"__future__", "argparse", "os", "statistics", "subprocess", "sys", "time", "platform",
               "importlib", "numpy", "torch", "datasets", "transformers", "seqeval", "machine", "host_work"}  # fmt: skip
    for name in ("host_work.py", "machine.py"):
        tree = ast.parse((bench / name).read_text(), filename=name, feature_version=(3, 8))
        imported = {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert imported <= allowed, (name, imported - allowed)
