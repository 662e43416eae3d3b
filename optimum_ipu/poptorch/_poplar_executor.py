"""`trainingModel` / `inferenceModel`: PopTorch's wrapped model, run by optimum-ipu's runtime executables.

A call takes PopTorch's combined batch ([device iteration][accumulation step][replica][micro-batch]
on dim 0 of every input), reorders it to the runtime's layout ([device iteration][replica]
[accumulation step][micro-batch], the one IPUTrainer feeds) and hands it to the same
`TrainingExecutable` / `InferenceExecutable` IPUTrainer uses: one host call, one optimizer step per
device iteration, gradients reduced over accumulation steps and replicas (Mean or Sum). The outputs of
every micro-batch are recorded on the way and returned as PopTorch's `OutputMode` says
(`_outputs.select_outputs`). The loss returned is the forward's value, before loss scaling.

The compiled model runs on its own copy of the weights (`_device_weights`), as PopTorch's runs on the
IPU's: host -> device when it compiles or attaches, at `copyWeightsToDevice()` and, for an inference
model, when a training model of the same module has newer weights; device -> host at
`copyWeightsToHost()` and after every training call.

`PoplarExecutor` holds PopTorch's API and runs compile and calls; each concern is its own file: the
batch arithmetic of a call (`_host_call`), the trace of one micro-batch (`_trace`), the placement
checks and the process layout (`_placement`), the optimizer as PopTorch uses it (`_optimizer_use`),
what a call returns (`_outputs`), the compile report (`_report`), stage processes (`_stages`), saved
executables (`_export`), anchors (`_anchors`), the device's copy of the weights (`_device_weights`), the
inputs a compiled model takes (`_compiled_inputs`) and the IPU's types (`_ipu_types`: int32 and float32
results, float64 computed as float32, half activations with float32 weights computed in half).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.poptorch import _anchors, _export, _outputs, _stages, custom_args, optim
from optimum_ipu.poptorch._compile_hooks import with_compile_hooks
from optimum_ipu.poptorch._compiled_inputs import check_inputs, check_not_zero_sized
from optimum_ipu.poptorch._device_weights import (
    DeviceWeights,
    check_buffers,
    follow_training_model,
    write_to_device,
)
from optimum_ipu.poptorch._executables import build_executable, check_wrap, fp16_compute_of, run_call
from optimum_ipu.poptorch._host_call import HostCall, resolved_output_mode
from optimum_ipu.poptorch._ipu_context import running_model
from optimum_ipu.poptorch._ipu_types import (
    as_fed,
    as_returned,
    mixed_precision,
    weights_follow_activations,
)
from optimum_ipu.poptorch._logging import Error, note_poplar_engine_options
from optimum_ipu.poptorch._offline import is_offline, refuse_offline
from optimum_ipu.poptorch._optimizer_use import (
    apply_reduction_strategy,
    check_constants_kept,
    check_optimizer_parameters,
    constant_hyperparameters,
    hyperparameters,
    training_settings,
    warn_if_subclassed,
)
from optimum_ipu.poptorch._placement import check_placement, plan_stage_processes
from optimum_ipu.poptorch._report import cycle_count, latency, report_of_compile
from optimum_ipu.poptorch._trace import (
    constant_tensors,
    constants_as_traced,
    reference_tensor,
    trace_forward,
    training_flags_kept,
    weights_device,
)
from optimum_ipu.poptorch.enums import OutputMode
from optimum_ipu.poptorch.options import Options
from optimum_ipu.runtime.executor import InferenceExecutable, TrainingExecutable
from optimum_ipu.runtime.fp16_compute import fp16_compute_context
from optimum_ipu.runtime.replicas import ReplicaStreams

__all__ = ["PoplarExecutor", "inferenceModel", "trainingModel"]

NOT_COMPILED = "Model has not been compiled or has been destroyed."

_training_wrappers: weakref.WeakKeyDictionary[nn.Module, PoplarExecutor] = weakref.WeakKeyDictionary()


class _MicroBatchModel(nn.Module):
    """The user's module as the inference executable calls it: a micro-batch dict in, output recorded."""

    def __init__(self, wrapper: PoplarExecutor):
        super().__init__()
        self.model = wrapper._user_model
        self._wrapper = weakref.ref(wrapper)

    def forward(self, **micro: Any) -> None:
        wrapper = self._wrapper()
        wrapper._recorded.append(wrapper._run_user_model(micro))


