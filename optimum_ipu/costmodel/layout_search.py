"""The layout search: the `layers_per_ipu` and `matmul_proportion` that run fastest within memory.

The trace is layout-independent, and what one IPU costs depends only on which layers it holds (plus
the embeddings / heads pinned to the first / last IPU). So the layout search prices every (IPU, range of
layers) pair once: the memory left decides the matmul proportion (as high as the largest matmul
can use, as low as the memory forces), which decides the stage time. A dynamic programme over the
IPUs finds the smallest achievable bottleneck stage; every layout within a few percent of it is then
timed exactly (fill and flush included) and the fastest wins. The given layout is always priced
beside it, so the proposal is never slower by the model.

This module works on a traced `ModelProfile`; `analysis.plan_layout` is the entry point from a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optimum_ipu.costmodel.hardware import ASSUMPTIONS, CALIBRATION, MEMORY_CALIBRATION, Calibration, ChipSpec
from optimum_ipu.costmodel.memory import MiB, ipu_memory, table_shares
from optimum_ipu.costmodel.performance import (
    StageTime,
    copy_time,
    inference_cycles,
    per_ipu,
    pipeline_cycles,
    stage_time,
    weight_update_time,
)
from optimum_ipu.costmodel.profile import BlockProfile, ModelProfile
from optimum_ipu.costmodel.report import CompileReport, report_for
from optimum_ipu.costmodel.workload import Workload

MIN_PROPORTION = 0.05  # lower matmul proportions serialize matmuls into more pieces than is sensible
TOLERANCE = 0.03  # layouts whose bottleneck is within 3% of the best are timed exactly
MAX_CANDIDATES = 2000


@dataclass(frozen=True)
class _Option:
    """One IPU holding one range of layers, at its best matmul proportion.

    Attributes:
        pipeline: its pipeline stages: one, or for IPU 0 with a tied head two (the embedding's and
            layers' first stage, the head's last).
    """

    proportion: float
    trainable: int
    pipeline: tuple[StageTime, ...]

    @property
    def stage(self) -> StageTime:
        """The IPU's time per micro-batch: its pipeline stages summed."""
        return per_ipu(self.pipeline)[0]


