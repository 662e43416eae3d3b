"""The weights a compiled PopTorch model runs on, held apart from the host module's, as on the IPU.

PopTorch keeps the weights (parameters and buffers) on the device: training the host module, or loading
other weights into it, does not change a compiled model until it copies host -> device. That happens when
it compiles and attaches (the first call, `compile`, and every `attachToDevice`, the implicit one of a call
after `detachFromDevice` too), when the user calls `copyWeightsToDevice()` or the wrapper's
`load_state_dict`, and for an inference model before a call once a training model of the same module has
copied newer weights to the host. Device -> host happens at `copyWeightsToHost()` and, for a training
model, after every call (PopTorch copies then lazily, when the host first reads a weight or buffer after
the call; every read sees the same values here).

`DeviceWeights` holds one device tensor per parameter and buffer of the module (one extra copy of the
weights per wrapper; the IPU holds one too). While a call runs (`in_use`), the module's own tensor objects
hold the device values (their `.data` is swapped, not copied), so the executable, the optimizer (its state
is keyed by the parameters), fp32 working copies and anchors see the module they know; after the call
each object gets its host value back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from optimum_ipu.poptorch._ipu_types import device_dtype
from optimum_ipu.poptorch._logging import Error

__all__ = ["DeviceWeights"]


class DeviceWeights:
    """The device's copy of `model`'s parameters and buffers (empty until `write_from_host`)."""

    def __init__(self, model: nn.Module):
        self.model = model
        # (module, "_parameters" or "_buffers", name) of every slot holding a tensor, and the tensor in it
        self._slots: list[tuple[nn.Module, str, str, torch.Tensor]] = []
        self._device: dict[int, torch.Tensor] = {}  # id(host tensor) -> its device value
        self._names: dict[tuple[int, str], str] = {}  # (id(module), slot name) -> the model's name for it
        # replica -> id(host buffer) -> that replica's own value, for replicas 1.. when buffers are not
        # broadcast (replica 0's is `_device`'s, the one copied to the host)
        self._replica_buffers: dict[int, dict[int, torch.Tensor]] = {}
        self._replicas_with_own_buffers = 1

    def _tensors(self) -> dict[int, torch.Tensor]:
        """The module's tensors as the slots hold them now, one entry per object (tied weights once)."""
        return {id(t): t for _, _, _, t in self._slots}

    def write_from_host(self) -> None:
        """host -> device: the device copy becomes a copy of the module's current parameters and buffers."""
        self._names = {
            (id(module), name): f"{prefix}.{name}" if prefix else name
            for prefix, module in self.model.named_modules()
            for name in (*module._parameters, *module._buffers)
        }
        self._slots = [
            (module, kind, name, tensor)
            for module in self.model.modules()
            for kind in ("_parameters", "_buffers")
            for name, tensor in getattr(module, kind).items()
            if tensor is not None
        ]
        with torch.no_grad():  # float64 becomes float32, as on the IPU (`_ipu_types`)
            self._device = {key: t.detach().to(device_dtype(t.dtype), copy=True) for key, t in self._tensors().items()}
        self.keep_buffers_per_replica(self._replicas_with_own_buffers)

    def write_buffers_from_host(self, names: list[str]) -> None:
        """host -> device for the buffers `names` only (PopTorch's `copyNamedBuffersToDevice`), every
        replica's copy of them too."""
        buffers = dict(self.model.named_buffers())
        with torch.no_grad():
            for name in names:
                host = buffers[name]
                self._device[id(host)] = host.detach().to(device_dtype(host.dtype), copy=True)
                for own in self._replica_buffers.values():
                    own[id(host)] = self._device[id(host)].clone()

    def buffer_names(self) -> list[str]:
        """The model's buffer names (what `updatableNamedBuffers` may list)."""
        return [name for name, _ in self.model.named_buffers()]

    def keep_buffers_per_replica(self, replicas: int) -> None:
        """From now on each of `replicas` replicas keeps its own buffers (`broadcastBuffers(False)`), each
        starting from the device's values; a later host -> device write starts them all again from it."""
        self._replicas_with_own_buffers = replicas
        buffers = {id(t): t for _, kind, _, t in self._slots if kind == "_buffers"}
        self._replica_buffers = {
            replica: {key: self._device[key].clone() for key in buffers} for replica in range(1, replicas)
        }

    @contextlib.contextmanager
    def replica_buffers(self, replica: int) -> Iterator[None]:
        """Inside `in_use`: the module's buffers hold replica `replica`'s own values (`keep_buffers_per_replica`).
        Replica 0 runs on the device values themselves, the ones copied to the host."""
        own = self._replica_buffers.get(replica)
        if not own:
            yield
            return
        buffers = {id(t): t for _, kind, _, t in self._slots if kind == "_buffers"}
        shared = {key: t.data for key, t in buffers.items()}
        for key, t in buffers.items():
            t.data = own[key]
        try:
            yield
        finally:
            for key, t in buffers.items():
                own[key] = t.data
                t.data = shared[key]

    def read_to_host(self) -> None:
        """device -> host: the module's parameters and buffers take the device's values (in place)."""
        with torch.no_grad():
            for key, tensor in self._tensors().items():
                device = self._device[key]
                if tensor.shape == device.shape and device.dtype == device_dtype(tensor.dtype):
                    tensor.copy_(device)
                else:  # the host module was cast or resized since: the device's value as it is
                    tensor.data = device.clone()

    def storages(self) -> set[int]:
        """The storage addresses of the device's tensors (an output sharing one is a weight or buffer)."""
        return {t.untyped_storage().data_ptr() for t in self._device.values()}

    def clear(self) -> None:
        """Free the device copy (`destroy`)."""
        self._slots, self._device, self._replica_buffers = [], {}, {}
        self._replicas_with_own_buffers = 1

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """While active, the module's tensor objects hold the device's values; afterwards the device keeps
        what the call left in them (updated weights, buffers) and the objects get their host values back.

        A forward that removes a buffer or parameter from its module, or puts another tensor in its slot
        (`self.x = self.x + 1`), raises PopTorch's error once the block ends (the slot gets its tensor
        back): the IPU's graph has a fixed set of weights, updated in place (`self.x.copy_(...)`).
        """
        tensors = self._tensors()
        host = {key: t.data for key, t in tensors.items()}
        for key, t in tensors.items():
            t.data = self._device[key]
        try:
            yield
        except BaseException:
            self._give_back(tensors, host)
            raise
        changed = self._give_back(tensors, host)
        if changed:
            raise Error(changed)

    def _give_back(self, tensors: dict[int, torch.Tensor], host: dict[int, torch.Tensor]) -> str | None:
        """End of `in_use`: the slots get their tensors back, the device keeps their values, the objects
        their host values; returns PopTorch's message for the first slot the forward emptied or refilled."""
        changed = None
        for kind, label in (("_buffers", "Buffer"), ("_parameters", "Parameter")):
            for module, slot_kind, name, tensor in self._slots:
                if slot_kind != kind:
                    continue
                slots = getattr(module, kind)
                current = slots.get(name)
                if current is tensor:
                    continue
                slots[name] = tensor
                if changed is None:
                    qualified = self._names.get((id(module), name), name)
                    changed = (
                        f"{label} {qualified} is removed from the model when calling the forward method."
                        if current is None
                        else f"{label} {qualified} is reassigned within the model when calling the forward "
                        f"method. This is not supported. Consider using self.{qualified}.copy_(src) to copy "
                        "data from a source tensor, where src is the name of the source tensor."
                    )
        for key, t in tensors.items():
            self._device[key] = t.data
            t.data = host[key]
        return changed

