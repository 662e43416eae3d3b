"""What a generation costs on the IPUs: the encoder once per batch, then the decoder once per token.

Optimum Graphcore generated with an encoder-decoder model (BART, T5, MT5, Whisper) as two programs
on IPUs of their own: `split_encoder_decoder_ipu_config` gives the encoder the first IPUs its layers
fill and the decoder the rest. Generating a batch of B sources with K beams up to `max_length` tokens
(the decoder's start token included) runs

* the encoder program once, on the B sources: one host call;
* the decoder program `max_length - 1` times, one host call per token, on B x K rows: each call reads
  the last token of every row and the encoder's output from the host, attends over a KV cache of
  `max_length` positions (static shapes: every call costs the same) and returns the next-token logits.

So a batch takes `encoder + (max_length - 1) x step` seconds when no row ends early (a batch whose
rows all end after n tokens stops after n steps: `encoder + n x step`). With Optimum Graphcore's
`on_device_generation_steps` k the decoder's program loops k steps on the IPUs per host call (its
device iterations; each step's inputs are streamed in, repeated k times, and the tokens chosen on the
IPUs come back instead of the logits): `(max_length - 1) // k` calls of k tokens each, stopping short
of `max_length` when k does not divide it, as the original did. Both calls are priced by the
models every other estimate uses (`performance.estimate_performance` on the programs' traced
profiles, `decoding_trace.py`): the host's fixed cost per call, its streams, the sharded walk over
each program's IPUs. The memory of the decoder's IPUs holds the KV cache: per decoder layer
2 x (B x K) x `max_length` x heads x head size x bytes per element (heads x head size is `d_model`
for BART and Whisper), plus the cross-attention cache over the source with `cross_cache`.

Left out: the host's own work between steps (beam scoring, logits processors), the one-off copy of
the weights to the IPUs, the filling of the cross-attention cache once per batch, and
`use_encoder_output_buffer` (the encoder's output kept on the decoder's IPUs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from optimum_ipu.costmodel.hardware import CALIBRATION, Calibration, ChipSpec
from optimum_ipu.costmodel.memory import MemoryReport, MiB, _warnings
from optimum_ipu.costmodel.profile import HOST, ModelProfile, Transfer
from optimum_ipu.costmodel.report import CompileReport, report_for
from optimum_ipu.costmodel.workload import Workload


@dataclass(frozen=True)
class GenerationSettings:
    """How the batch is generated, in `Seq2SeqTrainingArguments`' terms.

    Attributes:
        max_length: `generation_max_length`: tokens per generated sequence, the decoder's start token
            included; also the length of the KV cache. The decoder runs `max_length - 1` times.
        num_beams: `generation_num_beams`: the decoder runs on batch x beams rows.
        cross_cache: Optimum Graphcore's `use_cross_cache`: the cross-attention keys and values over
            the encoder's output are computed once per batch and cached, instead of every step.
        on_device_steps: Optimum Graphcore's `on_device_generation_steps`: tokens chosen on the IPUs
            per host call (0: one call per token, the next token chosen on the host).
    """

    max_length: int
    num_beams: int = 1
    cross_cache: bool = False
    on_device_steps: int = 0

    def __post_init__(self):
        if self.max_length < 2:
            raise ValueError(
                f"--generation_max_length {self.max_length}: a generation needs at least 2 positions (the decoder's "
                "start token and one generated token); give 2 or more."
            )
        if self.num_beams < 1:
            raise ValueError(f"--num_beams {self.num_beams}: give 1 (greedy) or more beams.")
        if not 0 <= self.on_device_steps <= self.steps:
            raise ValueError(
                f"--on_device_generation_steps {self.on_device_steps}: a generation to --generation_max_length "
                f"{self.max_length} has {self.steps} decoder steps; give 0 (one host call per token) to {self.steps}."
            )

    @property
    def steps(self) -> int:
        """Decoder steps of a generation that runs to `max_length`."""
        return self.max_length - 1

    @property
    def tokens_per_call(self) -> int:
        """Decoder steps in one host call."""
        return self.on_device_steps or 1

    @property
    def calls(self) -> int:
        """Decoder host calls of a batch: whole calls only (k steps each), stopping short of `max_length`."""
        return self.steps // self.tokens_per_call

    @property
    def tokens(self) -> int:
        """Tokens a batch's rows get (the start token not counted) when none ends early."""
        return self.calls * self.tokens_per_call