@dataclass
class LayoutProposal:
    """The layout search's layout beside the given one, each with its full compile report."""

    given: CompileReport
    proposed: CompileReport
    options_priced: int
    layouts_timed: int

    @property
    def layers_per_ipu(self) -> list[int]:
        return self.proposed.layers_per_ipu

    @property
    def matmul_proportion(self) -> list[float]:
        return list(self.proposed.workload.matmul_proportion)

    @property
    def speedup(self) -> float:
        """Proposed / given estimated throughput (inf when the given layout does not fit)."""
        if not self.given.memory.fits:
            return math.inf
        return self.proposed.estimated_samples_per_second / self.given.estimated_samples_per_second

    def overrides(self) -> str:
        """The proposal as an `--ipu_config_overrides` string."""
        layers = " ".join(map(str, self.layers_per_ipu))
        proportions = " ".join(f"{p:g}" for p in self.matmul_proportion)
        return f"layers_per_ipu=[{layers}],matmul_proportion=[{proportions}]"

    def summary(self) -> str:
        """A two-row table (given, proposed) with throughput and peak memory, and the overrides."""

        def row(label: str, report: CompileReport) -> str:
            peak = report.memory.peak
            fit = "" if report.memory.fits else "  OUT OF MEMORY"
            return (
                f"  {label:<9} {str(report.layers_per_ipu):<28} "
                f"{str([round(p, 2) for p in report.workload.matmul_proportion]):<34}"
                f"{report.estimated_samples_per_second:>12,.1f}   {peak.total / MiB:>5.0f} MiB on IPU {peak.ipu}{fit}"
            )

        speedup = (
            "n/a (the given layout does not fit)" if math.isinf(self.speedup) else f"{self.speedup:.3f}x"
        )
        if self.proposed.memory.fits:
            outcome = f'  speed-up {speedup}; as overrides: --ipu_config_overrides "{self.overrides()}"'
        else:  # the search's best still overflows: no overrides to paste
            outcome = (
                f"  No layout of {len(self.layers_per_ipu)} IPUs per replica fits: the search's best still needs "
                f"{self.proposed.memory.peak.total / MiB:,.0f} MiB on IPU {self.proposed.memory.peak.ipu}. Lower "
                "--micro-batch or --seq-len, recompute (recompute_checkpoint_every_layer=true), move the optimizer "
                "state off chip (optimizer_state_offchip=true), or give the model more IPUs per replica."
            )
        return "\n".join(
            [
                f"Layout search: {self.options_priced} (IPU, layers) options priced, "
                f"{self.layouts_timed} layouts timed exactly",
                f"  {'':<9} {'layers_per_ipu':<28} {'matmul_proportion':<34}{'samples/s':>12}   peak memory",
                row("given", self.given),
                row("proposed", self.proposed),
                outcome,
            ]
            + ([f"  Note: {self.fit_note}"] if self.fit_note else [])
        )

    @property
    def fit_note(self) -> str | None:
        """Why to compile a proposal before trusting it, or None when the proposal is the given layout.

        Nothing measured says a proposed layout fits: the memory model does, and two of its inputs are
        not measurements (the always-live code per IPU, `MEMORY_CALIBRATION.code_bytes_per_ipu`, and the
        working memory a matmul plan needs). The note says how close the proposal comes to the limit,
        and which IPUs were given less matmul memory than their largest product needs to run whole.
        """
        memory = self.proposed.memory
        if self.proposed is self.given or not memory.fits:
            return None
        peak = memory.peak
        margin = 1 - peak.total / memory.capacity
        squeezed = [m.ipu for m in memory.ipus if m.matmul_budget < m.matmul_need]
        note = (
            f"The proposal fits by the memory model, not by a measurement: peak {peak.total / MiB:,.0f} MiB "
            f"on IPU {peak.ipu} of {memory.capacity / MiB:,.0f} MiB ({100 * margin:.0f} % left), including "
            f"{MEMORY_CALIBRATION.code_bytes_per_ipu / MiB:.0f} MiB of fitted code per IPU; the model's error is "
            f"±{100 * memory.error:.0f}%. Compile it before relying on it"
        )
        if margin < 1 - ASSUMPTIONS.balance_headroom:
            note += "; it is within the margin Poplar's per-tile placement needs, so it may well not fit"
        if squeezed:
            note += (
                f"; IPU {', '.join(map(str, squeezed))} serialize a matmul to fit their matmul proportion, a "
                "speed the model prices from the memory model alone"
            )
        return note + "."

    def to_dict(self) -> dict[str, Any]:
        return {
            "fit_note": self.fit_note,
            "layers_per_ipu": self.layers_per_ipu,
            "matmul_proportion": self.matmul_proportion,
            "speedup": None if math.isinf(self.speedup) else self.speedup,
            "options_priced": self.options_priced,
            "layouts_timed": self.layouts_timed,
            "given": self.given.to_dict(),
            "proposed": self.proposed.to_dict(),
        }