def write_to_device(wrapper, training_model) -> None:
    """host -> device for `wrapper` (a `PoplarExecutor`); an inference model notes the weights of the
    training model of the same module (`training_model`, or None) it now holds.

    `_host_weights_version` counts, on a training model, its copies device -> host; on an inference model,
    it is that count when it last copied host -> device (PopTorch's `_host_weights_version`).
    """
    wrapper._device_weights.write_from_host()
    if not wrapper._training and training_model is not None:
        wrapper._host_weights_version = training_model._host_weights_version


def follow_training_model(wrapper, training_model) -> None:
    """An inference model: take the weights a training model of the same module copied to the host since
    this model last copied host -> device (PopTorch's implicit `copyWeightsToDevice()`)."""
    if training_model is not None and training_model._host_weights_version != wrapper._host_weights_version:
        write_to_device(wrapper, training_model)


BROADCAST_BUFFERS = (
    "PopTorch does not support broadcasting buffers. If your model is able to tolerate buffers becoming out "
    "of sync between replicas, you can disable buffer broadcasting using "
    "poptorch.Options.broadcastBuffers(False)."
)


def check_buffers(options, weights: DeviceWeights, updated: list[str]) -> bool:
    """PopTorch's compile checks on buffers; returns whether each replica keeps its own buffers.

    Args:
        options: the wrapper's `poptorch.Options`.
        weights: the wrapper's device weights (its model's buffer names).
        updated: the buffers the traced forward updated in place (a BatchNorm's running statistics are
            not among them: its op updates them, as PopART's BatchNorm does on the IPU).

    Returns:
        Whether each replica keeps its own buffers: with `broadcastBuffers(False)`, or when the model has
        norm statistics, which each replica's norm op updates from its own micro-batches (the host then
        holds the first replica's, as it does every buffer of a replicated model).

    Raises:
        Error: `updatableNamedBuffers` names a buffer the model lacks; or the forward updates a buffer
            while replicas share their buffers (PopTorch's default, `broadcastBuffers(True)`).
    """
    known = weights.buffer_names()
    for name in options._values.get("updatable_named_buffers") or []:
        if name not in known:
            raise Error(
                f"Invalid updatable buffer {name!r}: opts.updatableNamedBuffers names the model's buffers, "
                f"which are {', '.join(known) or 'none'}."
            )
    replicated = options.replication_factor > 1
    statistics = _norm_statistics(weights.model)
    updated = [name for name in updated if name not in statistics]
    if replicated and updated and options.broadcast_buffers:
        raise Error(f"{BROADCAST_BUFFERS} (updated in forward(): {', '.join(updated)})")
    # Replicas run side by side: each one's norm op updates its own statistics from its own micro-batches
    # (one shared copy would take every replica's updates in turn, the momentum applied R times a step).
    return replicated and (not options.broadcast_buffers or bool(statistics))


def _norm_statistics(model: nn.Module) -> set[str]:
    """The buffers of `model`'s BatchNorm / InstanceNorm modules (running statistics, batch count): the
    norm op keeps them, as PopART's does on the IPU, so updating them is no user buffer update."""
    return {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._NormBase)
        for name, _ in module.named_buffers(recurse=False)
    }
