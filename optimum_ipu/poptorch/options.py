"""`poptorch.Options`: PopTorch's builder API for how a wrapped model is compiled and run.

Every setter of PopTorch 3.4 exists and returns its object, so chained calls work. The options that
change the arithmetic (device iterations, replicas, gradient accumulation and its reduction, output
mode, seed, execution strategy) are read by the wrappers; the options that tune a real IPU's
compiler or memory (`TensorLocations`, partials type, caching, IPU Model, PopART settings, ...) are
recorded (the cost model reads some of them) and, the first time they are set, a log line says that
they change nothing here. An `Options` passed to a wrapper is frozen: change a `clone()` instead.
"""

from __future__ import annotations

import copy
import difflib
import enum
from typing import Any, ClassVar

import torch

from optimum_ipu._quoting import shown
from optimum_ipu.poptorch import enums
from optimum_ipu.poptorch._logging import no_effect
from optimum_ipu.poptorch.blocks import PipelinedExecution, ShardedExecution, _ExecutionStrategy

__all__ = ["Options", "TensorLocationSettings"]


class _OptionsDict:
    """Named values with attribute access (`opts.device_iterations`), frozen once given to a wrapper.

    `_SETTERS` maps each option a subclass stores to the named setter that checks and stores it, with the
    options that setter takes (`output_mode` and `output_return_period` go to `outputMode` together), so
    `set(name=value)` runs exactly the checks of the named setter; `None`: no `set` for it, the message
    names the setter to call.
    """

    _SETTERS: ClassVar[dict[str, tuple[str, tuple[str, ...]] | str | None]] = {}
    _NAME: ClassVar[str] = ""  # how errors name the object, when not its class name less `Options`

    def __init__(self, **defaults: Any):
        object.__setattr__(self, "_is_frozen", False)
        object.__setattr__(self, "_values", dict(defaults))

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no option or attribute {name!r}.")

    def __setattr__(self, name: str, value: Any) -> None:
        self.checkIsFrozen()
        object.__setattr__(self, name, value)

    def checkIsFrozen(self) -> None:
        if self.__dict__.get("_is_frozen"):
            raise AttributeError("Can't modify frozen Options")

    def set(self, **values: Any) -> None:
        """Set options by name (`opts.set(device_iterations=4)`) through their named setters' checks.

        An unknown name is a `ValueError` naming it, with the closest option names; a value the setter
        refuses raises the setter's error, and then no value of this call is kept.
        """
        self.checkIsFrozen()
        kind = self._NAME or type(self).__name__.strip("_").replace("Options", "") or "Options"
        for name in values:
            if name not in self._SETTERS:
                known = sorted(n for n, entry in self._SETTERS.items() if entry is not None)
                close = difflib.get_close_matches(str(name), known, n=2, cutoff=0.6)
                hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
                raise ValueError(
                    f"{kind} has no option {shown(name)}{hint}: set() takes "
                    f"{', '.join(known) or 'no option; use the setters'}."
                )
            if self._SETTERS[name] is None:
                raise ValueError(f"{kind} option {name!r} has no set(): use {kind}.{_NO_SET[name]}.")
        before = dict(self._values)
        done = set()
        try:
            for name in values:
                setter, names = _setter(self._SETTERS[name], name)
                if setter not in done:
                    done.add(setter)
                    getattr(self, setter)(*[values[n] if n in values else self._values.get(n) for n in names])
        except Exception:
            self._values.clear()
            self._values.update(before)
            raise

    def _store(self, **values: Any) -> None:
        """Store values the calling setter has checked (the setters' one way in)."""
        self.checkIsFrozen()
        self._values.update(values)

    def exists(self, name: str) -> bool:
        return name in self._values

    def _set_frozen(self, frozen: bool) -> None:
        object.__setattr__(self, "_is_frozen", frozen)
        for value in self.__dict__.values():
            if isinstance(value, _OptionsDict):
                value._set_frozen(frozen)

    def _freeze(self) -> None:
        self._set_frozen(True)

    def _unfreeze(self) -> None:
        self._set_frozen(False)

    def toDict(self) -> dict[str, Any]:
        out = dict(self._values)
        for key, value in self.__dict__.items():
            if isinstance(value, _OptionsDict):
                out.update({f"{key.strip('_')}.{k}": v for k, v in value.toDict().items()})
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