@dataclass
class GenerationProfiles:
    """The traced programs of a generation (`decoding_trace.py`), as torch-free data.

    Attributes:
        encoder: one forward of the encoder on the batch; the decoder's blocks cost nothing.
        step: one decoder call on batch x beams rows; the encoder's blocks cost nothing.
        kv_cache_bytes: bytes of KV cache each decoder layer keeps, in decoder-layer order.
        returned_bytes: bytes a decoder step returns to the host when it is not its logits (the tokens
            chosen on the IPUs with `on_device_generation_steps`); None: the traced outputs.
    """

    encoder: ModelProfile
    step: ModelProfile
    kv_cache_bytes: list[int]
    returned_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "encoder": self.encoder.to_dict(),
            "step": self.step.to_dict(),
            "kv_cache_bytes": self.kv_cache_bytes,
            "returned_bytes": self.returned_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GenerationProfiles:
        return cls(
            ModelProfile.from_dict(data["encoder"]),
            ModelProfile.from_dict(data["step"]),
            list(data["kv_cache_bytes"]),
            data.get("returned_bytes"),
        )


@dataclass
class _Program(ModelProfile):
    """A program's part of a traced profile, returning `returned_bytes` to the host if given."""

    returned_bytes: int | None = None

    @property
    def output_bytes(self) -> int:
        return super().output_bytes if self.returned_bytes is None else self.returned_bytes


def program(profile: ModelProfile, returned_bytes: int | None = None) -> ModelProfile:
    """The part of `profile` one program runs: the blocks that did any work in its trace (with their
    parameters) and the tensors between them or from the host.

    A block both programs use (BART's and T5's shared word embedding) is in both; its other parameters
    (BART's encoder positions) are then counted on the decoder's first IPU as well, a few MB at most.
    `returned_bytes`: what a call returns to the host, if not the outputs no block reads.
    """
    ran = [b for b in profile.blocks if b.forward_flops or b.other_ops or b.matmuls or b.embedding_lookups]
    names = {b.name for b in ran}
    transfers: list[Transfer] = [
        t for t in profile.transfers if t.consumer in names and (t.producer in names or t.producer == HOST)
    ]
    return _Program(ran, transfers, profile.micro_batch_size, profile.float_bytes, profile.input_bytes,
                    profile.training, returned_bytes)  # fmt: skip


