"""Per-IPU memory: does a layout fit in each IPU's In-Processor Memory, and if not, what to change.

For each IPU of one replica's pipeline the model adds up, in bytes:

* code: always-live code, vertex state and exchange code (`MEMORY_CALIBRATION.code_bytes_per_ipu`, fitted);
* weights: the parameters of the blocks placed there, in the compute dtype (fp16 unless `fp32`);
  with `serialized_embedding_splits_per_ipu` the word-embedding table is spread as the splits say;
* gradients: gradient accumulators, one per trainable weight, when GA > 1, in the accumulator's type
  (fp16 in Optimum Graphcore's fp16 training, see `workload.StateTypes`);
* optimizer: Adam/AdamW/LAMB's two moments in their types (Optimum Graphcore's fp16 training: an fp16
  first moment and an fp32 second moment, 6 bytes), none for SGD; divided by the replicas with
  replicated tensor sharding; zero on chip with `optimizer_state_offchip`;
* update: with `optimizer_state_offchip`, the state streamed back on chip for the weight update, one
  tensor at a time, so the largest tensor's (a serialized word embedding's piece for the table):
  Optimum Graphcore's mT5 notebook shows off-chip state alone does not make a 250k x 512 table fit;
* stash: micro-batches in flight between forward and backward, 2(N-k)-1 on IPU k. With
  recomputation (on by default with >1 IPU) only the stage inputs and the recomputation checkpoints
  are stashed; the last IPU runs forward and backward in one pipeline cycle and keeps one (it
  recomputes only when every layer is a checkpoint, see `Workload.recomputes`);
* activations: what backward needs for one micro-batch: one layer's saved activations when every
  layer is a checkpoint, the whole stage's otherwise;
* temporaries: matmul working memory, capped by `matmul_proportion` x memory (beyond the cap Poplar
  serializes the matmul, which costs time, see `performance.py`), and the dense gradient of one piece
  of the word embedding (divided by the embedding serialization factor) or of an untied output
  projection (by the projection's), computed whole before it is added to its accumulator;
* kv cache: a generating decoder's key/value buffers of the maximum length, on the IPU of each
  decoder layer (`decoding.py` fills it; zero, and not shown, otherwise).

The update runs once the pipeline has drained, when no activation or temporary of the forward and
backward is live: an IPU's total is what is live throughout (code, weights, accumulators, optimizer
state on chip, stash, KV cache) plus the larger of the pipeline's transients (activations and
temporaries) and the update's.

Out of memory is judged per IPU against the 1472 x 624 KiB of SRAM, with the model's own error
(`hardware.MEMORY_CALIBRATION.error`, measured on published layouts by `bench/memory.py`): an estimate
within that error of the limit "may not fit"; beyond it, the IPU is out of memory. Warnings flag a
total so close to the limit (or one tensor so large) that some tile would likely overflow first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from optimum_ipu.costmodel.hardware import ASSUMPTIONS, MEMORY_CALIBRATION, ChipSpec
from optimum_ipu.costmodel.profile import BlockProfile, Matmul, ModelProfile, placement_rule
from optimum_ipu.costmodel.workload import Workload

MiB = 2**20
CATEGORIES = (
    "code", "weights", "gradients", "optimizer", "stash", "activations", "temporaries", "kv_cache", "update",
)  # fmt: skip
# Live throughout the program; the pipeline's transients and the update's take turns on top of them.
ALWAYS_LIVE = ("code", "weights", "gradients", "optimizer", "stash", "kv_cache")
PIPELINE_TRANSIENTS = ("activations", "temporaries")
# Categories the table shows only when some IPU has any.
_SHOWN_IF_USED = ("kv_cache", "update")


class IPUOutOfMemoryError(MemoryError):
    """A layout that does not fit on some IPU; the message has the per-IPU table and what to change."""


def matmul_temporary_bytes(mm: Matmul, tiles: int, float_bytes: int, pieces: int = 1) -> int:
    """Working memory a matmul needs to run at full speed, spread over `tiles` tiles.

    Poplar partitions a product over tiles in three dimensions (rows, reduction, columns); each tile
    holds its slices of both operands and of the partial result. The partition that minimises that
    total copies each operand about (tiles per product)^(1/3) times: 3 (m k n)^(2/3) t^(1/3) elements
    (the classic communication-optimal bound). `pieces` splits the columns (a serialized LM head).
    """
    m, k, n = mm.m, mm.k, max(math.ceil(mm.n / pieces), 1)
    per_product = max(tiles / mm.batch, 1.0)
    once = m * k + k * n + m * n
    elements = max(once, min(3 * (m * k * n) ** (2 / 3) * per_product ** (1 / 3), once * per_product))
    return int(mm.batch * elements * float_bytes)


def serialized_pieces(mm: Matmul, workload: Workload) -> int:
    """Pieces the IPU config serializes `mm` into: a tied LM head by the embedding's factor, an
    untied output projection by the projection's; any other product is whole."""
    if mm.word_embedding:
        return workload.embedding_factor
    return workload.projection_factor if mm.projection else 1