# Options stored by a setter that `set()` cannot call with one value: the setter to use instead.
_NO_SET = {"anchored_tensors": "anchorTensor(short_name, long_name, output_mode, output_return_period)"}


def device_seed(options) -> int:
    """The seed of the device's random generators: `randomSeed`'s, else torch's initial seed (which
    `torch.manual_seed` sets). The replicas' random streams and the stochastic rounding draw from them."""
    import torch

    return int(options._values["random_seed"]) if options.exists("random_seed") else torch.initial_seed()


def _setter(entry: tuple[str, tuple[str, ...]] | str, name: str) -> tuple[str, tuple[str, ...]]:
    """A `_SETTERS` entry as (setter, the options it takes): a bare setter name takes the one option."""
    return (entry, (name,)) if isinstance(entry, str) else entry


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive_int(name: str, value: Any) -> int:
    if not _is_positive_int(value):
        raise ValueError(f"{name} must be a positive integer, got {shown(value)}.")
    return value


def _every_n_period(call: str, period: Any) -> int:
    """An `EveryN` output return period: a positive integer, else PopTorch's assertion with the value and the fix."""
    if not _is_positive_int(period):
        raise AssertionError(  # PopTorch's sentence first, then ours
            "EveryN anchor must have output_return_period set to valid positive integer: "
            f"{call} got output_return_period={shown(period)}. Pass the period N >= 1 (the outputs of every "
            "N-th device iteration are returned), e.g. 2."
        )
    return period


def _divisors(value: int) -> str:
    """The group sizes `value` replicas allow, for the errors: "1" or "one of 1, 2, 4"."""
    sizes = [str(d) for d in range(1, value + 1) if value % d == 0]
    return sizes[0] if len(sizes) == 1 else f"one of {', '.join(sizes)}"


def _check_group_divides(group: int, replicas: int) -> None:
    """PopTorch's two checks of an input group size against the replication factor, with the values and the fix."""
    if group > replicas:
        raise ValueError(
            f"input_group_size cannot be larger than replication_factor ({group} > {replicas}): a group is "
            f"made of replicas. Use {_divisors(replicas)}, or set opts.replicationFactor to a multiple "
            f"of {group}."
        )
    if replicas % group:
        raise ValueError(
            f"input_group_size must be a factor of replication_factor ({group} does not divide {replicas}): "
            f"use {_divisors(replicas)}, or set opts.replicationFactor to a multiple of {group}."
        )


def _comm_group_type(value: Any) -> enums.CommGroupType:
    """`value` as a `CommGroupType` (a member, or its integer value as PopTorch accepted); else a `ValueError`."""
    if isinstance(value, enums.CommGroupType):
        return value
    if isinstance(value, int) and not isinstance(value, (bool, enum.Enum)):
        try:
            return enums.CommGroupType(value)
        except ValueError:
            pass
    raise ValueError(
        "input_group_type must be a poptorch.CommGroupType (Consecutive, Orthogonal or NoGrouping), got "
        f"{shown(value)}: pass e.g. poptorch.CommGroupType.Consecutive."
    )


# PopART options the simulated IPU reads (the others are recorded, with a "no effect" note).
_READ_POPART_KEYS = (
    "enableStochasticRounding",
    "partialsTypeMatMuls",
    "convolutionOptions",
    "autoRecomputation",
)


class _PopartOptions(_OptionsDict):
    """Raw PopART session options (`opts._Popart.set(key, value)`): recorded, no effect here."""

    def set(self, key: str, value: Any) -> _PopartOptions:  # type: ignore[override]
        self.checkIsFrozen()
        self._values[key] = value
        if key not in _READ_POPART_KEYS:
            no_effect(f"opts._Popart.set({key!r})", "PopART session options tune a real IPU's compiler.")
        return self

    def setEngineOptions(self, engine_options: dict) -> _PopartOptions:
        no_effect("opts._Popart.setEngineOptions", "Poplar engine options tune a real IPU's compiler.")
        return self.set("engineOptions", dict(engine_options))

    def setPatterns(self, patterns: dict, level: int = 2) -> _PopartOptions:
        no_effect("opts._Popart.setPatterns", "PopART graph patterns tune a real IPU's compiler.")
        return self.set("patterns", dict(patterns))


