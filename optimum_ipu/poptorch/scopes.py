"""PopTorch's scopes that annotate the ops run inside them: `MultiConv` and `NameScope`.

Neither changes a value. On an IPU a `MultiConv` plans its data-independent convolutions as one
PopLibs multi-convolution that runs them in parallel, and a `NameScope` prefixes the names of its ops
in the compiled graph. Here the convolutions run one after another as ordinary ones and ops have no
names; both are accepted, keep PopTorch's argument checks, and say once that they have no effect. A
`NameScope` opens and closes the same name scope as `torch.ops.poptorch.push_name_scope` /
`pop_name_scope` (`attributes.py`), so the scopes a program opens either way stay balanced.
Inside a wrapper a `MultiConv` also keeps PopTorch's compile checks on its scope (not nested, at least
one convolution, one per-convolution setting per convolution).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from optimum_ipu.poptorch._ipu_context import current
from optimum_ipu.poptorch._logging import Error, no_effect
from optimum_ipu.poptorch.attributes import pop_name_scope, push_name_scope
from optimum_ipu.poptorch.enums import MultiConvPlanType

__all__ = ["MultiConv", "NameScope"]

_CONVOLUTIONS = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "convolution"}  # fmt: skip
_SCHEDULING = "the convolutions run one after another as ordinary convolutions; the values are the same."
_open_multi_convs: list[MultiConv] = []


class _CountConvolutions(TorchFunctionMode):
    """Counts the convolutions called while it is active (`nn.Conv2d` calls `F.conv2d`, which is one)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in _CONVOLUTIONS:
            self.count += 1
        return func(*args, **(kwargs or {}))


class MultiConv:
    """Run the data-independent convolutions called in this scope as one multi-convolution (`with MultiConv():`).

    The setters take one value for every convolution or a list with one per convolution, and return
    `self` for chaining: `MultiConv().availableMemoryProportions(0.5).planType(MultiConvPlanType.Serial)`.
    """

    def __init__(self):
        self._available_memory_proportions: tuple | list | None = None
        self._partials_types: tuple | list | None = None
        self._plan_type: MultiConvPlanType | None = None
        self._per_conv_reserved_tiles: int | None = None
        self._cycle_back_off: float | None = None
        self._enable_conv_ditherings: tuple | list | None = None
        self._counter: _CountConvolutions | None = None

    @staticmethod
    def _per_conv(name: str, value: Any, kind: type) -> tuple | list | None:
        if value is None:
            return None
        if isinstance(value, kind):
            return (value,)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, kind) for v in value):
            return value
        raise AssertionError(f"Invalid {name}!")

    def availableMemoryProportions(self, value: float | list[float]) -> MultiConv:
        """Share of tile memory for each convolution's temporary data: a float, or one float per convolution."""
        self._available_memory_proportions = self._per_conv("available memory proportion", value, float)
        no_effect("poptorch.MultiConv.availableMemoryProportions", "tile memory planning is not simulated.")
        return self

    def partialsTypes(self, value: torch.dtype | list[torch.dtype]) -> MultiConv:
        """Type of each convolution's partial sums: torch.float or torch.half, or one per convolution."""
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if v not in (torch.float32, torch.float16):
                raise ValueError("Invalid partials types. Expecting torch.float or torch.half")
        self._partials_types = values
        no_effect("poptorch.MultiConv.partialsTypes", "convolution partials are accumulated in fp32.")
        return self

    def enableConvDithering(self, value: bool | list[bool]) -> MultiConv:
        """Dither each convolution's tile placement: a bool, or one per convolution."""
        if value is None:
            self._enable_conv_ditherings = None
        elif isinstance(value, (list, tuple)) and all(isinstance(v, bool) for v in value):
            self._enable_conv_ditherings = value
        elif isinstance(value, bool):
            self._enable_conv_ditherings = (value,)
        else:
            raise ValueError("value must be bool or list of bools")
        no_effect("poptorch.MultiConv.enableConvDithering", "tile placement is not simulated.")
        return self

    def planType(self, value: MultiConvPlanType | None) -> MultiConv:
        """Parallel (one multi-convolution, the default) or Serial (each convolution on its own)."""
        if value is not None and not isinstance(value, MultiConvPlanType):
            raise AssertionError("Invalid plan type!")
        self._plan_type = value
        no_effect("poptorch.MultiConv.planType", _SCHEDULING)
        return self

    def perConvReservedTiles(self, value: int) -> MultiConv:
        """Tiles to reserve for each convolution."""
        assert isinstance(value, int)
        self._per_conv_reserved_tiles = value
        no_effect("poptorch.MultiConv.perConvReservedTiles", "tiles are not simulated.")
        return self

    def cycleBackOff(self, value: float) -> MultiConv:
        """Cycle back-off proportion of the planner, between 0 and 1."""
        assert isinstance(value, float)
        self._cycle_back_off = value
        no_effect("poptorch.MultiConv.cycleBackOff", "the convolution planner is not simulated.")
        return self

    def __enter__(self) -> MultiConv:
        no_effect("poptorch.MultiConv", _SCHEDULING)
        if current() is None:  # plain PyTorch: PopTorch checks the scope only when it compiles it
            return self
        if _open_multi_convs:
            raise Error("Nested poptorch.MultiConv is not supported.")
        _open_multi_convs.append(self)
        self._counter = _CountConvolutions()
        self._counter.__enter__()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._counter is None:
            return
        counter, self._counter = self._counter, None
        counter.__exit__(exc_type, exc, traceback)
        _open_multi_convs.remove(self)
        if exc_type is not None:
            return
        if counter.count == 0:
            raise Error(
                "Unexpected end_multi_conv, is the IR malformed? (a poptorch.MultiConv scope ran no convolution)"
            )
        for name, values in (("availableMemoryProportions", self._available_memory_proportions),
                             ("partialsTypes", self._partials_types),
                             ("enableConvDithering", self._enable_conv_ditherings)):  # fmt: skip
            if values is not None and len(values) not in (1, counter.count):
                raise Error(
                    f"poptorch.MultiConv.{name} was given {len(values)} values for the {counter.count} "
                    "convolutions of its scope: give one value for all, or one per convolution."
                )


class NameScope:
    """Prefix the names of the ops run in this scope (`with NameScope("encoder"):`); names only, no values."""

    def __init__(self, name: str):
        assert isinstance(name, str), "Parameter to NameScope must be a string"
        self.name = name

    def __enter__(self) -> None:
        no_effect("poptorch.NameScope", "the simulated IPU's ops have no names; the values are the same.")
        push_name_scope(self.name)  # returns None, as PopTorch's (a hook calling it leaves the inputs alone)

    def __exit__(self, exc_type, exc, traceback) -> None:
        pop_name_scope()