class _Pricer:
    """Prices one IPU holding a range of layers; results are cached."""

    def __init__(
        self,
        profile: ModelProfile,
        workload: Workload,
        hardware: ChipSpec,
        calibration: Calibration,
        shares: list[int],
    ):
        self.profile, self.workload, self.hardware, self.calibration = (
            profile,
            workload,
            hardware,
            calibration,
        )
        self.layers = [b for b in profile.blocks if b.kind == "layer"]
        first = [b for b in profile.blocks if b.kind != "layer" and b.on_first_ipu]
        # A head tied to the embedding comes back to IPU 0 after the last layer: a last stage there.
        self.returning = [b for b in first if b.kind == "head"] if workload.ipus_per_replica > 1 else []
        self.first = [b for b in first if b not in self.returning]
        self.last = [b for b in profile.blocks if b.kind != "layer" and not b.on_first_ipu]
        self.shares = shares
        # A proposal must fit whatever the memory model's error, and leave Poplar's per-tile margin.
        sure = 1 / (1 + MEMORY_CALIBRATION.error)
        self.limit = min(ASSUMPTIONS.balance_headroom, sure) * hardware.memory_bytes
        self.cache: dict[tuple[int, int, int, bool], _Option | None] = {}

    def blocks(self, ipu: int, start: int, stop: int) -> list[BlockProfile]:
        """The blocks on `ipu` when it holds layers [start, stop)."""
        first = self.first if ipu == 0 else []
        last = self.last if ipu == self.workload.ipus_per_replica - 1 else []
        returning = self.returning if ipu == 0 else []
        return first + self.layers[start:stop] + last + returning

    def _inputs(self, blocks: list[BlockProfile]) -> int:
        names = {b.name for b in blocks}
        here = {b.name: 0 if b.name in names else 1 for b in self.profile.blocks}
        return sum(c.bytes for c in self.profile.crossings(here) if c.target == 0)

    def returns(self, ranges: list[tuple[int, int]]) -> bool:
        """Whether the layout's forward comes back to IPU 0 (a tied head after blocks on later IPUs)."""
        return bool(self.returning) and (bool(self.last) or any(b > a for a, b in ranges[1:]))

    def option(self, ipu: int, start: int, stop: int, returns: bool = True) -> _Option | None:
        """IPU `ipu` holding layers [start, stop), in a layout whose forward comes back to IPU 0 or not
        (the layout search's search assumes it does: only layouts with every layer on IPU 0 do not)."""
        key = (ipu, start, stop, returns)
        if key not in self.cache:
            self.cache[key] = self._price(ipu, start, stop, returns)
        return self.cache[key]

    def _price(self, ipu: int, start: int, stop: int, returns: bool) -> _Option | None:
        blocks = self.blocks(ipu, start, stop)
        later = self.returning if ipu == 0 and returns else []
        own = [b for b in blocks if b not in later]
        depth = self.workload.ipus_per_replica + (1 if returns and self.returning else 0)
        capacity = self.hardware.memory_bytes
        proportions = [0.0] * self.workload.ipus_per_replica
        bare = self.workload.replace(matmul_proportion=tuple(proportions))
        held = self._inputs(later) if later else 0
        mem = ipu_memory(ipu, blocks, self._inputs(own), self.shares[ipu], bare, self.hardware, depth, held)
        room = math.floor(100 * (self.limit - mem.total) / capacity) / 100
        wanted = math.ceil(100 * mem.matmul_need / capacity) / 100
        proportion = max(min(wanted, room), MIN_PROPORTION)
        if proportion > room:
            return None
        proportions[ipu] = proportion
        workload = self.workload.replace(matmul_proportion=tuple(proportions))
        pipeline = (stage_time(ipu, own, workload, self.hardware, self.calibration, ipu, depth),)
        if later:  # the tied head: the last stage, on IPU 0
            pipeline += (stage_time(0, later, workload, self.hardware, self.calibration, depth - 1, depth),)
        trainable = (
            sum(b.trainable_parameters - b.word_embedding_parameters for b in blocks) + self.shares[ipu]
        )
        return _Option(proportion, trainable, pipeline)

    def seconds(self, ranges: list[tuple[int, int]]) -> float:
        """Seconds of one weight update (training) or one host call's compute (inference) of the layout
        whose IPU k holds layers `ranges[k]`, each IPU at the matmul proportion its option chose: what
        `estimate_performance` reports as `update_time` / compute for the same layout."""
        n, w = self.workload.ipus_per_replica, self.workload
        returns = self.returns(ranges)
        options = [self.option(k, a, b, returns) for k, (a, b) in enumerate(ranges)]
        if None in options:
            return math.inf  # some IPU does not fit
        stages = [o.pipeline[0] for o in options] + list(options[0].pipeline[1:])
        placement = self.profile.placement([b - a for a, b in ranges], n)
        copy = copy_time(self.profile, placement, w, self.hardware, self.calibration)
        if not w.training:
            pipelined = w.pipelined_inference and n > 1 and w.device_iterations >= len(stages)
            return sum(inference_cycles(stages, w.device_iterations, copy, pipelined))
        cycles = pipeline_cycles(stages, w.gradient_accumulation_steps, copy)
        trainable = [o.trainable for o in options]
        return sum(cycles) + sum(weight_update_time(trainable, w, self.hardware, self.calibration))