class _PrecisionOptions(_OptionsDict):
    """`opts.Precision`: fp16 numerics."""

    _SETTERS: ClassVar = {
        "half_float_casting": "halfFloatCasting",
        "running_statistics_always_float": "runningStatisticsAlwaysFloat",
        "floating_point_exceptions": "enableFloatingPointExceptions",
    }

    def __init__(self, popart: _PopartOptions):
        super().__init__(half_float_casting=enums.HalfFloatCastingBehavior.Default,
                         running_statistics_always_float=True)  # fmt: skip
        object.__setattr__(self, "_popart", popart)

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:
        """Round fp16 weight updates stochastically (done by the fp16 optimizers of `poptorch.optim`)."""
        self._popart.set("enableStochasticRounding", bool(enabled))
        return self

    def setPartialsType(self, dtype: torch.dtype) -> _PrecisionOptions:
        """Matmul/conv partials type; the simulated IPU always accumulates in fp32 (at least as accurate)."""
        if dtype not in (torch.float, torch.half):
            raise ValueError(f"setPartialsType takes torch.float or torch.half, got {dtype}.")
        if dtype == torch.half:
            no_effect("Precision.setPartialsType(torch.half)", "matmul partials are accumulated in fp32.")
        self._popart.set("partialsTypeMatMuls", "half" if dtype == torch.half else "float")
        return self

    def enableFloatingPointExceptions(self, enabled: bool) -> _PrecisionOptions:
        no_effect("Precision.enableFloatingPointExceptions", "no IPU floating-point traps to enable.")
        self._store(floating_point_exceptions=bool(enabled))
        return self

    def halfFloatCasting(self, behaviour: enums.HalfFloatCastingBehavior) -> _PrecisionOptions:
        no_effect("Precision.halfFloatCasting", "PyTorch's rule (upcast to fp32) is the one that runs.")
        self._store(half_float_casting=behaviour)
        return self

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:
        no_effect("Precision.runningStatisticsAlwaysFloat", "running statistics keep the buffers' own dtype.")
        self._store(running_statistics_always_float=bool(value))
        return self


class _TrainingOptions(_OptionsDict):
    """`opts.Training`: gradient accumulation and how gradients are reduced."""

    _SETTERS: ClassVar = {
        "gradient_accumulation": "gradientAccumulation",
        "accumulation_and_replication_reduction_type": "accumulationAndReplicationReductionType",
        # PopTorch stores this one under its setter's camelCase name, and programs read it so
        "meanAccumulationAndReplicationReductionStrategy": "setMeanAccumulationAndReplicationReductionStrategy",
        "automatic_loss_scaling": "setAutomaticLossScaling",
        "convolution_dithering": "setConvolutionDithering",
    }

    def __init__(self, popart: _PopartOptions):
        super().__init__(gradient_accumulation=1,
                         accumulation_and_replication_reduction_type=enums.ReductionType.Mean,
                         meanAccumulationAndReplicationReductionStrategy=enums.MeanReductionStrategy.Post,
                         automatic_loss_scaling=False)  # fmt: skip
        object.__setattr__(self, "_popart", popart)

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        """Micro-batches whose gradients are accumulated before each weight update."""
        self._store(gradient_accumulation=_positive_int("gradientAccumulation", gradient_accumulation))
        return self

    def accumulationAndReplicationReductionType(
        self, reduction_type: enums.ReductionType
    ) -> _TrainingOptions:
        """Mean (default) or Sum of the gradients over accumulation steps and replicas."""
        if reduction_type not in (enums.ReductionType.Mean, enums.ReductionType.Sum):
            raise ValueError(
                "accumulationAndReplicationReductionType must be set to poptorch.ReductionType.Mean or "
                f"poptorch.ReductionType.Sum, got {reduction_type!r}."
            )
        self._store(accumulation_and_replication_reduction_type=enums.ReductionType(reduction_type))
        return self

    def setMeanAccumulationAndReplicationReductionStrategy(self, strategy) -> _TrainingOptions:
        """When a Mean reduction divides: read back as `Training.meanAccumulationAndReplicationReductionStrategy`
        (`Post` until set, as on PopTorch). The setting itself changes nothing here, as on PopTorch where
        the optimizer decides: an fp16 `accum_type` keeps the running mean whatever is set (PopTorch
        overrides the option), and an fp32 accumulator sums in fp32 and divides once, which Running
        would match up to fp32 rounding."""
        no_effect("Training.setMeanAccumulationAndReplicationReductionStrategy",
                  "the optimizer decides, as on PopTorch: an fp16 accum_type keeps PopTorch's running mean, "
                  "an fp32 accumulator sums in fp32 and divides once.")  # fmt: skip
        self._store(meanAccumulationAndReplicationReductionStrategy=enums.MeanReductionStrategy(strategy))
        return self

    def setAutomaticLossScaling(self, enabled: bool) -> _TrainingOptions:
        """Adapt the loss scale as PopART's automatic loss scaling does (the optimizer's value starts it)."""
        self._store(automatic_loss_scaling=bool(enabled))
        return self

    def setConvolutionDithering(self, enabled: bool) -> _TrainingOptions:
        no_effect("Training.setConvolutionDithering", "convolution tile layout is not simulated.")
        self._store(convolution_dithering=bool(enabled))
        return self


