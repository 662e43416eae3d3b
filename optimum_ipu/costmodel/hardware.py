"""The simulated IPU as plain data: chip specs, pod shapes, and the few constants the models need.

Everything the memory and performance models know about the hardware is here, with its source, so a
better measurement changes one number in one place. Three kinds of number live in this file:

* **facts** (`ChipSpec` fields, `POD_SIZES`): published by Graphcore (IPU-M2000 / Bow-2000 data
  sheets, the MLPerf system descriptions) or derived from them by arithmetic; the source is in the
  comment beside each;
* **fitted constants** (`CALIBRATION`): five, fitted to the published throughputs (training and
  inference, host-bound and IPU-bound, four pod sizes, BERT-Base/Large, RoBERTa, GPT-2 and ViT) that
  `bench/calibration.py` reproduces and cross-validates leave-one-out. Each exists because a physical
  effect cannot be derived from the data sheets (see `Calibration`);
* **assumptions** (`ASSUMPTIONS`): not fitted to any throughput, each chosen from physical reasoning
  and stated with it. `python bench/calibration.py --sensitivity` moves each by a stated factor and
  prints how far every calibration point moves, so an assumption that matters shows up.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
TERA = 1e12


@dataclass(frozen=True)
class ChipSpec:
    """One IPU processor: compute, memory and links.

    Attributes:
        name: marketing name.
        tiles: tiles per IPU; each has its own SRAM and 6 hardware threads.
        tile_memory_bytes: SRAM per tile. Out of memory is judged per tile by Poplar.
        clock_hz: tile clock.
        fp16_flops: peak fp16 FLOP/s (AMP units, fp16 partials).
        fp32_flops: peak fp32 FLOP/s.
        memory_bandwidth: aggregate tile SRAM bandwidth, bytes/s.
        exchange_bandwidth: aggregate inter-tile exchange bandwidth, bytes/s.
        ipu_link_bandwidth: bandwidth of one IPU-Link, bytes/s.
        ipu_links: IPU-Links per chip.
        host_to_ipu_bandwidth, ipu_to_host_bandwidth: bytes/s one IPU streams from / to the host
            through its gateway's buffer, end to end (the slower side of the buffer).
        streaming_memory_bandwidth: IPU <-> off-chip Streaming Memory bandwidth, bytes/s.
        gw_link_bandwidth_per_ipu: share of one IPU in the GW-Links between pods, bytes/s.
        ipus_per_machine: IPUs in one IPU-M2000 / Bow-2000.
    """

    name: str
    tiles: int
    tile_memory_bytes: int
    clock_hz: float
    fp16_flops: float
    fp32_flops: float
    memory_bandwidth: float
    exchange_bandwidth: float
    ipu_link_bandwidth: float
    ipu_links: int
    host_to_ipu_bandwidth: float
    ipu_to_host_bandwidth: float
    streaming_memory_bandwidth: float
    gw_link_bandwidth_per_ipu: float
    ipus_per_machine: int = 4

    @property
    def memory_bytes(self) -> int:
        """In-Processor Memory of one IPU: 1472 x 638,976 B = 940,572,672 B (the "900 MB")."""
        return self.tiles * self.tile_memory_bytes

    def peak_flops(self, fp32: bool = False) -> float:
        """Peak FLOP/s in the precision the model computes in."""
        return self.fp32_flops if fp32 else self.fp16_flops


_MK2 = ChipSpec(
    name="Mk2 GC200",
    tiles=1472,  # GC200 data sheet
    tile_memory_bytes=638_976,  # 624 KiB; Poplar's own OOM message quotes this figure
    clock_hz=1.33e9,  # MLPerf v1.0 system description, IPU-POD16
    fp16_flops=250 * TERA,  # IPU-M2000 data sheet: 1 PFLOPS fp16 per 4 IPUs
    fp32_flops=62.5 * TERA,  # GC200 data sheet
    memory_bandwidth=47.5 * TERA,  # GC200 data sheet: In-Processor Memory bandwidth
    exchange_bandwidth=8 * TERA,  # GC200 data sheet: inter-tile exchange
    ipu_link_bandwidth=32 * GB,  # derived: 320 GB/s chip to chip over 10 IPU-Links
    ipu_links=10,  # GC200 data sheet
    # gc-hosttraffictest's published IPU-M2000 output, one IPU (docs.graphcore.ai/projects/
    # command-line-tools/en/latest/gc-hosttraffictest_main.html): host -> buffer -> tile 26.4 Gbit/s
    # at the tiles, host <- buffer <- tile 23.5 Gbit/s at the host (each the slower side of the buffer).
    host_to_ipu_bandwidth=26.41e9 / 8,
    ipu_to_host_bandwidth=23.46e9 / 8,
    streaming_memory_bandwidth=31.5 * GB,  # derived: PCIe Gen4 x16 per IPU to the gateway's DRAM
    gw_link_bandwidth_per_ipu=25 * GB / 4,  # derived: 2 x 100 Gbps GW-Links per machine, 4 IPUs
)

# Bow: the same GC200 die (wafer-on-wafer power delivery) at a higher clock; per-cycle rates unchanged.
_BOW_CLOCK_RATIO = 1.85 / 1.33
_BOW = ChipSpec(
    name="Bow IPU",
    tiles=1472,  # Bow-2000 data sheet
    tile_memory_bytes=638_976,  # same die as GC200 (assumed in the reference table)
    clock_hz=1.85e9,  # Bow-2000 data sheet
    fp16_flops=350 * TERA,  # Bow-2000 data sheet: 1.4 PFLOPS per 4 IPUs
    fp32_flops=87.5 * TERA,  # derived: the GC200's 1:4 fp32:fp16 ratio
    memory_bandwidth=47.5 * TERA * _BOW_CLOCK_RATIO,  # derived: same bytes per cycle, faster clock
    exchange_bandwidth=8 * TERA * _BOW_CLOCK_RATIO,  # derived: same bytes per cycle, faster clock
    ipu_link_bandwidth=32 * GB,  # same IPU-Links as the M2000 (the 512 Gbps figure is uncertain)
    ipu_links=10,
    host_to_ipu_bandwidth=26.41e9 / 8,  # same gateway as the M2000
    ipu_to_host_bandwidth=23.46e9 / 8,
    streaming_memory_bandwidth=31.5 * GB,
    gw_link_bandwidth_per_ipu=25 * GB / 4,
)

HARDWARE: dict[str, ChipSpec] = {"mk2": _MK2, "bow": _BOW}

# Total IPUs of the systems users name with `--pod` / `pod_type` (IPU-POD and Bow Pod shapes).
POD_SIZES: dict[str, int] = {
    "pod4": 4,  # one IPU-M2000 / Bow-2000
    "pod16": 16,  # 4 machines, one host
    "pod64": 64,  # 16 machines, one rack
    "pod128": 128,  # 2 x POD64 over GW-Links
    "pod256": 256,  # 4 x POD64 over GW-Links
    "pod1024": 1024,  # Bow Pod1024
}
# Topology (seed 004, "Bow-2000 / Bow-POD64 topology"): IPU-Links form a 2D torus inside one POD64;
# PODs join over the gateways' GW-Links (2 x 100 Gbps per machine). Beyond 64 IPUs, replicas
# all-reduce hierarchically: inside each POD over IPU-Links, then across PODs over GW-Links.
IPUS_PER_POD = 64
# One Poplar host drives up to 4 machines (reference table: "POD16 = 4 machines on one host"); bigger
# pods have one host per 16 IPUs, each streaming its replicas' inputs and paying its own call overhead.
IPUS_PER_HOST = 16
# What one host streams to and from all the IPUs it drives: its 100GbE RoCEv2 NIC (the IPU-POD Direct
# Attach build and test guide, docs.graphcore.ai/projects/ipu-podda-build-test/en/latest/pod_da_kit.html:
# "one host server with an installed 100GbE RoCEv2 NIC").
HOST_NIC_BANDWIDTH = 100e9 / 8


def chip(name: str | ChipSpec) -> ChipSpec:
    """The `ChipSpec` called `name` ("mk2" or "bow"); a `ChipSpec` passes through."""
    if isinstance(name, ChipSpec):
        return name
    try:
        return HARDWARE[name.lower()]
    except KeyError:
        raise ValueError(f"unknown IPU hardware {name!r}; choose one of {', '.join(HARDWARE)}.") from None


@dataclass(frozen=True)
class Calibration:
    """The five constants fitted to published throughputs (see `bench/calibration.py`).

    Attributes:
        matmul_efficiency: the fraction of AMP peak that a matmul reaches once it is large enough for
            fixed costs to vanish. It exists because even a large matmul pays for exchanging its
            operands and partial sums between tiles and for tiles left with uneven shares of the
            work; none of that follows from the data sheet. Applies to convolutions as well.
        cycles_per_operation: fixed cost of every operation, in tile clock cycles: the BSP sync, the
            exchange set-up, vertex launch, and tiles idling when an operation is too small to spread
            over 1472 of them. It exists because measured utilisation falls from ~25% of peak at
            BERT-Large's micro-batch to ~4% at ViT-base's micro-batch of 1 (reference table), a
            fall FLOPs alone cannot explain. In cycles, so Bow's faster clock shortens it.
        host_call_overhead_s: fixed cost of one host call (one combined batch): the host's Python,
            PopTorch and data-loader work and the IPU<->host synchronisation, paid once per call and
            amortised by device iterations. Nothing publishes it for the systems measured; the
            reference's "about 17 ms on a small model" was taken on another host and made sharded
            BERT-Large inference 4x too slow, so it is fitted. The six published evaluations (Optimum
            Graphcore's of ViT, BERT-Base SQuAD and NER, RoBERTa MLM and CoLA, and GPT-2, 4-20 samples
            per call, host-bound) are the ones sensitive to it; once their one-off setup is counted
            (`weight_upload_bandwidth`) they leave ~8.4 ms per call to the host. The two IPU-bound
            inference points (96 and 2,048 samples per call) hardly move it: they pin the matmul
            efficiency of inference instead.
        weight_upload_bandwidth: bytes/s at which an end-to-end `IPUTrainer.evaluate()` copies the
            weights of every replica to the IPUs, once per evaluation inside its timed
            `eval_runtime` (PopTorch's implicit `copyWeightsToDevice()` on the loop's first call,
            because the training model wrote the weights back to the host since the inference model
            last uploaded them). It is not part of the steady-state throughput the planner reports;
            only the calibration points that publish an `evaluate()` figure pay it
            (`performance.evaluate_setup_time`). The link model would move the weights at the host
            NIC's 12.5 GB/s, a setup of ~80 ms; the published evaluations need far more (ViT's progress
            bar leaves ~0.5 s of its 17.4 s eval_runtime outside the steady loop for 172 MB of
            weights; the 4-replica BERT-Base, RoBERTa and GPT-2 evaluations, 0.9-1 GB, take 2.8-11 s for
            52-539 calls). What makes the copy that slow (host-side staging of every tensor) is not
            published, so the rate is fitted.
        host_copy_bandwidth: bytes/s at which the host copies a call's streamed bytes between the
            program's tensors and Poplar's stream buffers. Each input micro-batch is copied from the
            tensor the program passed into the buffer the link streams from (PopART's
            `InputDatastream::read` and `readPrefetch`, a `memcpy` each; PopTorch passes its inputs
            through PopART's `StepIO`), and each output into a new tensor PopTorch allocates for that
            call (`PoplarExecutable::run` calls `at::empty` per output; `OutputDatastream::write`, a
            `memcpy`), after the link has carried it. A process runs its stream callbacks on one thread
            (`streamCallbacks.multiThreadMode`'s documented default, `singleThread`,
            docs.graphcore.ai/projects/poplar-api, RuntimeOptions; Optimum Graphcore 0.3 sets no engine
            option), so it copies its replicas one after another; separate processes (`poprun
            --num-instances`, `Workload.processes`) copy at once. The call waits for the copies, so the
            model adds them to its streams whatever the data loading. PopART enables Poplar's prefetch
            by default (`enablePrefetchDatastreams`), which could hide an input copy behind the IPUs'
            work, but the published ViT training runs need the cost unhidden (hidden, they are 7-33 %
            too fast), so the fitted rate is that of the host's per-byte cost of a call's streams as
            those runs show it, whatever part of it the `memcpy` is, not a measured `memcpy`. Only a
            language model's logits (the RoBERTa MLM evaluation returns 257 MB per call) and training
            that streams images (graphcore/examples' ViT: 2.5-9.9 GB a call for one host's replicas)
            make it count (8-58 % of those points' estimates; 1.3 % or less for every other point,
            which streams token ids, a loss, a pooled vector or a few images a call). The rate depends
            on the host's CPU and page faults, which no source gives for the published runs' hosts, so
            it is fitted within what `bench/host_work.py` measures here: a fresh tensor (page faults
            included, the slow end) to a warm copy (the fast end), that span taken as its prior
            (`PRIORS` there).
    """

    matmul_efficiency: float
    cycles_per_operation: float
    host_call_overhead_s: float = 0.002
    weight_upload_bandwidth: float = 1e9
    host_copy_bandwidth: float = 6e9


# Fitted by `python bench/calibration.py --fit` (least squares on the log errors of every published
# point in `bench/calibration.py`, with the measured span of the host's copies as a prior; its
# leave-one-out errors are in the README). The same fit sets one constant of that bench alone, the
# notebooks' host CPU against the CPU their host work was measured on (`host_cpu_ratio` there).
CALIBRATION = Calibration(
    matmul_efficiency=0.705,
    cycles_per_operation=14_100,
    host_call_overhead_s=0.00837,
    weight_upload_bandwidth=0.463e9,
    host_copy_bandwidth=7.61e9,
)


@dataclass(frozen=True)
class Assumptions:
    """Constants the models need that are neither published nor fitted; each stated with its reason.

    Attributes:
        backward_other_ratio: backward time / forward time of the operations that are not matrix
            products (norms, softmax, GELU, dropout, residual adds). Such an operation reads its
            output's gradient and its saved input and writes its input's gradient: three tensors
            where the forward moved two, so 1.5. (A matrix product's backward needs no assumption:
            two products of the forward's FLOPs.)
        pipeline_links: IPU-Links joining two neighbouring IPUs of a pipeline (of 10 per chip: the
            others go to the other IPUs of the machine and to the next machines).
        allreduce_links: IPU-Links a replica ring all-reduce drives per IPU and direction.
        balance_headroom: fraction of an IPU's memory beyond which out-of-memory on some tile is
            likely even though the IPU total fits: Poplar judges memory per tile, and tensors never
            spread perfectly over 1472 tiles.
        largest_tensor_fraction: a single tensor larger than this fraction of the IPU is flagged: it
            has to be spread over every tile beside everything else, which rarely balances.
    """

    backward_other_ratio: float = 1.5
    pipeline_links: int = 2
    allreduce_links: int = 2
    balance_headroom: float = 0.90
    largest_tensor_fraction: float = 0.25


ASSUMPTIONS = Assumptions()


@dataclass(frozen=True)
class MemoryCalibration:
    """The memory model's fitted constant and its measured error (`python bench/memory.py`).

    Attributes:
        code_bytes_per_ipu: always-live memory per IPU that a trace cannot see: the control program,
            exchange code, vertex code and state, runtime buffers. No source publishes it for these
            models; it is fitted to the published layouts (those that ran must fit, those documented
            out of memory must not, and the per-IPU totals of the one published memory profile).
        error: how far an IPU's estimated total may be from the truth, as a fraction of the estimate:
            the largest leave-one-out miss over the published layouts, rounded up. An estimate
            within this fraction of the limit "may not fit"; beyond it, the IPU is out of memory.
    """

    code_bytes_per_ipu: int
    error: float


MEMORY_CALIBRATION = MemoryCalibration(code_bytes_per_ipu=140 * 2**20, error=0.20)