def serialization_pieces(need: float, budget: float) -> int:
    """Pieces Poplar splits a matmul into so each fits `budget` (need falls as pieces^(2/3))."""
    if need <= budget or budget <= 0:
        return 1
    return math.ceil((need / budget) ** 1.5)


@dataclass
class IPUMemory:
    """Bytes on one IPU, by category."""

    ipu: int
    layers: int = 0
    code: int = 0
    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    stash: int = 0
    activations: int = 0
    temporaries: int = 0
    kv_cache: int = 0
    update: int = 0
    matmul_need: int = 0
    matmul_budget: int = 0
    largest_tensor: int = 0
    table_bytes: int = 0

    @property
    def total(self) -> int:
        """What is live throughout, plus the larger of the pipeline's transients and the update's."""
        pipeline = sum(getattr(self, c) for c in PIPELINE_TRANSIENTS)
        return sum(getattr(self, c) for c in ALWAYS_LIVE) + max(pipeline, self.update)


MEMORY_CHECKS = ("margin", "strict", "off")


def memory_check_from_environment() -> str:
    """The memory check asked for by `OPTIMUM_IPU_MEMORY_CHECK` (default "margin"), for front ends
    whose own arguments cannot carry it (PopTorch programs, scripts run unchanged)."""
    value = os.environ.get("OPTIMUM_IPU_MEMORY_CHECK", "margin").strip().lower() or "margin"
    if value not in MEMORY_CHECKS:
        raise ValueError(
            f"OPTIMUM_IPU_MEMORY_CHECK={value!r}: choose margin (refuse a layout only when its estimate is over "
            "the limit by more than the memory model's error), strict (refuse any estimate over the limit, "
            "as Poplar would) or off (never refuse; report only)."
        )
    return value