class _DistributedOptions(_OptionsDict):
    """`opts.Distributed`: which process of a multi-process run this is (read from torchrun's variables)."""

    _PROCESS = ("configureProcessId", ("distributed_process_id", "num_distributed_processes"))
    _SETTERS: ClassVar = {"distributed_process_id": _PROCESS, "num_distributed_processes": _PROCESS}

    def __init__(self):
        import os

        super().__init__(num_distributed_processes=int(os.environ.get("WORLD_SIZE", 1)),
                         distributed_process_id=int(os.environ.get("RANK", 0)))  # fmt: skip

    def disable(self) -> _DistributedOptions:
        self._store(num_distributed_processes=1, distributed_process_id=0)
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> _DistributedOptions:
        import os

        return self.configureProcessId(
            int(os.environ.get(var_process_id, 0)), int(os.environ.get(var_num_processes, 1))
        )

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}.")
        self._store(num_distributed_processes=num_processes, distributed_process_id=process_id)
        return self

    @property
    def processId(self) -> int:
        return self._values["distributed_process_id"]

    @property
    def numProcesses(self) -> int:
        return self._values["num_distributed_processes"]


class TensorLocationSettings(_OptionsDict):
    """Where one kind of tensor lives (on chip, streaming memory, sharded over replicas): recorded only."""

    _SETTERS: ClassVar = {
        "minElementsForOffChip": "minElementsForOffChip",
        "minElementsForReplicatedTensorSharding": "minElementsForReplicatedTensorSharding",
        "onChip": "useOnChipStorage",
        "useReplicatedTensorSharding": "useReplicatedTensorSharding",
        "useIOTilesToLoad": "useIOTilesToLoad",
        "useIOTilesToStore": "useIOTilesToStore",
    }

    def __init__(self):
        super().__init__()

    def _record(self, name: str, value: Any) -> TensorLocationSettings:
        no_effect("TensorLocationSettings", "tensor placement is recorded for the cost model, not simulated.")
        self._store(**{name: value})
        return self

    def minElementsForOffChip(self, min_elements: int):
        return self._record("minElementsForOffChip", min_elements)

    def minElementsForReplicatedTensorSharding(self, min_elements: int):
        return self._record("minElementsForReplicatedTensorSharding", min_elements)

    def useOnChipStorage(self, use: bool = True):
        return self._record("onChip", bool(use))

    def useReplicatedTensorSharding(self, use: bool = True):
        return self._record("useReplicatedTensorSharding", bool(use))

    def useIOTilesToLoad(self, use: bool = True):
        return self._record("useIOTilesToLoad", bool(use))

    def useIOTilesToStore(self, use: bool = True):
        return self._record("useIOTilesToStore", bool(use))


class _TensorLocationOptions(_OptionsDict):
    """`opts.TensorLocations`: placement of activations, weights, optimizer state and accumulators."""

    _NAME = "TensorLocations"
    _SETTERS: ClassVar = {
        "num_io_tiles": "numIOTiles",
        **{f"location_{kind.lower()}": f"set{kind}Location"
           for kind in ("Activation", "Weight", "Optimizer", "Accumulator")},
    }  # fmt: skip

    def numIOTiles(self, num_tiles: int) -> _TensorLocationOptions:
        no_effect("TensorLocations.numIOTiles", "I/O tiles are not simulated.")
        self._store(num_io_tiles=int(num_tiles))
        return self

    def _location(self, kind: str, location: TensorLocationSettings) -> _TensorLocationOptions:
        if not isinstance(location, TensorLocationSettings):
            raise TypeError(
                f"set{kind}Location takes a poptorch.TensorLocationSettings, got {type(location).__name__}."
            )
        self._store(**{f"location_{kind.lower()}": location.toDict()})
        return self

    def setActivationLocation(self, location: TensorLocationSettings):
        return self._location("Activation", location)

    def setWeightLocation(self, location: TensorLocationSettings):
        return self._location("Weight", location)

    def setOptimizerLocation(self, location: TensorLocationSettings):
        return self._location("Optimizer", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings):
        return self._location("Accumulator", location)