class PoplarExecutor:
    """A model wrapped by `trainingModel` or `inferenceModel`; call it like the module it wraps."""

    def __init__(self, model: nn.Module, options: Options | None, training: bool, optimizer=None):
        if isinstance(model, PoplarExecutor):  # a wrapped model: wrap its module (PopTorch does the same)
            model = model._user_model
        as_module = getattr(type(model), "_poptorch_module", None)
        if as_module is not None:  # Optimum Graphcore's to_pipelined(model, ipu_config): its module, placed
            model = as_module(model)
        if not isinstance(model, nn.Module):
            raise TypeError(f"poptorch wraps a torch.nn.Module, got {type(model).__name__}.")
        options = options if options is not None else Options()
        if not isinstance(options, Options):
            raise TypeError(f"options must be a poptorch.Options, got {type(options).__name__}.")
        options._check_input_grouping()
        options._freeze()
        self._options = options.clone()
        if self._options.defaultOutputMode():  # PopTorch resolves Default on its copy, not on the user's
            self._options.outputMode(resolved_output_mode(OutputMode.Default, training))
        self._options._freeze()
        self._call = HostCall(self._options, training)  # the batch arithmetic of a call
        self._process_replicas = None
        self._stage_plan: _stages.TracedStages | None = None
        self._stages: _stages.PopTorchStages | None = None
        self._user_model = model
        self._training = training
        if training and model in _training_wrappers:
            raise RuntimeError(
                "Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() on the "
                "model to unwrap before wrapping again."
            )
        optimizer = check_wrap(model, self._options, training, optimizer)
        if training:
            _training_wrappers[model] = self
            # PopTorch sets the strategy when it takes the optimizer: here, and at `setOptimizer`
            apply_reduction_strategy(optimizer, self._options, compiled=False)
        self._optimizer = optimizer
        self._hyperparameters = hyperparameters(optimizer) if optimizer is not None else None
        self._optimizer_constants: dict = {}  # what the compiled program holds as constants (`setOptimizer`)
        self._executable: TrainingExecutable | InferenceExecutable | None = None
        self._attached = False
        self._recorded: list[Any] = []
        self._spec: pytree.TreeSpec | None = None
        self._loss_index: int | None = None
        self._streams: ReplicaStreams | None = None
        # Stochastic rounding's device generators, kept across recompiles as the replicas' streams are
        # (`training_settings` gives them to every optimizer the model takes).
        self._rounding_generators: dict = {}
        self._micro_model = _MicroBatchModel(self)
        self._mixed_precision = False  # inputs and weights of other precisions: weights follow (`_ipu_types`)
        # the layout of this process's replicas when each keeps its own buffers (`broadcastBuffers(False)`)
        self._replica_layout: CallLayout | None = None
        self._recomputed: list[nn.Module] = []  # those recomputed in backward (when recomputation is on)
        # (plain tensor attribute, its value when traced): constants of the compiled model
        self._constants: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.compile_result = None  # the cost model's report of the last compile (optimum-ipu's addition)
        self._calls = 0  # host calls run (getLatency / cycleCount answer for the last one)
        self._anchor_memory: dict[str, torch.Tensor] = {}  # the last call's anchored tensors
        self._device_weights = DeviceWeights(model)  # what the compiled model runs on
        self._host_weights_version = 0  # see `_device_weights.write_to_device`

    # -- the module it wraps ---------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        return self._user_model

    @property
    def options(self) -> Options:
        return self._options

    @property
    def training(self) -> bool:
        return self._training

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._user_model, name)

    def __repr__(self) -> str:
        kind = "trainingModel" if self._training else "inferenceModel"
        return f"poptorch.{kind}({self._user_model!r})"

    # -- running the user's module ----------------------------------------------------------------
    def _run_user_model(self, micro: dict[str, Any]) -> Any:
        leaves = [micro[str(i)] for i in range(len(micro))]
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        replica = 0
        if self._replica_layout is not None:  # each replica's buffers are its own: this micro-batch's replica
            replica = self._replica_layout.replica_of(len(self._recorded))
        with weights_follow_activations(self._mixed_precision), self._device_weights.replica_buffers(replica):
            return self._user_model(*args, **kwargs)

    def _training_loss(self, micro: dict[str, Any]) -> torch.Tensor:
        output = self._run_user_model(micro)
        leaves = pytree.tree_leaves(output)
        if self._loss_index is None:
            frozen = not any(p.requires_grad for p in self._user_model.parameters())
            self._loss_index = _outputs.find_loss(output, frozen)
        loss = leaves[self._loss_index]
        self._recorded.append(_outputs.detached(output))
        return _outputs.loss_for_backward(loss)

    def _reference_tensor(self) -> torch.Tensor | None:
        """The tensor whose device and dtype inputs are fed in (`_trace.reference_tensor`)."""
        return reference_tensor(self._user_model)

    # -- PopTorch's API ------------------------------------------------------------------------------
    @running_model(compiling=True)  # the helpers (for_loop, cond, CPU, ...) see a wrapper at work
    @with_compile_hooks  # poptorch.registerPreCompileHook / registerPostCompileHook
    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Compile for inputs shaped like `args`/`kwargs`: the batch and placement checks, then the executable."""
        custom_args.register_subclasses_in((args, kwargs))  # a registered parser's subclasses too
        leaves, spec = pytree.tree_flatten((args, kwargs))
        self._call.check_batch(leaves)
        check_not_zero_sized(self._user_model, args, kwargs, self._call.inputs.micro_batches)
        constants = constant_tensors(self._user_model)
        as_traced = [t.detach().clone() for t in constants]
        _anchors.check_anchors(self._options.anchored_tensors, self._user_model, self._training)
        self._stage_plan = None
        self._mixed_precision = mixed_precision(self._user_model, leaves)
        self._write_weights_to_device()  # attaching writes the host's weights to the device; the trace runs on them
        # The trace computes fp16 ops as the calls will (a CPU's native fp16 convolution is ~200x slower).
        fp16 = fp16_compute_of(self._user_model, self._mixed_precision) or "native"
        with self._device_weights.in_use(), fp16_compute_context(fp16):
            buffers = [(b, b.detach().clone()) for b in self._user_model.buffers()]
            versions = {name: b._version for name, b in self._user_model.named_buffers()}
            try:
                trace = trace_forward(
                    self._user_model, self._call.micro_batch(leaves), spec, self._training, self._mixed_precision
                )
                updated = [n for n, b in self._user_model.named_buffers() if b._version != versions.get(n)]
            finally:
                # the trace changes no buffer (a forward that updates one runs again on the IPU)
                with torch.no_grad():
                    for buffer, value in buffers:
                        buffer.copy_(value)
        placement = check_placement(self._user_model, trace, self._options, self._training)
        self.num_ipus, self.num_stages = placement.num_ipus, placement.num_stages
        self._recomputed, self._traced = placement.recomputed, trace
        # it runs the forward again, as the calls do
        with weights_follow_activations(self._mixed_precision), fp16_compute_context(fp16):
            self._stage_plan = plan_stage_processes(
                self._user_model, trace, self._options, self._training, placement
            )
        self._call.run_as_stage_processes(self._stage_plan is not None)
        own_buffers = check_buffers(self._options, self._device_weights, updated)
        self._constants = list(zip(constants, as_traced))
        self.compile_result = report_of_compile(
            self._user_model, self._traced, self._options, self._training, self._optimizer, self.num_ipus,
            bool(self._recomputed),
        )  # fmt: skip
        optim.note_compiled(self._optimizer, self._user_model)  # its state_dict() has the device's state now
        if self._training:
            self._optimizer_constants = constant_hyperparameters(
                self._optimizer, self._hyperparameters, bool(self._options.Training.automatic_loss_scaling)
            )
        note_poplar_engine_options()  # where Poplar would read them, building the engine
        self._executable = build_executable(self)  # under torchrun: every process holds process 0's weights
        self._replica_layout = None
        if own_buffers and self._stages is None:  # (stage processes run one replica's pipeline each)
            di, ga, _, _ = self._call.counts()
            self._replica_layout = CallLayout(di, len(self._call.replicas), ga)
            self._device_weights.keep_buffers_per_replica(len(self._call.replicas))
        self._example = _export.example_of(args, kwargs)
        self._attached = not is_offline(self._options)  # an offline target compiles without attaching
        self._loss_index = None

    def compileAndExport(self, filename: str, *args: Any, export_model: bool = True, **kwargs: Any) -> None:
        """Compile for inputs like `args` / `kwargs` (unless compiled already) and save to `filename` for `poptorch.load`.

        The file holds the module, options, optimizer state and input shapes (`_export.py`); with
        `export_model=False`, as on PopTorch, only what `loadExecutable` needs (options, input shapes).
        """
        if args or kwargs or self._executable is None:
            self.compile(*args, **kwargs)
        self._gather_stage_optimizer_state()
        _export.export(self, filename, self._example, export_model)

    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Save the compiled model to `filename` for `poptorch.load` (as `compileAndExport`, without compiling)."""
        if self._executable is None:
            raise Error(NOT_COMPILED)
        self._gather_stage_optimizer_state()
        _export.export(self, filename, self._example, export_model, save_rng_state)

    @property
    def rng_state(self) -> dict:
        """The random state a training model's next call draws from: its replicas' streams and stochastic
        rounding's generators (`poptorch.load` of a `save(..., save_rng_state=True)` file restores it)."""
        if self._executable is None:
            raise Error(NOT_COMPILED)
        state = _export.run_state(self)
        return {"streams": state.get("streams"), "rounding": state.get("rounding")}

    @rng_state.setter
    def rng_state(self, state: dict) -> None:
        if self._executable is None:
            raise Error(NOT_COMPILED)
        _export.restore_run_state(self, state)

    def loadExecutable(self, filename: str, trust_file: bool = False) -> None:
        """Compile this model as the one `compileAndExport` saved to `filename` was (its input shapes).

        The weights are this model's own, as on PopTorch, where attaching writes the host's weights to
        the device: the file supplies the executable, here the compile for those shapes. `trust_file`
        as for `poptorch.load`.
        """
        args, kwargs = _export.example_inputs(_export.read(filename, trust_file=trust_file))
        self.compile(*args, **kwargs)

    def isCompiled(self) -> bool:
        return self._executable is not None

    def isAttachedToDevice(self) -> bool:
        return self._attached

    def detachFromDevice(self) -> None:
        """Release the (simulated) IPUs; the next call attaches again."""
        if self._executable is None:
            raise Error(NOT_COMPILED)
        if not self._attached:
            raise Error("Device is not attached")
        self._gather_stage_optimizer_state()
        self._attached = False

    def _gather_stage_optimizer_state(self) -> None:
        """As stage processes, each process keeps only its stage's optimizer state while training; here
        every process gets every stage's, so a state dict saved on any rank is whole."""
        if self._stages is not None and self._optimizer is not None:
            self._stages.broadcast_optimizer_state(self._optimizer)

    def attachToDevice(self) -> None:
        """Attach again after `detachFromDevice`: as PopTorch's, this writes the host's weights to the device."""
        if self._executable is None:
            raise Error(NOT_COMPILED)
        refuse_offline(self._options, "attach")
        if self._attached:
            raise Error("Device is already attached")
        self._attached = True
        self._write_weights_to_device()

    def getTensorNames(self) -> list[str]:
        """The tensors `opts.anchorTensor` may name: each parameter, and in training its `Gradient___` and
        `UpdatedVar___` (see `_anchors.py`)."""
        if self._executable is None:
            raise AssertionError("Model must be compiled before calling getTensorNames")
        return _anchors.tensor_names(self._user_model, self._training)

    def getAnchoredTensor(self, short_name: str) -> torch.Tensor:
        """The tensor anchored as `short_name`, from the last call."""
        return _anchors.anchored(self._anchor_memory, short_name)

    def getLatency(self) -> tuple[float, float, float]:
        """(min, max, average) seconds per device iteration of the last call: the cost model's estimate
        (there is no IPU to time here; `_report.latency`)."""
        return latency(self.compile_result if self._calls else None, self._options)

    def cycleCount(self) -> int:
        """IPU cycles of the last call (the first replica's), as PopTorch reports with `logCycleCount(True)`:
        the cost model's estimate (`_report.cycle_count`)."""
        return cycle_count(self.compile_result if self._calls else None, self._options, self._executable is not None)

    def copyWeightsToHost(self) -> None:
        """Copy the device's weights and buffers into the module's (`model.parameters()`, its buffers)."""
        if self._executable is None:
            raise Error(NOT_COMPILED)
        self._device_weights.read_to_host()
        self._host_weights_version += 1

    def copyWeightsToDevice(self) -> None:
        """Copy the module's weights and buffers to the device (implicit when the model compiles or attaches)."""
        if self._executable is None:
            raise Error(NOT_COMPILED)
        self._write_weights_to_device()

    def copyNamedBuffersToDevice(self) -> None:
        """Copy the buffers `opts.updatableNamedBuffers([...])` names from the module to the device (the
        others, and the weights, keep their device values)."""
        if self._executable is None:
            raise Error(NOT_COMPILED)
        names = self._options._values.get("updatable_named_buffers")
        if not names:
            raise Error(
                "No named buffers marked as updatable via updatableNamedBuffers option: name them with "
                "opts.updatableNamedBuffers(['name', ...]) before wrapping the model."
            )
        self._device_weights.write_buffers_from_host(names)

    def copyWeightsToHostIfNeeded(self) -> bool:
        """Whether the host's weights were out of date and have been copied: never here, as a training call
        copies them to the host as it ends (PopTorch copies at the host's first read after it)."""
        return False

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True):
        """Load `state_dict` into the module and, when attached, copy it to the device (as PopTorch's)."""
        out = self._user_model.load_state_dict(state_dict, strict)
        if self._executable is not None and self._attached:
            self._write_weights_to_device()
        return out

    def _write_weights_to_device(self) -> None:
        """host -> device (`_device_weights.write_to_device`)."""
        write_to_device(self, _training_wrappers.get(self._user_model))

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Use `optimizer`'s current hyper-parameters from the next call on (PopTorch reads them only here)."""
        if not self._training:
            raise Error("setOptimizer is only for a poptorch.trainingModel.")
        check_optimizer_parameters(self._user_model, optimizer)
        compiled = isinstance(self._executable, TrainingExecutable)
        if compiled:
            check_constants_kept(self._optimizer_constants, optimizer)
        apply_reduction_strategy(optimizer, self._options, compiled=compiled)
        warn_if_subclassed(optimizer)
        self._optimizer = optimizer
        self._hyperparameters = hyperparameters(optimizer)
        if isinstance(self._executable, TrainingExecutable):
            optim.note_compiled(optimizer, self._user_model)
            executable = self._executable
            settings = training_settings(optimizer, self._options, executable.loss_scaler, self._rounding_generators)
            executable.use_optimizer(optimizer, **settings)

    def getOptimizer(self) -> torch.optim.Optimizer | None:
        return self._optimizer

    def destroy(self) -> None:
        """Free the executable (and the module, for wrapping again); a later call compiles again."""
        self._executable = None
        self._attached = False
        self._device_weights.clear()  # the host has the trained weights: every training call copied them
        if self._training and _training_wrappers.get(self._user_model) is self:
            del _training_wrappers[self._user_model]

    @running_model(compiling=False)
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        refuse_offline(self._options, "run")
        custom_args.register_subclasses_in((args, kwargs))
        leaves, self._spec = pytree.tree_flatten((args, kwargs))
        if self._executable is None:
            self.compile(*args, **kwargs)
        else:
            check_inputs(self._user_model.forward, self._example, args, kwargs)  # as compiled: PopTorch's errors
            if not self._attached:
                self.attachToDevice()
        if not self._training:  # PopTorch's implicit copyWeightsToDevice() after a training model's update
            follow_training_model(self, _training_wrappers.get(self._user_model))
        self._call.check_batch(leaves)
        device = weights_device(self._user_model)
        batch = {str(i): as_fed(self._call.to_runtime_layout(leaf), device) for i, leaf in enumerate(leaves)}
        self._recorded = []
        anchors = _anchors.AnchorRecorder(self._user_model, self._options.anchored_tensors)
        try:
            with (
                training_flags_kept(self._user_model),
                constants_as_traced(self._constants),
                self._device_weights.in_use(),
            ):
                recorded = run_call(self, batch, anchors)
        finally:
            self._recorded = []
        if self._training:  # device -> host: PopTorch copies lazily, at the host's first read
            self.copyWeightsToHost()
        self._anchor_memory = anchors.results(*self._call.output_mode())
        self._calls += 1
        di, ga, _, _ = self._call.counts()
        mode, period = self._call.output_mode()
        outputs = _outputs.select_outputs(recorded, di, ga, self._output_count(), mode, period)
        outputs = as_returned(outputs)  # int32 and float32 results, as the IPU has no 64-bit types
        _outputs.refuse_backward(outputs)
        return outputs

    def _output_count(self) -> int:
        """Replicas whose outputs a call returns: this process's, or every replica's for stage processes
        (their inputs held every replica's samples: each process returns what the one-process run does)."""
        return self._options.replication_factor if self._stages is not None else len(self._call.replicas)



def trainingModel(model: nn.Module, options: Options | None = None, optimizer=None) -> PoplarExecutor:
    """Wrap `model` (whose forward returns a loss, alone or among its outputs) for training.

    Each call runs deviceIterations x gradientAccumulation x replicas micro-batches and updates the
    weights once per device iteration; without an optimizer, SGD with lr 0.01 (PopTorch's default).
    """
    return PoplarExecutor(model, options, training=True, optimizer=optimizer)


def inferenceModel(model: nn.Module, options: Options | None = None) -> PoplarExecutor:
    """Wrap `model` for inference: each call runs deviceIterations x replicas micro-batches."""
    return PoplarExecutor(model, options, training=False)
