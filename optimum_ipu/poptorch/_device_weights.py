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
        self._slots, self._device = [], {}

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