class _JitOptions(_OptionsDict):
    """`opts.Jit`: how the model is captured (it runs eagerly here)."""

    _SETTERS: ClassVar = {"trace_model": "traceModel"}

    def __init__(self):
        super().__init__(trace_model=True)

    def traceModel(self, trace_model: bool) -> _JitOptions:
        no_effect("Jit.traceModel", "the model runs eagerly as PyTorch code; nothing is traced or scripted.")
        self._store(trace_model=bool(trace_model))
        return self


# Each option an `Options` stores -> the named setter that checks and stores it (`_Options.set`).
_GROUPING_SETTER = ("inputReplicaGrouping", ("input_group_size", "input_cgt"))
_OUTPUT_SETTER = ("outputMode", ("output_mode", "output_return_period"))
_OPTIONS_SETTERS: dict[str, tuple[str, tuple[str, ...]] | str | None] = {
    "replication_factor": "replicationFactor", "input_group_size": _GROUPING_SETTER, "input_cgt": _GROUPING_SETTER,
    "broadcast_buffers": "broadcastBuffers", "device_iterations": "deviceIterations",
    "auto_round_num_ipus": "autoRoundNumIPUs", "output_mode": _OUTPUT_SETTER, "output_return_period": _OUTPUT_SETTER,
    "available_memory_proportion": "setAvailableMemoryProportion",
    "executable_cache_dir": "enableExecutableCaching", "use_ipu_model": "useIpuModel",
    "anchored_tensors": None, "random_seed": "randomSeed", "ipu_id": "useIpuId",
    "ipu_version": "useOfflineIpuTarget", "connection_type": "connectionType", "sync_pattern": "syncPattern",
    "log_dir": "logDir", "max_repeat_logs": "maxRepeatLogs", "model_name": "modelName",
    "stable_norm": "enableStableNorm", "synthetic_data": "enableSyntheticData",
    "log_cycle_count": "logCycleCount", "profile_dir": "enableProfiling", "progress_bar": "showCompilationProgressBar",
    "relax_optimizer_attributes_checks": "relaxOptimizerAttributesChecks",
    "module_namescope": "_module_namescope", "updatable_named_buffers": "updatableNamedBuffers",
    "source_excludes": "sourceLocationExcludes",
}  # fmt: skip


