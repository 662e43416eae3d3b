"""How fast a real IPU system would run a layout: stage times, the pipeline schedule, throughput.

Per block, one forward of one micro-batch costs, summed over its traced operations:

* a matmul: FLOPs / (peak x `matmul_efficiency`) plus `cycles_per_operation` per piece (the one
  exchange of its operands is inside the fitted efficiency). A matmul whose working memory exceeds
  its IPU's `matmul_proportion` budget is serialized into k pieces (a tied LM head into the embedding
  serialization factor's): each piece pays the fixed cost and re-exchanges the operand it shares,
  k^(1/3) times the working memory in all, over the inter-tile exchange. So a higher matmul
  proportion runs faster until the matmul fits whole, and the memory it takes is what limits it
  (`memory.py`). (Charging the single exchange explicitly as well was tried: it raised the
  leave-one-out error from 11 % to 24 %, so it stays inside the efficiency.)
* any other operation: bytes moved / on-chip bandwidth plus `cycles_per_operation`.

The fixed cost per operation is what makes efficiency depend on shape: a big matmul runs near
`matmul_efficiency`, a small one mostly pays its fixed cost (ViT at micro-batch 1 reaches ~4% of
peak). A matmul's backward is two matmuls of its forward's FLOPs (input and weight gradients), priced
the same way; the other operations' backward costs `backward_other_ratio` x their forward; a
recomputing stage runs its forward again.

A pipeline has one stage per IPU, and one more when a head tied to the word embedding runs on IPU 0
after the last layer (S = N + 1 stages on N IPUs). One weight update runs GA + 2S - 2 pipeline cycles
(fill, steady state, flush). In cycle c, stage k runs the forward of micro-batch c - k and the
recompute + backward of micro-batch c - (2S - 2 - k) when those exist; stages sharing an IPU run one
after the other, the cycle lasts as long as its busiest IPU, then the inter-IPU copies run over
IPU-Links. After the flush, replicas all-reduce gradients (`scaleout.py`: IPU-Links inside a POD64,
GW-Links between PODs) and the optimizer steps.

Inference runs as PopTorch runs it: the device iterations loop on the IPUs, so one host call serves
micro-batch x device iterations x replicas samples. Optimum Graphcore runs inference sharded
(`ShardedExecution`): each micro-batch visits the IPUs one after another. With
`Workload.pipelined_inference` (PopTorch's `PipelinedExecution`) and device_iterations >= S the stages
overlap instead: DI + S - 1 cycles, each as long as the busiest IPU plus its copy: the pipeline fills
and drains once per host call, not once per micro-batch, so a call of many device iterations keeps it
full. Every host call, in training or inference, pays the fitted fixed overhead once and streams its
inputs and the outputs its `Workload.output_mode` returns (all DI micro-batches' by default, one per
replica for Final or Sum) over the host links; the host copies those bytes too, each input into
Poplar's stream buffer before the link carries it and each output into the new tensor PopTorch
returns after (`host_copy_bandwidth`), one replica after another within a host process.

A call therefore has three parts (`call_timing`): the IPUs' own work, the streams (over the host links,
in which the IPUs take part, and the host's copies at either end, which the call waits for), and the
host's own work between calls (the fixed overhead).
Its **latency** is their sum: one batch from the call to its results. Its **throughput** divides the
samples by the time between calls, which is the same sum unless the host prepares the next call while
the IPUs run this one (`Workload.async_data_loading`, PopTorch's asynchronous data loading): then the
host's own work hides behind the IPUs' or the other way round. The call is **IPU-bound** when the IPUs'
work is the larger part, **host-bound** otherwise, and a faster layout of the IPUs then changes little:
when the fixed cost per call is most of the host's part, more device iterations or a larger micro-batch
amortise it; when the streams are (`PerformanceReport.stream_time`), which grow with the samples, fewer
bytes per sample or more host processes shorten them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from optimum_ipu.costmodel.hardware import ASSUMPTIONS, CALIBRATION, Calibration, ChipSpec
from optimum_ipu.costmodel.memory import (
    matmul_temporary_bytes,
    optimizer_state_bytes,
    pipeline_stages,
    serialization_pieces,
    serialized_pieces,
    table_shares,
)
from optimum_ipu.costmodel.profile import BlockProfile, ModelProfile
from optimum_ipu.costmodel.scaleout import allreduce_time, host_copy_time, host_io_time
from optimum_ipu.costmodel.workload import Workload
from optimum_ipu.runtime.checks import min_gradient_accumulation


@dataclass
class StageTime:
    """Seconds one pipeline stage spends on one micro-batch.

    Attributes:
        ipu: the IPU the stage runs on (one per IPU, and IPU 0 again for a head tied to the
            embedding: `memory.pipeline_stages`).
        forward, backward, recompute: seconds per micro-batch (recompute 0 when the stage keeps its
            activations).
        forward_flops: forward FLOPs per micro-batch.
        matmul_pieces: the most pieces a matmul there is serialized into to fit the matmul
            proportion (1: none).
    """

    ipu: int
    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    forward_flops: int = 0
    matmul_pieces: int = 1

    @property
    def busy(self) -> float:
        """Seconds of one steady-state cycle: forward + recompute + backward."""
        return self.forward + self.recompute + self.backward


@dataclass
class PerformanceReport:
    """Estimated time of one host call and the throughput it implies, for one replica's pipeline."""

    training: bool
    stages: list[StageTime]
    cycles: list[float]
    copy_time: float
    update_time: float
    allreduce_time: float
    optimizer_time: float
    host_time: float
    call_time: float
    samples_per_call: int
    samples_per_second: float
    pipeline_efficiency: float
    bottleneck_ipu: int
    utilisation: float
    notes: list[str] = field(default_factory=list)
    pipelined: bool = True  # training, or inference whose stages overlap across device iterations
    device_time: float = 0.0  # the IPUs' own seconds per call (the pipeline's cycles, all updates)
    latency: float = 0.0  # one call from its start to its outputs back on the host, nothing overlapped
    regime: str = ""  # "IPU-bound" or "host-bound" (`call_timing`)
    stream_time: float = 0.0  # the part of host_time that is the call's streams (links and host copies)

    @property
    def ipu_stages(self) -> list[StageTime]:
        """One `StageTime` per IPU (`per_ipu`)."""
        return per_ipu(self.stages)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per weight update (GA) in training; per host call (DI) in pipelined inference."""
        n = len(self.stages)
        if self.training:
            return len(self.cycles) - 2 * (n - 1)
        return len(self.cycles) - (n - 1) if self.pipelined else 1

    def timeline(self) -> list[dict]:
        """Segments of one weight update (one host call in inference) for a Gantt chart.

        Each segment is a dict with `ipu`, `start` and `duration` (seconds), `kind` ("forward" or
        "backward", the latter including recomputation) and `micro_batch`.
        """
        n, ga = len(self.stages), self.micro_batches
        segments: list[dict] = []
        start = 0.0
        for c, length in enumerate(self.cycles):
            if not self.training and self.pipelined:
                offset = {s.ipu: 0.0 for s in self.stages}  # stages sharing an IPU run one after another
                for k, s in enumerate(self.stages):
                    if 0 <= c - k < ga:
                        segments.append(
                            dict(ipu=s.ipu, start=start + offset[s.ipu], duration=s.forward, kind="forward",
                                 micro_batch=c - k)
                        )  # fmt: skip
                        offset[s.ipu] += s.forward
                start += length
                continue
            if not self.training:  # sharded: micro-batch c // S at stage c % S
                s = self.stages[c % n]
                segments.append(
                    dict(ipu=s.ipu, start=start, duration=s.forward, kind="forward", micro_batch=c // n)
                )
                start += length
                continue
            offset = {s.ipu: 0.0 for s in self.stages}  # stages sharing an IPU run one after another
            for k, s in enumerate(self.stages):
                if 0 <= c - k < ga:
                    segments.append(
                        dict(ipu=s.ipu, start=start + offset[s.ipu], duration=s.forward, kind="forward",
                             micro_batch=c - k)
                    )  # fmt: skip
                    offset[s.ipu] += s.forward
                back = c - (2 * n - 2 - k)
                if 0 <= back < ga:
                    segments.append(
                        dict(ipu=s.ipu, start=start + offset[s.ipu], duration=s.recompute + s.backward,
                             kind="backward", micro_batch=back)
                    )  # fmt: skip
                    offset[s.ipu] += s.recompute + s.backward
            start += length
        return segments

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("stages", "cycles")}
        out["stages"] = [{**asdict(s), "busy": s.busy} for s in self.stages]
        out["cycle_count"] = len(self.cycles)
        return out


def per_ipu(stages: Sequence[StageTime]) -> list[StageTime]:
    """One `StageTime` per IPU, in IPU order: the stages that share an IPU (a tied head's stage on
    IPU 0 beside the embedding's) summed."""
    out: dict[int, StageTime] = {}
    for s in stages:
        t = out.setdefault(s.ipu, StageTime(s.ipu))
        t.forward, t.recompute, t.backward = (
            t.forward + s.forward,
            t.recompute + s.recompute,
            t.backward + s.backward,
        )
        t.forward_flops += s.forward_flops
        t.matmul_pieces = max(t.matmul_pieces, s.matmul_pieces)
    return [out[k] for k in sorted(out)]


def block_forward_parts(
    block: BlockProfile, hardware: ChipSpec, workload: Workload, budget: float, calibration: Calibration
) -> tuple[float, float, int]:
    """Seconds of one forward of `block` on one micro-batch in its matrix products and in its other
    operations, and the most pieces the matmul proportion's `budget` forced a matmul into (1: none;
    embedding serialization not counted)."""
    peak = hardware.peak_flops(workload.fp32) * calibration.matmul_efficiency
    per_op = calibration.cycles_per_operation / hardware.clock_hz
    factor = workload.embedding_factor
    matmul, most = 0.0, 1
    for mm in block.matmuls:
        split = serialized_pieces(mm, workload)
        need = matmul_temporary_bytes(mm, hardware.tiles, workload.float_bytes, split)
        pieces = serialization_pieces(need, budget)
        most = max(most, pieces)
        exchanged = split * need * (pieces ** (1 / 3) - 1)  # the re-exchanges serialization adds
        matmul += mm.flops / peak + exchanged / hardware.exchange_bandwidth + split * pieces * per_op
    ops = block.other_ops + block.embedding_lookups * (factor - 1)
    other = ops * per_op + block.other_bytes / hardware.memory_bandwidth
    return matmul, other, most


def block_forward_time(
    block: BlockProfile, hardware: ChipSpec, workload: Workload, budget: float, calibration: Calibration
) -> tuple[float, int]:
    """Seconds of one forward of `block` on one micro-batch, and the most pieces the matmul
    proportion's `budget` forced a matmul into (1: none; embedding serialization not counted)."""
    matmul, other, most = block_forward_parts(block, hardware, workload, budget, calibration)
    return matmul + other, most


def stage_time(
    ipu: int,
    blocks: Sequence[BlockProfile],
    workload: Workload,
    hardware: ChipSpec,
    calibration: Calibration = CALIBRATION,
    position: int | None = None,
    stages: int | None = None,
) -> StageTime:
    """Forward / recompute / backward seconds of the pipeline stage at `position` (of `stages`; by
    default IPU `ipu`'s in a pipeline of one stage per IPU) holding `blocks` on IPU `ipu`, per
    micro-batch.

    The backward of a matrix product is two products of the forward's FLOPs (input gradient, weight
    gradient), each priced like the forward one; the backward of the other operations costs
    `ASSUMPTIONS.backward_other_ratio` x their forward. With gradient accumulation, every micro-batch
    also adds each weight's gradient into its fp32 accumulator: one operation per parameter tensor
    (reading the gradient and the accumulator, writing the accumulator), which is what makes small
    micro-batches of a large model costly.
    """
    stage = StageTime(ipu)
    budget = workload.matmul_proportion[ipu] * hardware.memory_bytes
    per_op = calibration.cycles_per_operation / hardware.clock_hz
    accumulates = workload.training and workload.gradient_accumulation_steps > 1
    backward = 0.0
    for block in blocks:
        matmul, other, pieces = block_forward_parts(block, hardware, workload, budget, calibration)
        stage.forward += matmul + other
        backward += 2 * matmul + ASSUMPTIONS.backward_other_ratio * other
        if accumulates:
            moved = block.trainable_parameters * (workload.float_bytes + 2 * 4)
            backward += block.trainable_tensors * per_op + moved / hardware.memory_bandwidth
        stage.forward_flops += block.forward_flops
        stage.matmul_pieces = max(stage.matmul_pieces, pieces)
    if workload.training:
        stage.backward = backward
        recomputes = workload.recomputes(ipu if position is None else position, stages)
        stage.recompute = stage.forward if recomputes else 0.0
    return stage


def stage_times(
    profile: ModelProfile,
    ipu_of: Mapping[str, int],
    workload: Workload,
    hardware: ChipSpec,
    calibration: Calibration = CALIBRATION,
) -> list[StageTime]:
    """Forward / backward / recompute seconds of each stage of the pipeline, in the order a
    micro-batch's forward visits them (`memory.pipeline_stages`)."""
    stages = pipeline_stages(profile, ipu_of, workload.ipus_per_replica)
    return [
        stage_time(ipu, blocks, workload, hardware, calibration, position, len(stages))
        for position, (ipu, blocks) in enumerate(stages)
    ]


def _busiest_ipu(stages: list[StageTime], c: int, micro_batches: int, training: bool) -> float:
    """Seconds of cycle `c` on its busiest IPU (before the copy): stage k runs the forward of
    micro-batch c - k and, in training, the recompute + backward of micro-batch c - (2S - 2 - k);
    stages sharing an IPU run one after the other."""
    n = len(stages)
    work: dict[int, float] = {}
    for k, s in enumerate(stages):
        w = s.forward if 0 <= c - k < micro_batches else 0.0
        if training and 0 <= c - (2 * n - 2 - k) < micro_batches:
            w += s.recompute + s.backward
        work[s.ipu] = work.get(s.ipu, 0.0) + w
    return max(work.values())


def pipeline_cycles(stages: list[StageTime], micro_batches: int, copy_time: float) -> list[float]:
    """Length of each of the GA + 2S - 2 cycles of one weight update (fill, steady state, flush) of a
    pipeline of S stages (`stages` in forward order). In cycle c stage k runs the forward of
    micro-batch c - k and the recompute + backward of micro-batch c - (2S - 2 - k); stages that share
    an IPU run one after the other, so a cycle lasts as long as its busiest IPU."""
    n = len(stages)
    steady = [s.busy for s in per_ipu(stages)]

    def cycle(c: int) -> float:
        return _busiest_ipu(stages, c, micro_batches, training=True) + copy_time

    total = micro_batches + 2 * n - 2
    first_steady, last_steady = 2 * n - 2, micro_batches - 1
    if last_steady - first_steady < 2:
        return [cycle(c) for c in range(total)]
    fill = [cycle(c) for c in range(first_steady)]
    flush = [cycle(c) for c in range(last_steady + 1, total)]
    return fill + [max(steady) + copy_time] * (last_steady - first_steady + 1) + flush


def copy_time(
    profile: ModelProfile,
    ipu_of: Mapping[str, int],
    workload: Workload,
    hardware: ChipSpec,
    calibration: Calibration = CALIBRATION,
) -> float:
    """Seconds of the inter-IPU copies closing each pipeline cycle (activations forward, gradients back)."""
    n = workload.ipus_per_replica
    if n == 1:
        return 0.0
    sent, received = [0] * n, [0] * n
    for c in profile.crossings(ipu_of):
        if c.source is None:
            continue
        sent[c.source] += c.bytes
        received[c.target] += c.bytes
        if workload.training:
            sent[c.target] += c.gradient_bytes
            received[c.source] += c.gradient_bytes
    bandwidth = ASSUMPTIONS.pipeline_links * hardware.ipu_link_bandwidth
    per_op = calibration.cycles_per_operation / hardware.clock_hz
    phases = 2 if workload.training else 1
    return max(max(sent), max(received)) / bandwidth + phases * per_op


def weight_update_time(
    trainable: Sequence[int], workload: Workload, hardware: ChipSpec, calibration: Calibration = CALIBRATION
) -> tuple[float, float]:
    """Seconds of the gradient all-reduce across replicas and of the optimizer step, per update.

    Args:
        trainable: trainable parameters on each IPU of the pipeline.
    """
    allreduce = allreduce_time(trainable, workload, hardware, calibration)
    fb = workload.float_bytes
    state = optimizer_state_bytes(workload)
    shards = workload.replication_factor if workload.replicated_tensor_sharding else 1
    step = 0.0
    for p in trainable:
        p /= shards
        seconds = p * (3 * fb + 2 * state) / hardware.memory_bandwidth  # read w, g, state; write w, state
        if workload.optimizer_state_offchip:
            seconds += 2 * p * state / hardware.streaming_memory_bandwidth  # state in and out
        step = max(step, seconds)
    return allreduce, step


def inference_cycles(
    stages: list[StageTime], device_iterations: int, copy: float, pipelined: bool = True
) -> list[float]:
    """Cycles of one inference host call per replica, for the pipeline's S `stages` in forward order.

    Pipelined (when asked and there are at least as many device iterations as IPUs): DI + S - 1
    cycles; in cycle c stage k runs the forward of micro-batch c - k, stages sharing an IPU one after
    the other, and the cycle lasts as long as its busiest IPU plus the copy (so fill and drain, where
    fewer stages run, are shorter). Otherwise sharded: each micro-batch visits the stages in turn, one
    cycle per stage (the last without a copy).
    """
    n, ipus = len(stages), per_ipu(stages)
    if pipelined and n > 1 and device_iterations >= len(ipus):
        steady = max(s.forward for s in ipus) + copy  # every stage running
        return [
            steady
            if n - 1 <= c < device_iterations
            else _busiest_ipu(stages, c, device_iterations, False) + copy
            for c in range(device_iterations + n - 1)
        ]
    one = [s.forward + (copy if k < n - 1 else 0.0) for k, s in enumerate(stages)]
    return one * device_iterations


IPU_BOUND, HOST_BOUND = "IPU-bound", "host-bound"


def call_timing(
    device: float, streams: float, host_work: float, overlapped: bool
) -> tuple[float, float, str]:
    """Seconds between host calls, the latency of one call, and its regime.

    Args:
        device: the IPUs' own work in the call (compute and inter-IPU copies).
        streams: the inputs in and the outputs out: over the host links, where the IPUs take part, and
            the host's copies at either end (each input into Poplar's stream buffer, each output into
            the tensor returned), which the stream callbacks make inside the call. The call waits for
            all of it, so it never overlaps the IPUs' work.
        host_work: the host's own work per call between calls: the fixed overhead (Python, PopTorch,
            the data loader).
        overlapped: the host prepares the next call while the IPUs run this one (asynchronous data
            loading), so the period is max(device, host_work) + streams instead of their sum.

    Latency is device + streams + host_work whatever the loading: one batch's way through. The call is
    IPU-bound when `device` is at least `streams + host_work`, host-bound otherwise.
    """
    period = streams + (max(device, host_work) if overlapped else device + host_work)
    latency = device + streams + host_work
    return period, latency, IPU_BOUND if device >= streams + host_work else HOST_BOUND


def estimate_performance(
    profile: ModelProfile,
    ipu_of: Mapping[str, int],
    workload: Workload,
    hardware: ChipSpec,
    calibration: Calibration = CALIBRATION,
) -> PerformanceReport:
    """Throughput of the layout `ipu_of` (block name -> IPU) under `workload` on `hardware`."""
    n, ga, di = workload.ipus_per_replica, workload.gradient_accumulation_steps, workload.device_iterations
    stages = stage_times(profile, ipu_of, workload, hardware, calibration)
    depth, ipus = len(stages), per_ipu(stages)
    copy = copy_time(profile, ipu_of, workload, hardware, calibration)
    if workload.training:
        cycles = pipeline_cycles(stages, ga, copy)
        trainable = [0] * n
        for b in profile.blocks:
            trainable[ipu_of[b.name]] += b.trainable_parameters - b.word_embedding_parameters
        trainable = [t + share for t, share in zip(trainable, table_shares(profile, ipu_of, workload))]
        allreduce, optimizer = weight_update_time(trainable, workload, hardware, calibration)
        efficiency, pipelined = ga / (ga + 2 * depth - 2), True
        bottleneck = max(ipus, key=lambda s: s.busy).ipu
        update = sum(cycles) + allreduce + optimizer
        compute = di * update
        inputs, outputs = profile.input_bytes * ga * di, 0  # training returns only the loss
    else:
        pipelined = workload.pipelined_inference and n > 1 and di >= depth
        cycles = inference_cycles(stages, di, copy, pipelined)
        allreduce = optimizer = 0.0
        efficiency = di / (di + depth - 1) if pipelined else 1.0 / n
        bottleneck = max(ipus, key=lambda s: s.forward).ipu
        update = sum(cycles) / di  # per micro-batch
        compute = sum(cycles)
        inputs, outputs = profile.input_bytes * di, profile.output_bytes * workload.returned_micro_batches
    links = host_io_time(inputs, outputs, workload, hardware)
    streams = links + host_copy_time(inputs, outputs, workload, calibration)
    host_work = calibration.host_call_overhead_s
    host = streams + host_work
    call, latency, regime = call_timing(compute, streams, host_work, workload.async_data_loading)
    samples = workload.samples_per_call
    passes = [1.0 + (s.recompute + s.backward) / s.forward if s.forward else 1.0 for s in stages]
    executed = sum(s.forward_flops * k for s, k in zip(stages, passes)) * ga * di
    utilisation = executed / (call * hardware.peak_flops(workload.fp32) * n)
    notes = [
        f"IPU {s.ipu}: a matmul is serialized into {s.matmul_pieces} pieces to fit matmul_proportion "
        f"{workload.matmul_proportion[s.ipu]:g}; a higher proportion there would run it faster."
        for s in ipus
        if s.matmul_pieces > 1
    ]
    needed = min_gradient_accumulation(depth)
    if workload.training and depth > 1 and ga < needed:
        notes.append(
            f"gradient_accumulation_steps {ga} is fewer than the 2S−1 = {needed} pipeline stages "
            f"(S = {depth} forward stages, the backward's first being the forward's last): a real compile "
            f"refuses it, and so does IPUTrainer. Use at least {needed}."
        )
    return PerformanceReport(
        training=workload.training, stages=stages, cycles=cycles, copy_time=copy, update_time=update,
        allreduce_time=allreduce, optimizer_time=optimizer, host_time=host, call_time=call,
        samples_per_call=samples, samples_per_second=samples / call, pipeline_efficiency=efficiency,
        bottleneck_ipu=bottleneck, utilisation=utilisation, notes=notes,
        pipelined=pipelined, device_time=compute, latency=latency, regime=regime, stream_time=streams,
    )  # fmt: skip


def evaluate_setup_time(
    profile: ModelProfile, workload: Workload, calibration: Calibration = CALIBRATION
) -> float:
    """One-off seconds of an end-to-end `IPUTrainer.evaluate()` that fall inside its timed
    `eval_runtime` but are not steady-state throughput: copying every replica's weights to the IPUs
    (PopTorch's implicit `copyWeightsToDevice()` on the first call of the loop, after the training
    model wrote them back to the host) at the fitted `weight_upload_bandwidth`.

    `estimate_performance` leaves it out (the planner reports steady-state samples/s); the calibration
    adds it to the points that publish an `evaluate()` figure: samples / (setup + calls x call time).
    """
    weight_bytes = profile.parameters * workload.float_bytes * workload.replication_factor
    return weight_bytes / calibration.weight_upload_bandwidth