@dataclass
class MemoryReport:
    """Per-IPU memory of one replica's pipeline against the IPU's capacity.

    Attributes:
        error: the memory model's relative error (`hardware.MEMORY_CALIBRATION.error`): an IPU whose
            estimate is within this fraction of it from the limit may or may not fit.
    """

    ipus: list[IPUMemory]
    capacity: int
    tiles: int
    tile_bytes: int
    warnings: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    error: float = MEMORY_CALIBRATION.error

    @property
    def out_of_memory(self) -> list[int]:
        """IPUs whose estimated total exceeds their memory."""
        return [m.ipu for m in self.ipus if m.total > self.capacity]

    @property
    def fits(self) -> bool:
        """No IPU's estimate exceeds its memory."""
        return not self.out_of_memory

    def verdict(self, m: IPUMemory) -> str:
        """ "fits", "may not fit" (the limit is within the model's error of the estimate) or "out of memory".

        The error is the model's (code, activations, temporaries); the weights, the accumulators and the
        optimizer state on chip are counted exactly from the parameters and their types, so an IPU whose
        exact part alone is over the limit is out of memory whatever the error.
        """
        if m.total * (1 - self.error) > self.capacity or m.weights + m.gradients + m.optimizer > self.capacity:
            return "out of memory"
        if m.total * (1 + self.error) > self.capacity:
            return "may not fit"
        return "fits"

    @property
    def surely_out_of_memory(self) -> list[int]:
        """IPUs over the limit by more than the model's error: out of memory whatever the error."""
        return [m.ipu for m in self.ipus if self.verdict(m) == "out of memory"]

    @property
    def may_not_fit(self) -> list[int]:
        """IPUs whose estimate is within the model's error of the limit, on either side."""
        return [m.ipu for m in self.ipus if self.verdict(m) == "may not fit"]

    @property
    def peak(self) -> IPUMemory:
        return max(self.ipus, key=lambda m: m.total)

    def table(self) -> str:
        """The per-IPU table: one row per IPU, one column per category, MiB, and each IPU's verdict."""
        shown = [c for c in CATEGORIES if c not in _SHOWN_IF_USED or any(getattr(m, c) for m in self.ipus)]
        columns = ["layers"] + [c.replace("_", " ") for c in shown] + ["total"]
        header = "IPU  " + " ".join(f"{c[:11]:>11}" for c in columns) + "   limit"
        lines = [header]
        for m in self.ipus:
            cells = [f"{m.layers:>11}"] + [f"{getattr(m, c) / MiB:>11.1f}" for c in shown]
            verdict = self.verdict(m)
            flag = "" if verdict == "fits" else f"  {verdict.upper()}"
            lines.append(
                f"{m.ipu:<4} " + " ".join(cells) + f" {m.total / MiB:>11.1f}   {self.capacity / MiB:.0f} MiB"
                f" ({100 * m.total / self.capacity:.0f}%){flag}"
            )
        if "update" in shown:
            lines.append(
                "(update: off-chip optimizer state streamed in for the weight update, after the pipeline has "
                "drained; a total counts the larger of it and activations + temporaries)"
            )
        return "\n".join(lines)

    def margin_line(self) -> str:
        """Each IPU's margin to the limit beside the model's error."""
        margins = ", ".join(f"IPU {m.ipu} {100 * (1 - m.total / self.capacity):+.0f}%" for m in self.ipus)
        return (
            f"Margin to the limit: {margins}; the memory model's error is ±{100 * self.error:.0f}% of an estimate "
            "(measured on Graphcore's published runs, bench/memory.py): within it, an IPU may or may not fit."
        )

    def error_message(self, check: str = "strict") -> str:
        over = self.out_of_memory if check == "strict" else self.surely_out_of_memory
        worst = max((self.ipus[i] for i in over), key=lambda m: m.total / self.capacity)
        others = [i for i in over if i != worst.ipu]
        also = f" (also IPU {', '.join(map(str, others))})" if others else ""
        beyond = (
            "over the limit (memory_check=strict)"
            if check == "strict"
            else f"over the limit by more than the memory model's error of ±{100 * self.error:.0f}%"
        )
        lines = [
            f"Out of memory on IPU {worst.ipu}: {worst.total:,} bytes used but IPUs only have "
            f"{self.capacity:,} bytes of memory ({self.tiles} tiles x {self.tile_bytes:,} bytes){also}.",
            f"The estimate is {100 * (worst.total / self.capacity - 1):.0f}% {beyond}.",
            "",
            "Memory per IPU (MiB):",
            self.table(),
        ]
        if self.advice:
            lines += ["", "To make it fit:"] + [f"  - {a}" for a in self.advice]
        lines += [
            "",
            "The estimate is a model's (bench/memory.py has its published checks); to run anyway, set "
            "OPTIMUM_IPU_MEMORY_CHECK=off (IPUTrainer: --ipu_memory_check off).",
        ]
        return "\n".join(lines)

    def raise_if_out_of_memory(self, check: str = "margin") -> None:
        """Raise `IPUOutOfMemoryError` (Poplar-like message, table, advice) as `check` says.

        Args:
            check: "margin" (default): when some IPU's estimate is over the limit by more than the
                model's error; "strict": when any estimate is over the limit, as Poplar refuses an
                actual overflow; "off": never.
        """
        if check not in MEMORY_CHECKS:
            raise ValueError(f"memory check {check!r}: choose one of {', '.join(MEMORY_CHECKS)}.")
        over = {"margin": self.surely_out_of_memory, "strict": self.out_of_memory, "off": []}[check]
        if over:
            raise IPUOutOfMemoryError(self.error_message(check))

    def to_dict(self) -> dict:
        return {
            "capacity_bytes": self.capacity,
            "fits": self.fits,
            "out_of_memory_ipus": self.out_of_memory,
            "surely_out_of_memory_ipus": self.surely_out_of_memory,
            "may_not_fit_ipus": self.may_not_fit,
            "model_error": self.error,
            "ipus": [{**asdict(m), "total": m.total, "verdict": self.verdict(m)} for m in self.ipus],
            "warnings": list(self.warnings),
            "advice": list(self.advice),
        }