class Options(_OptionsDict):
    """Everything that controls how `trainingModel` / `inferenceModel` compile and run a model.

    >>> opts = Options().deviceIterations(4)
    >>> _ = opts.Training.gradientAccumulation(2)
    >>> opts.device_iterations, opts.Training.gradient_accumulation
    (4, 2)
    """

    _SETTERS: ClassVar = _OPTIONS_SETTERS

    def __init__(self) -> None:
        popart = _PopartOptions()
        super().__init__(replication_factor=1, input_group_size=1, input_cgt=enums.CommGroupType.Consecutive,
                         broadcast_buffers=True, device_iterations=1, auto_round_num_ipus=False,
                         output_mode=enums.OutputMode.Default, output_return_period=1,
                         available_memory_proportion={}, executable_cache_dir="", use_ipu_model=False,
                         anchored_tensors={}, log_dir=".", max_repeat_logs=4,
                         connection_type=enums.ConnectionType.Always, sync_pattern=enums.SyncPattern.Full)  # fmt: skip
        object.__setattr__(self, "_popart", popart)
        object.__setattr__(self, "_precision", _PrecisionOptions(popart))
        object.__setattr__(self, "_training", _TrainingOptions(popart))
        object.__setattr__(self, "_distributed", _DistributedOptions())
        object.__setattr__(self, "_tensor_locations", _TensorLocationOptions())
        object.__setattr__(self, "_jit", _JitOptions())
        object.__setattr__(self, "_execution_strategy", PipelinedExecution())
        from optimum_ipu.poptorch._options_json import apply_environment  # imports this module

        apply_environment(self)  # POPTORCH_DEFAULT_OPTIONS seeds every Options, as on PopTorch

    # -- sub-objects ---------------------------------------------------------------------------
    @property
    def Training(self) -> _TrainingOptions:
        return self._training

    @property
    def Precision(self) -> _PrecisionOptions:
        return self._precision

    @property
    def Distributed(self) -> _DistributedOptions:
        return self._distributed

    @property
    def TensorLocations(self) -> _TensorLocationOptions:
        return self._tensor_locations

    @property
    def Jit(self) -> _JitOptions:
        return self._jit

    @property
    def _Popart(self) -> _PopartOptions:
        return self._popart

    # -- the batch arithmetic --------------------------------------------------------------------
    def deviceIterations(self, device_iterations: int) -> Options:
        """Iterations the device runs per host call (one weight update each in training)."""
        self._store(device_iterations=_positive_int("deviceIterations", device_iterations))
        return self

    def replicationFactor(self, replication_factor: int) -> Options:
        """Data-parallel replicas of the model (each on its own set of IPUs).

        A multiple of the input group size when `inputReplicaGrouping` was called first (each group is
        whole replicas); from this call on, `inputReplicaGrouping` checks its size against this factor.
        """
        replication_factor = _positive_int("replicationFactor", replication_factor)
        group = self.input_group_size
        if replication_factor % group:
            raise ValueError(
                f"replicationFactor({replication_factor}) must be a multiple of the input_group_size ({group}) "
                f"set by inputReplicaGrouping: each input group is {group} whole replicas. Use a multiple of "
                f"{group}, or call inputReplicaGrouping again with a divisor of {replication_factor}."
            )
        self._store(replication_factor=replication_factor)
        object.__setattr__(self, "_replication_known", True)
        return self

    def inputReplicaGrouping(self, input_group_size: int, input_group_type: enums.CommGroupType) -> Options:
        """Replicas of a group receive the same input; the data per call shrinks by the group size.

        `input_group_size` is a positive integer that divides `replicationFactor` (checked here when the
        factor was set first, else by `replicationFactor` and when the options are used), and
        `input_group_type` a `CommGroupType` other than `All`; `NoGrouping` means a group size of 1, as
        on PopTorch. Anything else is a `ValueError` naming the value and the rule, raised here rather
        than as an arithmetic error in the batch sizes computed from them.
        """
        input_group_type = _comm_group_type(input_group_type)
        if input_group_type == enums.CommGroupType.All:
            raise ValueError(
                "input_group_type cannot be All (every replica would get the same input, which is no split of "
                "the data): use poptorch.CommGroupType.Consecutive or Orthogonal."
            )
        known = self.__dict__.get("_replication_known", False)
        if not _is_positive_int(input_group_size):
            r = self.replication_factor
            fix = f"{_divisors(r)} (a divisor of replicationFactor({r}))" if known else "a divisor of the replication factor"
            raise ValueError(
                "input_group_size must be a positive integer (the number of replicas that receive the same "
                f"input), got {shown(input_group_size)}. Use {fix}; 1 means no grouping."
            )
        if input_group_type == enums.CommGroupType.NoGrouping:  # PopTorch's rule: each replica its own input
            input_group_size, input_group_type = 1, enums.CommGroupType.Consecutive
        if known:
            _check_group_divides(input_group_size, self.replication_factor)
        self._store(input_group_size=input_group_size, input_cgt=input_group_type)
        return self

    def _check_input_grouping(self) -> None:
        """`ValueError` if the input group size does not divide the replication factor (the group size was
        set while the factor was unknown, and `replicationFactor` was never called): read by the DataLoader
        and the wrappers before the batch arithmetic."""
        _check_group_divides(self.input_group_size, self.replication_factor)

    def outputMode(self, output_mode: enums.OutputMode, output_return_period: int | None = None) -> Options:
        """Which micro-batches' outputs a call returns (All, Final, Sum, EveryN with a period, Default)."""
        if not isinstance(output_mode, enums.OutputMode):
            raise TypeError(f"outputMode takes a poptorch.OutputMode, got {shown(output_mode)}.")
        if output_mode == enums.OutputMode.EveryN:
            _every_n_period("outputMode", output_return_period)
        self._store(output_mode=output_mode, output_return_period=output_return_period or 1)
        return self

    def defaultOutputMode(self) -> bool:
        return self.output_mode == enums.OutputMode.Default

    def randomSeed(self, random_seed: int) -> Options:
        """Seed the device's random streams (and, as PopTorch does, torch's host generator)."""
        if not isinstance(random_seed, int):
            raise TypeError(f"randomSeed takes an int, got {shown(random_seed)}.")
        torch.manual_seed(random_seed)
        self._store(random_seed=random_seed)
        return self

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> Options:
        self._store(broadcast_buffers=bool(broadcast_buffers))
        return self

    def setExecutionStrategy(self, strategy: _ExecutionStrategy) -> Options:
        """PipelinedExecution (default), ShardedExecution, or a phased strategy."""
        if not isinstance(strategy, _ExecutionStrategy):
            raise TypeError(f"setExecutionStrategy takes an execution strategy object, got {shown(strategy)}.")
        self.checkIsFrozen()
        object.__setattr__(self, "_execution_strategy", strategy)
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:
        """Round the IPUs requested up to a power of two instead of failing."""
        self._store(auto_round_num_ipus=bool(auto_round_num_ipus))
        return self

    # -- recorded for the cost model, or no effect here -------------------------------------------
    def setAvailableMemoryProportion(self, available_memory_proportion: dict[str, float]) -> Options:
        """Per-IPU share of tile memory for matmul/conv temporaries ({"IPU0": 0.3, ...}): read by the cost model."""
        rule = "setAvailableMemoryProportion takes {'IPU<n>': proportion in (0, 1]}"
        if not isinstance(available_memory_proportion, dict):
            raise TypeError(f"{rule}, got {shown(available_memory_proportion)}.")
        for key, value in available_memory_proportion.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (isinstance(key, str) and key.startswith("IPU")) or not (number and 0 < value <= 1):
                raise ValueError(f"{rule}, got {shown(key)}: {shown(value)}.")
        no_effect(
            "setAvailableMemoryProportion", "it is recorded for the cost model; the arithmetic is unchanged."
        )
        self._store(available_memory_proportion=dict(available_memory_proportion))
        return self

    def _record(self, name: str, why: str, **values: Any) -> Options:
        no_effect(name, why)
        self._store(**values)
        return self

    def enableExecutableCaching(self, path: str) -> Options:
        return self._record("enableExecutableCaching", "nothing is compiled, so there is nothing to cache.",
                            executable_cache_dir=str(path))  # fmt: skip

    def useIpuModel(self, use_model: bool) -> Options:
        return self._record(
            "useIpuModel", "the whole IPU is simulated already.", use_ipu_model=bool(use_model)
        )

    def useIpuId(self, ipu_id: int) -> Options:
        return self._record("useIpuId", "there are no physical IPUs to choose.", ipu_id=int(ipu_id))

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> Options:
        """Compile for an offline IPU of `ipu_version` (connection type `Never`): a wrapped model compiles
        and exports, and calling it raises, as on PopTorch (`_offline.py`)."""
        self.connectionType(enums.ConnectionType.Never)
        self._store(ipu_version=int(ipu_version))
        return self

    def connectionType(self, connection_type: enums.ConnectionType) -> Options:
        """When to attach to IPUs: `Always` and `OnDemand` run alike here; `Never` compiles only (calls raise)."""
        if not isinstance(connection_type, enums.ConnectionType):
            raise TypeError(
                f"connectionType takes a poptorch.ConnectionType (Always, OnDemand or Never), got {shown(connection_type)}."
            )
        if connection_type != enums.ConnectionType.Never:
            no_effect("connectionType", "no IPUs are attached: Always and OnDemand run alike.")
        self._store(connection_type=connection_type)
        return self

    def syncPattern(self, sync_pattern: enums.SyncPattern) -> Options:
        return self._record("syncPattern", "IPU synchronisation is not simulated.", sync_pattern=sync_pattern)

    def logDir(self, log_dir: str) -> Options:
        return self._record("logDir", "no compiler logs are written.", log_dir=str(log_dir))

    def maxRepeatLogs(self, max_lines: int | None) -> Options:
        return self._record("maxRepeatLogs", "no compiler logs are written.", max_repeat_logs=max_lines)

    def modelName(self, name: str) -> Options:
        self._store(model_name=str(name))
        return self

    def enableStableNorm(self, enabled: bool) -> Options:
        return self._record("enableStableNorm", "norms use PyTorch's kernels.", stable_norm=bool(enabled))

    def enableSyntheticData(self, enabled: bool) -> Options:
        return self._record("enableSyntheticData", "host I/O is not simulated.", synthetic_data=bool(enabled))

    def logCycleCount(self, log_cycle_count: bool) -> Options:
        return self._record("logCycleCount", "cycles are estimated by the cost model, not counted.",
                            log_cycle_count=bool(log_cycle_count))  # fmt: skip

    def enableProfiling(self, profile_dir: str | None = None) -> Options:
        return self._record("enableProfiling", "no Poplar profile exists; see the compile report.",
                            profile_dir=profile_dir or "")  # fmt: skip

    def showCompilationProgressBar(self, show: bool = True) -> Options:
        return self._record("showCompilationProgressBar", "nothing is compiled.", progress_bar=bool(show))

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> Options:
        self._store(relax_optimizer_attributes_checks=bool(relax))
        return self

    def disableModuleNamescope(self) -> Options:
        return self._record("disableModuleNamescope", "no graph names are generated.", module_namescope=False)

    def _module_namescope(self, enabled: Any) -> Options:
        """`set(module_namescope=False)`: the one value `disableModuleNamescope()` sets."""
        if enabled is not False:
            raise ValueError(
                f"module_namescope can only be turned off (False, as disableModuleNamescope() does), got {shown(enabled)}."
            )
        return self.disableModuleNamescope()

    def updatableNamedBuffers(self, buffers: list[str]) -> Options:
        self._store(updatable_named_buffers=list(buffers))
        return self

    def sourceLocationExcludes(self, excludes: list[str]) -> Options:
        return self._record(
            "sourceLocationExcludes", "no graph debug info is generated.", source_excludes=list(excludes)
        )

    def appendToLocationExcludes(self, *excludes: str) -> Options:
        return self._record(
            "appendToLocationExcludes", "no graph debug info is generated.", source_excludes=list(excludes)
        )

    def anchorTensor(
        self, short_name: str, long_name: str, output_mode: enums.OutputMode | None = None,
        output_return_period: int | None = 1,
    ) -> None:  # fmt: skip
        """Return the graph tensor `long_name` after each call, as `model.getAnchoredTensor(short_name)`.

        The names are a parameter's, `Gradient___<parameter>` and `UpdatedVar___<parameter>`
        (`model.getTensorNames()` lists them; `_anchors.py` says what each holds); `output_mode` picks
        among the call's iterations as for outputs (None: the model's output mode).
        """
        self.checkIsFrozen()
        if not isinstance(short_name, str) or not isinstance(long_name, str):
            raise TypeError("anchorTensor(short_name, long_name): both names must be strings.")
        if output_mode is not None and not isinstance(output_mode, enums.OutputMode):
            raise TypeError(
                f"anchorTensor: output_mode must be a poptorch.OutputMode or None, got {shown(output_mode)}."
            )
        period = 1
        if output_mode == enums.OutputMode.EveryN:
            call = f"anchorTensor({shown(short_name)}, {shown(long_name)}, EveryN)"
            period = _every_n_period(call, output_return_period)
        self._values["anchored_tensors"][short_name] = (long_name, output_mode, period)

    def loadFromFile(self, filepath: str) -> Options:
        """Apply one setter call per line, written as in a script without the `options.` prefix.

        `deviceIterations(4)`, `Training.gradientAccumulation(2)`,
        `setExecutionStrategy(poptorch.ShardedExecution())`; `#` lines are comments. Each line is read
        as a setter call with literal arguments (`_options_file.py`), never run as Python: anything
        else is a `ValueError` naming the file and the line.
        """
        from optimum_ipu.poptorch._options_file import load_file

        load_file(self, filepath)
        return self

    def from_json(self, string: str) -> Options:
        """Call the setters a JSON object names: `{"deviceIterations": 4, "Training.gradientAccumulation": 2}`.

        A key is a setter's path from the options, a value its argument (a list: its arguments), a string
        `"OutputMode.All"` an enum member (`_options_json.py`); `POPTORCH_DEFAULT_OPTIONS` is read this way.
        Anything else is a `ValueError` naming the key.
        """
        from optimum_ipu.poptorch._options_json import apply_json

        apply_json(self, string, "Options.from_json")
        return self

    def clone(self) -> Options:
        """An unfrozen deep copy (to change options of a model already wrapped, or for a second model)."""
        copied = copy.deepcopy(self)
        copied._unfreeze()
        return copied

    # -- read-only views the wrappers use ----------------------------------------------------------
    @property
    def execution_strategy(self) -> _ExecutionStrategy:
        return self._execution_strategy

    def _is_sharded(self) -> bool:
        return isinstance(self._execution_strategy, ShardedExecution)