def _cost(option: _Option, training: bool) -> float:
    return option.stage.busy if training else option.stage.forward


def _bottleneck(pricer: _Pricer, n: int, num_layers: int, training: bool) -> float:
    """Smallest achievable cost of the worst IPU (training) or of all IPUs (inference)."""
    combine = max if training else (lambda a, b: a + b)
    best = [math.inf] * (num_layers + 1)
    for stop in range(num_layers + 1):
        option = pricer.option(0, 0, stop)
        best[stop] = _cost(option, training) if option else math.inf
    for ipu in range(1, n):
        new = [math.inf] * (num_layers + 1)
        for start in range(num_layers + 1):
            if math.isinf(best[start]):
                continue
            for stop in range(start, num_layers + 1):
                option = pricer.option(ipu, start, stop)
                if option is None:
                    break  # more layers only need more memory
                new[stop] = min(new[stop], combine(best[start], _cost(option, training)))
        best = new
    return best[num_layers]


def _layouts(pricer: _Pricer, n: int, num_layers: int, cap: float, training: bool):
    """Every layout (as per-IPU (start, stop) ranges) whose stages all cost at most `cap`."""
    found: list[list[tuple[int, int]]] = []

    def extend(ipu: int, start: int, ranges: list[tuple[int, int]], spent: float) -> None:
        if len(found) >= MAX_CANDIDATES:
            return
        stops = [num_layers] if ipu == n - 1 else range(start, num_layers + 1)
        for stop in stops:
            option = pricer.option(ipu, start, stop)
            if option is None:
                break
            cost = _cost(option, training)
            total = max(spent, cost) if training else spent + cost
            if total <= cap:
                if ipu == n - 1:
                    found.append(ranges + [(start, stop)])
                else:
                    extend(ipu + 1, stop, ranges + [(start, stop)], total)

    extend(0, 0, [], 0.0)
    return found


def propose_layout(
    profile: ModelProfile,
    given: Mapping[str, int],
    workload: Workload,
    hardware: ChipSpec,
    *,
    model_name: str = "",
    calibration: Calibration = CALIBRATION,
) -> LayoutProposal:
    """Search `layers_per_ipu` x `matmul_proportion` for the traced `profile` on the workload's IPUs.

    Args:
        profile: the traced model.
        given: the current placement (block name -> IPU), priced beside the proposal.
        workload: the settings to keep (micro-batch, GA, replicas, ...); its layout fields change.
        hardware: the chip.
    """
    n, num_layers = workload.ipus_per_replica, profile.num_layers
    shares = table_shares(profile, given, workload)
    pricer = _Pricer(profile, workload, hardware, calibration, shares)
    given_report = report_for(
        profile, given, workload, hardware, model_name=model_name, calibration=calibration
    )
    best = _bottleneck(pricer, n, num_layers, workload.training)
    candidates = (
        [] if math.isinf(best) else _layouts(pricer, n, num_layers, best * (1 + TOLERANCE), workload.training)
    )

    proposed = given_report
    if candidates:
        ranges = min(candidates, key=pricer.seconds)
        counts = [b - a for a, b in ranges]
        proportions = [pricer.option(k, a, b).proportion for k, (a, b) in enumerate(ranges)]
        report = report_for(
            profile, profile.placement(counts, n), workload.with_matmul_proportion(proportions), hardware,
            model_name=model_name, calibration=calibration,
        )  # fmt: skip
        # Keep the given layout unless the search found a strictly faster one (or it does not fit).
        faster = report.estimated_samples_per_second > given_report.estimated_samples_per_second
        if faster or not given_report.memory.fits:
            proposed = report
    return LayoutProposal(given_report, proposed, len(pricer.cache), len(candidates))
