"""`IPUConfig.to_options()`: the `poptorch.Options` Optimum Graphcore 0.7 built from an IPU config.

The mapping is the original's (its `IPUConfig._to_options`), read from its source and written anew:

| IPU config (current mode's values) | option |
|---|---|
| always | `autoRoundNumIPUs(True)` |
| `replication_factor` / `inference_replication_factor` | `replicationFactor` |
| `device_iterations` / `inference_device_iterations` | `deviceIterations` |
| `gradient_accumulation_steps` (training) | `Training.gradientAccumulation`, Mean reduction |
| `auto_loss_scaling` (training) | `Training.setAutomaticLossScaling(True)` |
| `output_mode` (training; inference always `All`) | `outputMode` |
| `seed` (when set) | `randomSeed` |
| `optimizer_state_offchip`, `replicated_tensor_sharding` (RTS only with replicas) | `TensorLocations.setOptimizerLocation` |
| training / inference | `PipelinedExecution` / `ShardedExecution`, both `AutoStage.AutoIncrement` |
| `matmul_proportion` (one per IPU) | `setAvailableMemoryProportion({"IPU0": ...})` |
| `executable_cache_dir` (unless "" or "disabled") | `enableExecutableCaching` |
| training / inference | `Precision.enableStochasticRounding(True / False)` |
| `enable_half_partials` | `Precision.setPartialsType(torch.half)` |
| `compile_only` | `useOfflineIpuTarget()` |

plus the PopART performance settings the original always set (recorded; they tune a real IPU's
compiler and change nothing here).
"""

from __future__ import annotations

from typing import Any

import torch

from optimum_ipu.overrides import overridden
from optimum_ipu.poptorch import enums
from optimum_ipu.poptorch._logging import no_effect
from optimum_ipu.poptorch.blocks import PipelinedExecution, ShardedExecution
from optimum_ipu.poptorch.options import Options, TensorLocationSettings

__all__ = ["OUTPUT_MODES", "options_from_ipu_config"]

OUTPUT_MODES = {
    "all": enums.OutputMode.All,
    "sum": enums.OutputMode.Sum,
    "final": enums.OutputMode.Final,
    "default": enums.OutputMode.Default,
}

# PopART settings Optimum Graphcore 0.7 set on every config (scheduling, outlining, patterns, engine).
_POPART_SETTINGS: dict[str, Any] = {
    "disableGradAccumulationTensorStreams": True,
    "accumulateOuterFragmentSettings.schedule": 2,  # AccumulateOuterFragmentSchedule.OverlapMemoryOptimized
    "accumulateOuterFragmentSettings.excludedVirtualGraphs": ["0"],
    "outlineThreshold": 10.0,
    "subgraphCopyingStrategy": 1,  # SubgraphCopyingStrategy.JustInTime
    "scheduleNonWeightUpdateGradientConsumersEarly": True,
    "patterns": {"TiedGather": True, "TiedGatherAccumulate": True, "UpdateInplacePrioritiesForIpu": True},
    "engineOptions": {"opt.useAutoloader": "true", "target.syncReplicasIndependently": "true"},
}


def options_from_ipu_config(ipu_config, for_inference: bool = False, compile_only: bool = False) -> Options:
    """The `poptorch.Options` for `ipu_config` in training (default) or inference, as Optimum Graphcore built them.

    Args:
        ipu_config: an `IPUConfig`; its mode is switched for the reading and restored after.
        for_inference: build the inference options (the `inference_*` values, sharded execution,
            every output returned, no stochastic rounding).
        compile_only: compile for an offline IPU target: a model wrapped with these options compiles and
            exports, and calling it raises, as on PopTorch (`_offline.py`).
    """
    with overridden(ipu_config, mode=ipu_config.mode):  # put back after the switch below
        ipu_config.eval() if for_inference else ipu_config.train()
        return _build(ipu_config, for_inference, compile_only)


def _build(cfg, for_inference: bool, compile_only: bool) -> Options:
    opts = Options()
    opts.autoRoundNumIPUs(True)
    opts.replicationFactor(cfg.replication_factor)
    opts.deviceIterations(cfg.device_iterations)
    if not for_inference:
        opts.Training.gradientAccumulation(cfg.gradient_accumulation_steps)
        opts.Training.accumulationAndReplicationReductionType(enums.ReductionType.Mean)
        if cfg.auto_loss_scaling:
            opts.Training.setAutomaticLossScaling(True)
    if cfg.output_mode not in OUTPUT_MODES:
        raise KeyError(
            f"{cfg.output_mode} is not a valid poptorch.OutputMode, supported output modes: {', '.join(OUTPUT_MODES)}"
        )
    opts.outputMode(enums.OutputMode.All if for_inference else OUTPUT_MODES[cfg.output_mode])
    if cfg.seed:
        opts.randomSeed(int(cfg.seed))
    opts.TensorLocations.setOptimizerLocation(
        TensorLocationSettings()
        .useOnChipStorage(not cfg.optimizer_state_offchip)
        .useReplicatedTensorSharding(bool(cfg.replicated_tensor_sharding) and opts.replication_factor > 1)
    )
    strategy = ShardedExecution if for_inference else PipelinedExecution
    opts.setExecutionStrategy(strategy(enums.AutoStage.AutoIncrement))
    if compile_only:
        opts.useOfflineIpuTarget()
    proportion = cfg.matmul_proportion
    if not isinstance(proportion, (list, tuple)):
        proportion = [proportion] * cfg.ipus_per_replica
    opts.setAvailableMemoryProportion({f"IPU{i}": float(proportion[i]) for i in range(cfg.ipus_per_replica)})
    if cfg.executable_cache_dir and cfg.executable_cache_dir != "disabled":
        opts.enableExecutableCaching(cfg.executable_cache_dir)
    opts.Precision.enableStochasticRounding(not for_inference)
    if cfg.enable_half_partials:
        opts.Precision.setPartialsType(torch.half)
    no_effect(
        "IPUConfig.to_options()'s PopART settings",
        f"{', '.join(_POPART_SETTINGS)} tune a real IPU's compiler; they are recorded in opts._Popart.",
    )
    opts._Popart._values.update(_POPART_SETTINGS)
    if for_inference and cfg.explicit_ir_inference:
        opts._Popart._values["enableExplicitIR"] = True
    return opts
