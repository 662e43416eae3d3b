"""The entry points that take a model: `analyse` (a report on a layout) and `plan_layout` (a better one).

Both trace the model once on the meta device (no weights allocated, the caller's model untouched)
and then run the torch-free models on the profile: `report.report_for` prices one layout,
`layout_search.propose_layout` searches many.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import nn

from optimum_ipu.costmodel.hardware import ChipSpec, chip
from optimum_ipu.costmodel.layout_search import LayoutProposal, propose_layout
from optimum_ipu.costmodel.report import CompileReport, report_for
from optimum_ipu.costmodel.trace import profile_model, sample_inputs_for
from optimum_ipu.costmodel.workload import Workload
from optimum_ipu.pipelining.spec import generic_spec, spec_for
from optimum_ipu.pipelining.stage_plan import StagePlan, build_stage_plan


def model_name_of(model: nn.Module) -> str:
    """A short name for titles: the config's `_name_or_path`, else the class name."""
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return f"{type(model).__name__} ({name})" if name else type(model).__name__


def analyse(
    model: nn.Module,
    plan: StagePlan,
    ipu_config,
    *,
    micro_batch_size: int,
    sample_inputs: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
    image_size: int | None = None,
    hardware: str | ChipSpec = "mk2",
    training: bool = True,
    optimizer: str = "adamw",
    fp32: bool = False,
    cache_dir: str | None = None,
    pipelined_inference: bool = False,
    state_types=None,
) -> CompileReport:
    """Estimate per-IPU memory and throughput of `model` laid out by `plan` under `ipu_config`.

    Args:
        model: the model, real or on the meta device; it is copied to meta, never changed or run.
        plan: its stage plan (which block runs on which IPU).
        ipu_config: an `IPUConfig` (read in its current mode).
        micro_batch_size: samples per micro-batch.
        sample_inputs: one micro-batch; built from the model's config when omitted.
        seq_len: sequence length of the built inputs of a text model.
        image_size: image side of the built inputs of a vision model.
        hardware: "mk2" (IPU-POD, GC200) or "bow".
        training: pipelined training (with backward and optimizer) or sharded inference.
        optimizer: "adamw", "adam", "lamb" or "sgd" (what optimizer state to hold).
        fp32: compute in fp32 instead of fp16.
        cache_dir: keep the traced profile in this folder (the IPU config's `executable_cache_dir`),
            so analysing the same model, layout and inputs again skips the trace; None: no cache.
        pipelined_inference: price inference as pipelined (PopTorch's default) instead of sharded.
        state_types: the optimizer's state types (`workload.StateTypes`); Optimum Graphcore's when None.

    Returns:
        A `CompileReport` (`report.from_cache` tells whether the trace was reused);
        `report.memory.raise_if_out_of_memory()` fails like Poplar.
    """
    workload = Workload.from_ipu_config(
        ipu_config, micro_batch_size=micro_batch_size, training=training, optimizer=optimizer, fp32=fp32,
        ipus_per_replica=plan.ipus_per_replica, pipelined_inference=pipelined_inference, state_types=state_types,
    )  # fmt: skip
    if sample_inputs is None:
        sample_inputs = sample_inputs_for(model, micro_batch_size, seq_len, image_size)
    return analyse_workload(model, plan, workload, sample_inputs, hardware=hardware, cache_dir=cache_dir)


def analyse_workload(
    model: nn.Module,
    plan: StagePlan,
    workload: Workload,
    sample_inputs: Mapping[str, Any],
    *,
    hardware: str | ChipSpec = "mk2",
    cache_dir: str | None = None,
) -> CompileReport:
    """`analyse` for a `Workload` built by the caller: PopTorch's wrappers build theirs from
    `poptorch.Options`, `analyse` from an `IPUConfig`. `sample_inputs` is one micro-batch."""
    profile, from_cache = _profile(
        model, plan, sample_inputs, workload.training, workload.float_bytes, cache_dir
    )
    ipu_of = {block.name: block.ipu for block in plan.blocks}
    report = report_for(profile, ipu_of, workload, chip(hardware), model_name=model_name_of(model))
    return dataclasses.replace(report, from_cache=from_cache)


def _profile(model, plan, sample_inputs, training: bool, float_bytes: int, cache_dir: str | None):
    """Trace `model`, or reuse a trace stored under everything it depends on (the executable cache)."""
    if not cache_dir:
        return profile_model(model, plan, sample_inputs, training=training, float_bytes=float_bytes), False
    from optimum_ipu.costmodel.cache import load_profile, profile_key, save_profile

    config = getattr(model, "config", None)
    owner: dict[int, str] = {}
    tied = []  # which parameters are one tensor (a tied LM head): the module tree does not show it
    for name, param in model.named_parameters(remove_duplicate=False):
        tied += [(name, owner[id(param)])] if id(param) in owner else []
        owner.setdefault(id(param), name)
    key = profile_key(
        config=config.to_dict() if hasattr(config, "to_dict") else None,
        tied=tied,
        structure=repr(model),  # module tree, including serialized embeddings and layer placement wrappers
        blocks=[(b.name, b.kind, list(b.modules)) for b in plan.blocks],
        inputs={k: (list(v.shape), str(v.dtype)) for k, v in sample_inputs.items() if hasattr(v, "shape")},
        training=training, float_bytes=float_bytes,
    )  # fmt: skip
    profile = load_profile(key, cache_dir)
    if profile is not None:
        return profile, True
    profile = profile_model(model, plan, sample_inputs, training=training, float_bytes=float_bytes)
    save_profile(key, profile, cache_dir)
    return profile, False


def plan_layout(
    model: nn.Module,
    ipu_config,
    *,
    micro_batch_size: int,
    sample_inputs: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
    image_size: int | None = None,
    hardware: str | ChipSpec = "mk2",
    training: bool = True,
    optimizer: str = "adamw",
    fp32: bool = False,
    ipus_per_replica: int | None = None,
) -> LayoutProposal:
    """Trace `model` once and propose the fastest layout that fits on `ipus_per_replica` IPUs.

    Arguments are those of `analyse`; `ipus_per_replica` defaults to the config's. The proposed
    placement is rebuilt with `build_stage_plan`, the same rule `parallelize()` applies.
    """
    spec = chip(hardware)
    workload = Workload.from_ipu_config(
        ipu_config, micro_batch_size=micro_batch_size, training=training, optimizer=optimizer, fp32=fp32,
        ipus_per_replica=ipus_per_replica,
    )  # fmt: skip
    n = workload.ipus_per_replica
    cut = spec_for(model) or generic_spec(model)
    layers = getattr(ipu_config, "layers_per_ipu", None) or [-1]
    if len(layers) != n and any(count != -1 for count in layers):
        layers = [-1]  # the config's layout is for another pipeline length: start from an even split
    plan = build_stage_plan(model, cut, layers, n)
    if sample_inputs is None:
        sample_inputs = sample_inputs_for(model, micro_batch_size, seq_len, image_size)
    profile = profile_model(model, plan, sample_inputs, training=training, float_bytes=workload.float_bytes)
    given = {b.name: b.ipu for b in plan.blocks}
    name = model_name_of(model)
    proposal = propose_layout(profile, given, workload, spec, model_name=name)
    # The final placement comes from the same rule `parallelize()` applies.
    rebuilt = build_stage_plan(model, cut, proposal.layers_per_ipu, n)
    placement = {b.name: b.ipu for b in rebuilt.blocks}
    proposal.proposed = report_for(profile, placement, proposal.proposed.workload, spec, model_name=name)
    return proposal