def pipeline_stages(
    profile: ModelProfile, ipu_of: Mapping[str, int], ipus: int
) -> list[tuple[int, list[BlockProfile]]]:
    """(IPU, blocks) of each pipeline stage, in the order a micro-batch's forward visits them.

    One stage per IPU, then one more for each run of blocks after the forward went back to an IPU it
    had left: a head tied to the word embedding runs on IPU 0 after the last layer, so its pipeline
    has one stage more than IPUs. That is PopTorch's `AutoStage.AutoIncrement`, which Optimum
    Graphcore and Graphcore's BERT examples set (`pipelining.placement.stage_of_each_block`, the rule
    the simulated compile check counts too); under the default `SameAsIpu` the head would share IPU
    0's first stage.
    """
    numbers = placement_rule().stage_of_each_block([ipu_of[b.name] for b in profile.blocks], ipus)
    stages: list[tuple[int, list[BlockProfile]]] = [(k, []) for k in range(ipus)]
    for b, number in zip(profile.blocks, numbers):
        if number == len(stages):
            stages.append((ipu_of[b.name], []))
        stages[number][1].append(b)
    return stages


def stage_input_bytes(profile: ModelProfile, ipu_of: Mapping[str, int], ipus: int) -> list[int]:
    """Bytes entering each of `ipus` places per micro-batch (IPUs, or pipeline stages when `ipu_of`
    maps blocks to stages), from other places or the host."""
    inputs = [0] * ipus
    for crossing in profile.crossings(ipu_of):
        inputs[crossing.target] += crossing.bytes
    return inputs