@dataclass
class GenerationReport:
    """The estimate of a generation: both programs' reports and the time of a batch.

    Attributes:
        settings: max length, beams, cross cache.
        batch_size: sources per batch (per replica).
        encoder, decoder: the compile reports of the encoder program (one call per batch) and of the
            decoder program (one call per token), each on its own IPUs.
        encoder_ipus: IPUs of the replica the encoder takes (the decoder's are the next ones).
        memory: both programs' per-IPU memory, numbered as the replica's IPUs; the decoder's include
            its KV cache.
        model_name: what the estimate is about.
    """

    settings: GenerationSettings
    batch_size: int
    encoder: CompileReport
    decoder: CompileReport
    encoder_ipus: int
    memory: MemoryReport
    model_name: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def replicas(self) -> int:
        return self.encoder.workload.replication_factor

    @property
    def encoder_time(self) -> float:
        """Seconds of the encoder's host call, once per batch."""
        return self.encoder.performance.call_time

    @property
    def call_time(self) -> float:
        """Seconds of one decoder host call (one token, or `on_device_steps` tokens)."""
        return self.decoder.performance.call_time

    @property
    def step_time(self) -> float:
        """Seconds per generated token: a decoder call over the tokens it makes."""
        return self.call_time / self.settings.tokens_per_call

    @property
    def batch_time(self) -> float:
        """Seconds to generate one batch to `max_length`: encoder + calls x call (max_length - 1 steps
        of one token each by default)."""
        return self.encoder_time + self.settings.calls * self.call_time

    @property
    def samples_per_second(self) -> float:
        """Sources the whole system turns into sequences per second (all replicas)."""
        return self.batch_size * self.replicas / self.batch_time

    @property
    def tokens_per_second(self) -> float:
        """Tokens generated per second (all replicas; the best beam's only)."""
        return self.samples_per_second * self.settings.tokens

    def summary(self) -> str:
        """Text for the terminal: the programs, the memory table, the time of a batch."""
        s, ms = self.settings, 1e3
        enc, dec = self.encoder.workload, self.decoder.workload
        last = self.encoder_ipus + dec.ipus_per_replica - 1
        precision = "fp32" if enc.fp32 else "fp16"
        name = f"{self.model_name}: " if self.model_name else ""
        rows = self.batch_size * s.num_beams
        k = s.tokens_per_call
        per_call = "once per token" if k == 1 else f"once per {k} tokens, chosen on the IPUs"
        calls = f"{s.calls} tokens x {self.call_time * ms:.2f} ms" if k == 1 else (
            f"{s.calls} calls x {self.call_time * ms:.2f} ms for {s.tokens} tokens"
            + (f" (stopping {s.steps - s.tokens} short of generation_max_length)" if s.tokens < s.steps else "")
        )  # fmt: skip

        def device(report: CompileReport) -> float:
            p = report.performance
            return p.call_time - p.host_time

        lines = [
            "-" * 28 + " IPU generation estimate " + "-" * 27,
            f"{name}simulated {self.encoder.hardware.name}, {enc.ipus_per_replica + dec.ipus_per_replica} IPUs per "
            f"replica x {self.replicas} replicas; generation, {precision}",
            f"Batch of {self.batch_size} x {s.num_beams} beams = {rows} rows; generation_max_length {s.max_length} "
            f"(KV cache of {s.max_length} positions); cross-attention keys/values "
            + ("cached once per batch (use_cross_cache)" if s.cross_cache else "recomputed every step"),
            f"Encoder: IPUs 0-{self.encoder_ipus - 1}, layers {self.encoder.layers_per_ipu}; once per batch: "
            f"{self.encoder_time * ms:.2f} ms per call (IPUs {device(self.encoder) * ms:.2f} ms, host "
            f"{self.encoder.performance.host_time * ms:.2f} ms)",
            f"Decoder: IPUs {self.encoder_ipus}-{last}, layers {self.decoder.layers_per_ipu}; {per_call}: "
            f"{self.call_time * ms:.2f} ms per call (IPUs {device(self.decoder) * ms:.2f} ms, host "
            f"{self.decoder.performance.host_time * ms:.2f} ms)",
            f"Memory per IPU (MiB; limit {self.memory.capacity / MiB:.0f} MiB):",
            self.memory.table(),
            f"Per batch: encoder {self.encoder_time * ms:.1f} ms + {calls} = {self.batch_time:.3f} s; "
            f"{self.step_time * ms:.2f} ms per token (rows that all end after n tokens: encoder + n x that)",
            f"Estimated throughput: {self.samples_per_second:,.2f} samples/s, {self.tokens_per_second:,.1f} tokens/s",
        ]
        warnings = self.memory.warnings + self.notes
        if warnings:
            lines += ["Warnings:"] + [f"  - {text}" for text in warnings]
        if not self.memory.fits:
            lines += ["OUT OF MEMORY. To make it fit:"] + [f"  - {a}" for a in self.memory.advice]
        lines.append("-" * 80)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "model": self.model_name,
            "generation": asdict(self.settings)
            | {"steps": self.settings.steps, "calls": self.settings.calls, "tokens": self.settings.tokens},
            "batch_size": self.batch_size,
            "replication_factor": self.replicas,
            "encoder_ipus": self.encoder_ipus,
            "encoder_seconds": self.encoder_time,
            "call_seconds": self.call_time,
            "token_seconds": self.step_time,
            "batch_seconds": self.batch_time,
            "estimated_samples_per_second": self.samples_per_second,
            "estimated_tokens_per_second": self.tokens_per_second,
            "memory": self.memory.to_dict(),
            "encoder": self.encoder.to_dict(),
            "decoder": self.decoder.to_dict(),
        }


