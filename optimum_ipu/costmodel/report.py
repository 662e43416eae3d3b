"""`CompileReport`: the simulated compiler's verdict on a layout, as text, JSON and a picture.

`report_for(profile, placement, workload, hardware)` builds one from a traced profile.

The report is what a user sees after "Compiling Model...": the per-IPU memory table against the
900 MB of each IPU, the estimated throughput of a real IPU system, the pipeline's efficiency and its
bottleneck. `save()` writes `ipu_report.json` and `ipu_report.png` (memory bars and a Gantt chart
of one weight update: fill, steady state and flush on every IPU).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from optimum_ipu._matplotlib import require_matplotlib
from optimum_ipu.costmodel.advice import advise
from optimum_ipu.costmodel.hardware import CALIBRATION, Calibration, ChipSpec
from optimum_ipu.costmodel.memory import CATEGORIES, MemoryReport, MiB, estimate_memory
from optimum_ipu.costmodel.performance import PerformanceReport, estimate_performance
from optimum_ipu.costmodel.profile import ModelProfile
from optimum_ipu.costmodel.workload import Workload

REPORT_JSON = "ipu_report.json"
REPORT_PNG = "ipu_report.png"
_COLOURS = {
    "code": "#9e9e9e", "weights": "#1f77b4", "gradients": "#aec7e8", "optimizer": "#ff7f0e", "stash": "#2ca02c",
    "activations": "#98df8a", "temporaries": "#d62728", "kv_cache": "#9467bd", "update": "#ffbb78",
}  # fmt: skip


@dataclass
class CompileReport:
    """Memory and performance of one layout on the simulated IPU system.

    Attributes:
        memory: per-IPU memory; `memory.raise_if_out_of_memory()` fails like Poplar.
        performance: stage times, schedule and throughput.
        workload: the IPU config's settings the estimates used.
        hardware: the chip.
        allocation: (block name, IPU) in execution order, as the Device Allocation table.
        parameters: parameters of the model.
        model_name: what the report is about (for titles).
        from_cache: the model's trace came from the executable cache (a "Loaded", not "Compiled", model).
        precision: how this backend computes the run's fp16 ops (set by the runtime's compile step).
    """

    memory: MemoryReport
    performance: PerformanceReport
    workload: Workload
    hardware: ChipSpec
    allocation: list[tuple[str, int]] = field(default_factory=list)
    parameters: int = 0
    model_name: str = ""
    from_cache: bool = False
    precision: str = ""

    @property
    def estimated_samples_per_second(self) -> float:
        """Throughput of the whole system (all replicas), samples per second."""
        return self.performance.samples_per_second

    @property
    def layers_per_ipu(self) -> list[int]:
        return [m.layers for m in self.memory.ipus]

    @property
    def warnings(self) -> list[str]:
        return self.memory.warnings + self.performance.notes

    def _header(self) -> str:
        w = self.workload
        mode = "training" if w.training else "inference"
        precision = "fp32" if w.fp32 else "fp16"
        name = f"{self.model_name}: " if self.model_name else ""
        batch = (
            f"micro-batch {w.micro_batch_size} x GA {w.gradient_accumulation_steps} x replicas "
            f"{w.replication_factor} x device iterations {w.device_iterations} = {w.samples_per_call} samples per call"
        )
        return (
            f"{name}simulated {self.hardware.name}, {w.ipus_per_replica} IPUs per replica x "
            f"{w.replication_factor} replicas = {w.total_ipus} IPUs; {mode}, {precision}\n"
            f"Combined batch: {batch}\nLayers per IPU: {self.layers_per_ipu}; matmul proportion: "
            f"{[round(p, 3) for p in w.matmul_proportion]}"
        )

    def _latency_line(self) -> str:
        """The call's latency beside the throughput, and which side bounds it (`performance.call_timing`)."""
        p, ms = self.performance, 1e3
        overlap = (
            "overlapping (asynchronous data loading)"
            if self.workload.async_data_loading
            else "taking turns (synchronous data loading)"
        )
        if p.regime == "IPU-bound":
            advice = "a faster layout speeds it up"
        elif p.stream_time >= p.host_time - p.stream_time:
            # Streams grow with the samples, so more of them per call does not amortise them.
            advice = (
                "the streams bound it (each sample's inputs and outputs over the host links and copied by the "
                "host), which more samples per call do not amortise: fewer bytes per sample (images as bytes, "
                "fewer outputs returned) or more host processes"
            )
        else:
            advice = "more device iterations or a larger micro-batch amortise the host's fixed cost per call"
        return (
            f"Estimated latency: {p.latency * ms:.1f} ms per call of {p.samples_per_call} samples: IPUs "
            f"{p.device_time * ms:.1f} ms, host {p.host_time * ms:.1f} ms, {overlap}. {p.regime}: {advice}"
        )

    def summary(self) -> str:
        """Text for logs: the memory table, the estimated throughput, the bottleneck, warnings."""
        p, w = self.performance, self.workload
        ms = 1e3
        n, depth = w.ipus_per_replica, len(p.stages)

        def line(label: str, s, ipu: int | None) -> str:
            mark = "  <- bottleneck" if ipu == p.bottleneck_ipu and n > 1 else ""
            return (
                f"  {label}: forward {s.forward * ms:7.2f}  recompute {s.recompute * ms:7.2f}  "
                f"backward {s.backward * ms:7.2f}  = {s.busy * ms:7.2f} ms per micro-batch{mark}"
            )

        if depth == n:
            stages = "\n".join(line(f"IPU {s.ipu}", s, s.ipu) for s in p.stages)
        else:  # a tied head's stage shares IPU 0: the stages, then what each shared IPU does in all
            on = {s.ipu: [k for k, t in enumerate(p.stages) if t.ipu == s.ipu] for s in p.stages}
            rows = [  # the bottleneck is marked on the row that holds its IPU's whole work
                line(f"stage {k}, IPU {s.ipu}", s, s.ipu if len(on[s.ipu]) == 1 else None)
                for k, s in enumerate(p.stages)
            ]
            rows += [
                line(f"IPU {total.ipu} (stages {', '.join(map(str, on[total.ipu]))})", total, total.ipu)
                for total in p.ipu_stages
                if len(on[total.ipu]) > 1
            ]
            rows.append(
                f"  ({depth} pipeline stages on {n} IPUs: the head tied to the embedding runs on IPU 0 last)"
            )
            stages = "\n".join(rows)
        if w.training:
            ga = w.gradient_accumulation_steps
            pipeline = (
                f"Pipeline: {len(p.cycles)} cycles per weight update (GA {ga} + 2x{depth} - 2); efficiency "
                f"GA/(GA+2S-2) = {100 * p.pipeline_efficiency:.1f}%; one update {p.update_time * ms:.1f} ms "
                f"(all-reduce {p.allreduce_time * ms:.2f} ms, optimizer {p.optimizer_time * ms:.2f} ms)"
            )
        elif p.pipelined:
            pipeline = (
                f"Pipelined inference: {len(p.cycles)} cycles per call (DI {p.micro_batches} + {depth} - 1); "
                f"efficiency DI/(DI+S-1) = {100 * p.pipeline_efficiency:.1f}%"
            )
        else:
            pipeline = f"Sharded inference: each micro-batch visits the {depth} pipeline stages in turn"
        lines = [
            "-" * 30 + " IPU compile report " + "-" * 30,
            self._header(),
            f"Memory per IPU (MiB; limit {self.memory.capacity / MiB:.0f} MiB = {self.hardware.tiles} tiles x "
            f"{self.hardware.tile_memory_bytes // 1024} KiB):",
            self.memory.table(),
            self.memory.margin_line(),
            f"Estimated throughput: {p.samples_per_second:,.1f} samples/s "
            f"({p.samples_per_call} samples per {p.call_time * ms:.1f} ms call; "
            f"host {p.host_time * ms:.1f} ms); {100 * p.utilisation:.1f}% of peak",
            self._latency_line(),
            "Stage times:",
            stages,
            pipeline,
        ]
        if self.warnings:
            lines += ["Warnings:"] + [f"  - {text}" for text in self.warnings]
        if self.memory.surely_out_of_memory:
            lines += ["OUT OF MEMORY. To make it fit:"] + [f"  - {a}" for a in self.memory.advice]
        elif self.memory.may_not_fit:
            ipus = ", ".join(map(str, self.memory.may_not_fit))
            advice = self.memory.advice
            lines += [
                f"MAY NOT FIT: IPU {ipus} within the memory model's error of the limit (a compile would go ahead"
                + (", warning once). Changes that free memory:" if advice else ", warning once).")
            ]
            lines += [f"  - {a}" for a in advice]
        lines.append("-" * 80)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Everything in the report as JSON-able data."""
        w = self.workload
        return {
            "model": self.model_name,
            "hardware": self.hardware.name,
            "precision": self.precision,
            "training": w.training,
            "fp32": w.fp32,
            "ipus_per_replica": w.ipus_per_replica,
            "replication_factor": w.replication_factor,
            "micro_batch_size": w.micro_batch_size,
            "gradient_accumulation_steps": w.gradient_accumulation_steps,
            "device_iterations": w.device_iterations,
            "samples_per_call": w.samples_per_call,
            "layers_per_ipu": self.layers_per_ipu,
            "matmul_proportion": list(w.matmul_proportion),
            "parameters": self.parameters,
            "allocation": [{"block": name, "ipu": ipu} for name, ipu in self.allocation],
            "estimated_samples_per_second": self.estimated_samples_per_second,
            "pipeline_efficiency": self.performance.pipeline_efficiency,
            "bottleneck_ipu": self.performance.bottleneck_ipu,
            "memory": self.memory.to_dict(),
            "performance": self.performance.to_dict(),
        }

    def save(self, output_dir: str | Path) -> tuple[Path, Path]:
        """Write `ipu_report.json` and `ipu_report.png` into `output_dir`; return their paths."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        json_path = out / REPORT_JSON
        json_path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        png_path = out / REPORT_PNG
        self.plot(png_path)
        return json_path, png_path

    def plot(self, path: str | Path) -> Path:
        """Draw the memory bars and the pipeline Gantt chart into `path` (PNG, matplotlib Agg)."""
        require_matplotlib(str(path))
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, (bars, gantt) = plt.subplots(1, 2, figsize=(14, 5.2), gridspec_kw={"width_ratios": [1, 2]})
        ipus = [m.ipu for m in self.memory.ipus]
        bottom = [0.0] * len(ipus)
        for category in CATEGORIES:
            values = [getattr(m, category) / MiB for m in self.memory.ipus]
            label = category
            if (
                category == "update"
            ):  # the update takes turns with the pipeline's transients: its excess stacks
                values = [max(0.0, m.update - m.activations - m.temporaries) / MiB for m in self.memory.ipus]
                label = "update (beyond activations + temporaries)"
            if category in ("kv_cache", "update") and not any(values):
                continue  # only a generating decoder has a KV cache, only off-chip state an update
            bars.bar(ipus, values, bottom=bottom, label=label, color=_COLOURS[category])
            bottom = [b + v for b, v in zip(bottom, values)]
        limit = self.memory.capacity / MiB
        bars.axhline(limit, color="black", linestyle="--", linewidth=1)
        bars.text(ipus[-1] + 0.4, limit, f"{limit:.0f} MiB", va="bottom", ha="right", fontsize=8)
        bars.set_xticks(ipus, [f"IPU {i}" for i in ipus])
        bars.set_ylabel("MiB")
        bars.set_title("Memory per IPU")
        bars.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=4, frameon=False)

        colours = {"forward": "#1f77b4", "backward": "#ff7f0e"}
        ranges: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for seg in self.performance.timeline():
            ranges.setdefault((seg["ipu"], seg["kind"]), []).append(
                (seg["start"] * 1e3, seg["duration"] * 1e3)
            )
        for (ipu, kind), spans in ranges.items():
            gantt.broken_barh(
                spans, (ipu - 0.4, 0.8), facecolors=colours[kind], edgecolor="white", linewidth=0.2
            )
        gantt.set_yticks(ipus, [f"IPU {i}" for i in ipus])
        gantt.invert_yaxis()
        gantt.set_xlabel("ms")
        what = "one weight update" if self.workload.training else "one micro-batch (sharded)"
        gantt.set_title(
            f"Pipeline, {what}: {self.estimated_samples_per_second:,.0f} samples/s estimated, "
            f"bottleneck IPU {self.performance.bottleneck_ipu}",
            fontsize=10,
        )
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
        gantt.legend(handles, ["forward", "recompute + backward"], fontsize=7, loc="upper center",
                     bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)  # fmt: skip
        fig.suptitle(self.model_name or "IPU compile report", fontsize=11)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return Path(path)


def report_for(
    profile: ModelProfile,
    ipu_of: Mapping[str, int],
    workload: Workload,
    hardware: ChipSpec,
    *,
    model_name: str = "",
    calibration: Calibration = CALIBRATION,
) -> CompileReport:
    """Memory and performance of the traced `profile` placed as `ipu_of` (block name -> IPU)."""
    memory = estimate_memory(profile, ipu_of, workload, hardware)
    memory.advice = advise(profile, ipu_of, workload, hardware, memory)
    performance = estimate_performance(profile, ipu_of, workload, hardware, calibration)
    allocation = [(b.name, ipu_of[b.name]) for b in profile.blocks]
    return CompileReport(memory, performance, workload, hardware, allocation, profile.parameters, model_name)