def table_shares(profile: ModelProfile, ipu_of: Mapping[str, int], workload: Workload) -> list[int]:
    """Parameters of the word-embedding table on each IPU (spread by the splits, if given)."""
    n = workload.ipus_per_replica
    shares = [0] * n
    for b in profile.blocks:
        shares[ipu_of[b.name]] += b.word_embedding_parameters
    splits = workload.embedding_splits_per_ipu
    if splits and len(splits) == n and sum(splits) > 0:
        table = sum(shares)
        shares = [table * s // sum(splits) for s in splits]
    return shares


def optimizer_state_bytes(workload: Workload) -> int:
    """Optimizer state bytes per weight: the two moments in their types, none for SGD."""
    return workload.optimizer_state_bytes


def _table_piece(ipu: int, table_parameters: int, workload: Workload) -> int:
    """Parameters of one serialized piece of the word-embedding table on IPU `ipu` (each piece is a
    tensor of its own on the IPU): its share split by the pieces it holds."""
    splits = workload.embedding_splits_per_ipu
    pieces = splits[ipu] if splits and len(splits) > ipu and sum(splits) > 0 else workload.embedding_factor
    return table_parameters // max(pieces, 1)


def ipu_memory(
    ipu: int,
    blocks: Sequence[BlockProfile],
    inputs: int,
    table_parameters: int,
    workload: Workload,
    hardware: ChipSpec,
    stages: int | None = None,
    last_stage_inputs: int = 0,
) -> IPUMemory:
    """Bytes on IPU `ipu` holding `blocks`, receiving `inputs` bytes per micro-batch into its stage, and
    `table_parameters` of the word-embedding table, in a pipeline of `stages` stages (one per IPU
    unless given; IPU k runs stage k). IPU 0 also runs the last stage when a head tied to the embedding
    comes back to it: `last_stage_inputs` are the bytes entering that stage, which runs a micro-batch's
    forward and backward in one cycle, so they are held once, never stashed."""
    fb, training = workload.float_bytes, workload.training
    factor = workload.embedding_factor
    mem = IPUMemory(ipu, code=MEMORY_CALIBRATION.code_bytes_per_ipu)
    layers = [b for b in blocks if b.kind == "layer"]
    mem.layers = len(layers)
    own_table = sum(b.word_embedding_parameters for b in blocks)
    params = sum(b.parameters for b in blocks) - own_table + table_parameters
    trainable = sum(b.trainable_parameters for b in blocks) - own_table + table_parameters
    mem.table_bytes = table_parameters * fb
    mem.weights = params * fb
    if training:
        if workload.gradient_accumulation_steps > 1:
            mem.gradients = trainable * workload.state_types.accumulator
        shards = workload.replication_factor if workload.replicated_tensor_sharding else 1
        if not workload.optimizer_state_offchip:
            mem.optimizer = trainable * optimizer_state_bytes(workload) // shards
        else:  # streamed in one tensor at a time for the update: the largest must fit beside the rest
            largest = max((b.largest_trainable_tensor for b in blocks), default=0)
            projection = max((b.projection_parameters for b in blocks), default=0) // workload.projection_factor
            piece = max(largest, projection, _table_piece(ipu, table_parameters, workload))
            mem.update = piece * optimizer_state_bytes(workload) // shards

    saved = [b.saved_bytes for b in blocks]
    if not training:
        mem.activations = 2 * max((b.largest_tensor_bytes for b in blocks), default=0)
        mem.stash = inputs + last_stage_inputs
    elif workload.recomputes(ipu, stages):
        checkpoints = 0
        if workload.recompute_checkpoint_every_layer:
            checkpoints = sum(b.output_bytes for b in layers[:-1])
            mem.activations = max(saved, default=0)
        else:
            mem.activations = sum(saved)
        mem.stash = max(workload.stash_depth(ipu, stages), 1) * (inputs + checkpoints) + last_stage_inputs
    else:
        mem.activations = sum(saved)
        mem.stash = inputs + last_stage_inputs

    needs = [
        matmul_temporary_bytes(mm, hardware.tiles, fb, serialized_pieces(mm, workload))
        for b in blocks
        for mm in b.matmuls
    ]
    mem.matmul_need = max(needs, default=0)
    mem.matmul_budget = int(workload.matmul_proportion[ipu] * hardware.memory_bytes)
    mem.temporaries = min(mem.matmul_need, mem.matmul_budget)
    if training and table_parameters:
        mem.temporaries += table_parameters * fb // factor  # dense gradient of one table piece
    projection = sum(b.projection_parameters for b in blocks)
    if training and projection:  # and of one piece of an untied output projection (MT5's LM head)
        mem.temporaries += projection * fb // workload.projection_factor
    mem.largest_tensor = max([b.largest_tensor_bytes for b in blocks] + [mem.table_bytes // factor])
    return mem


def estimate_memory(
    profile: ModelProfile, ipu_of: Mapping[str, int], workload: Workload, hardware: ChipSpec
) -> MemoryReport:
    """Bytes per IPU of one replica for the blocks placed as `ipu_of` says (block name -> IPU)."""
    n = workload.ipus_per_replica
    stages = pipeline_stages(profile, ipu_of, n)
    entering = stage_input_bytes(
        profile, {b.name: k for k, (_, blocks) in enumerate(stages) for b in blocks}, len(stages)
    )
    later = [sum(entering[j] for j in range(n, len(stages)) if stages[j][0] == k) for k in range(n)]
    shares = table_shares(profile, ipu_of, workload)
    ipus = [
        ipu_memory(k, [b for b in profile.blocks if ipu_of[b.name] == k], entering[k], shares[k], workload, hardware,
                   len(stages), later[k])
        for k in range(n)
    ]  # fmt: skip
    report = MemoryReport(ipus, hardware.memory_bytes, hardware.tiles, hardware.tile_memory_bytes)
    report.warnings = _warnings(report)
    return report


def _warnings(report: MemoryReport) -> list[str]:
    warnings = []
    for m in report.ipus:
        share = m.total / report.capacity
        if ASSUMPTIONS.balance_headroom < share <= 1:
            warnings.append(
                f"IPU {m.ipu} is at {100 * share:.0f}% of its memory: Poplar judges memory per tile and "
                f"tensors never spread evenly over {report.tiles} tiles, so some tile may overflow first."
            )
        if m.largest_tensor > ASSUMPTIONS.largest_tensor_fraction * report.capacity:
            warnings.append(
                f"IPU {m.ipu} holds a single tensor of {m.largest_tensor / MiB:.0f} MiB "
                f"({100 * m.largest_tensor / report.capacity:.0f}% of the IPU): spreading it over every "
                "tile beside everything else rarely balances; raise embedding_serialization_factor or "
                "lower the micro-batch."
            )
    return warnings
