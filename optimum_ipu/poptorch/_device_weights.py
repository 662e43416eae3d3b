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

__all__ = ["DeviceWeights"]


class DeviceWeights:
    """The device's copy of `model`'s parameters and buffers (empty until `write_from_host`)."""

    def __init__(self, model: nn.Module):
        self.model = model
        # (module, "_parameters" or "_buffers", name) of every slot holding a tensor, and the tensor in it
        self._slots: list[tuple[nn.Module, str, str, torch.Tensor]] = []
        self._device: dict[int, torch.Tensor] = {}  # id(host tensor) -> its device value

    def _tensors(self) -> dict[int, torch.Tensor]:
        """The module's tensors as the slots hold them now, one entry per object (tied weights once)."""
        return {id(t): t for _, _, _, t in self._slots}

    def write_from_host(self) -> None:
        """host -> device: the device copy becomes a copy of the module's current parameters and buffers."""
        self._slots = [
            (module, kind, name, tensor)
            for module in self.model.modules()
            for kind in ("_parameters", "_buffers")
            for name, tensor in getattr(module, kind).items()
            if tensor is not None
        ]
        with torch.no_grad():
            self._device = {key: t.detach().clone() for key, t in self._tensors().items()}

    def read_to_host(self) -> None:
        """device -> host: the module's parameters and buffers take the device's values (in place)."""
        with torch.no_grad():
            for key, tensor in self._tensors().items():
                device = self._device[key]
                if tensor.shape == device.shape and tensor.dtype == device.dtype:
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

        A forward that put a new tensor in a buffer's slot (`self.x = self.x + 1`) leaves the new value
        on the device and the host's tensor back in the slot.
        """
        tensors = self._tensors()
        host = {key: t.data for key, t in tensors.items()}
        for key, t in tensors.items():
            t.data = self._device[key]
        try:
            yield
        finally:
            for module, kind, name, tensor in self._slots:
                slots = getattr(module, kind)
                current = slots.get(name)
                if current is not tensor and current is not None:
                    self._device[id(tensor)] = current.detach()
                    tensor.data = self._device[id(tensor)]
                    slots[name] = tensor
            for key, t in tensors.items():
                self._device[key] = t.data
                t.data = host[key]


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