def _program_workload(ipu_config, micro_batch: int, fp32: bool, device_iterations: int = 1) -> Workload:
    # Generation calls each program with one batch at a time, as Optimum Graphcore's pipeline() sets
    # (inference_device_iterations = 1), but for the decoder's on-device steps; each program runs
    # sharded over its IPUs.
    workload = Workload.from_ipu_config(ipu_config, micro_batch_size=micro_batch, training=False, fp32=fp32)
    return workload.replace(device_iterations=device_iterations)


def estimate_generation(
    profiles: GenerationProfiles,
    ipu_config,
    settings: GenerationSettings,
    *,
    batch_size: int,
    hardware: ChipSpec,
    fp32: bool = False,
    model_name: str = "",
    calibration: Calibration = CALIBRATION,
) -> GenerationReport:
    """Price a generation of `batch_size` sources under `ipu_config` (an `IPUConfig` in inference mode).

    Raises:
        IPUConfigError: the layout cannot be split into the encoder's IPUs and the decoder's
            (`split_encoder_decoder_ipu_config`'s message).
    """
    from optimum_ipu.pipelining.encoder_decoder import split_encoder_decoder_ipu_config

    encoder, step = program(profiles.encoder), program(profiles.step, profiles.returned_bytes)
    encoder_config, decoder_config = split_encoder_decoder_ipu_config(
        ipu_config, encoder.num_layers, step.num_layers
    )
    cut = encoder_config.ipus_per_replica
    reports = []
    programs = [(encoder, encoder_config, batch_size, 1),
                (step, decoder_config, batch_size * settings.num_beams, settings.tokens_per_call)]  # fmt: skip
    for profile, config, rows, iterations in programs:
        workload = _program_workload(config, rows, fp32, iterations)
        placement = profile.placement(config.layers_per_ipu, workload.ipus_per_replica)
        reports.append(report_for(profile, placement, workload, hardware, model_name=model_name,
                                  calibration=calibration))  # fmt: skip
    encoder_report, decoder_report = reports

    # The decoder's layers keep their KV caches where they run; then both programs' IPUs as the replica's.
    placement = dict(decoder_report.allocation)
    layers = [b.name for b in step.blocks if b.kind == "layer"]
    for name, nbytes in zip(layers, profiles.kv_cache_bytes):
        decoder_report.memory.ipus[placement[name]].kv_cache += nbytes
    if not decoder_report.memory.fits:
        decoder_report.memory.advice = decoder_report.memory.advice + _kv_cache_advice(
            decoder_report, settings
        )
    ipus = list(encoder_report.memory.ipus) + [
        replace(m, ipu=m.ipu + cut) for m in decoder_report.memory.ipus
    ]
    memory = MemoryReport(ipus, hardware.memory_bytes, hardware.tiles, hardware.tile_memory_bytes)
    memory.warnings = _warnings(memory)
    memory.advice = [f"encoder's program (IPUs 0-{cut - 1}): {a}" for a in encoder_report.memory.advice] + [
        f"decoder's program (IPUs {cut}-{len(ipus) - 1}, its own 0-{len(ipus) - cut - 1}): {a}"
        for a in decoder_report.memory.advice
    ]
    notes = encoder_report.performance.notes + decoder_report.performance.notes
    return GenerationReport(
        settings, batch_size, encoder_report, decoder_report, cut, memory, model_name, notes
    )


def _kv_cache_advice(report: CompileReport, settings: GenerationSettings) -> list[str]:
    """The KV cache's own levers, for a decoder out of memory (the layout advice was priced without it)."""
    over = [m for m in report.memory.ipus if m.total > report.memory.capacity]
    worst = max(over, key=lambda m: m.kv_cache)
    if not worst.kv_cache:
        return []
    return [
        f"the KV cache takes {worst.kv_cache / MiB:.0f} MiB on IPU {worst.ipu}, in proportion to batch x beams x "
        f"generation_max_length ({settings.num_beams} beams, {settings.max_length} positions): fewer beams, a "
        "shorter generation_max_length or a smaller batch shrink it"
    ]
