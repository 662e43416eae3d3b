"""Offline IPU targets: `opts.useOfflineIpuTarget()` / `connectionType(ConnectionType.Never)` compile, never run.

PopTorch compiles for an offline target without attaching to any IPU, so a program can precompile
(`model.compile(...)`, `compileAndExport(...)`) on a machine with no IPUs; calling the model or
attaching it is refused, and `poptorch.load` of a file exported that way connects as usual. The
simulated IPU keeps that contract, so a precompile script behaves here as on a pod: it does not
quietly train or predict when its author asked for a compile only.
"""

from __future__ import annotations

from optimum_ipu.poptorch._logging import Error
from optimum_ipu.poptorch.enums import ConnectionType

__all__ = ["OfflineDeviceError", "connect_loaded", "is_offline", "refuse_offline"]

# How PopTorch 3.4 words each refusal (its assertions in _poplar_executor.py); the fix follows.
_REFUSALS = {
    "run": "Trying to run a model on an offline device (ConnectionType.Never): use model.compile(inputs) "
    "instead of model(inputs)",
    "attach": "Trying to attach to an offline device (ConnectionType.Never)",
}
_FIX = (
    "The options asked for an offline IPU target (useOfflineIpuTarget() or connectionType(Never)), which "
    "only compiles. To run the model, wrap it with options that leave the connection type at "
    "ConnectionType.Always, or poptorch.load() the file compileAndExport() wrote, which connects."
)


class OfflineDeviceError(Error, AssertionError):
    """A call or attach of a model compiled for an offline IPU target.

    A `poptorch.Error`, and an `AssertionError` as PopTorch raises it (its programs and tests catch that).
    """


def is_offline(options) -> bool:
    """Whether `options` target an offline IPU (connection type `Never`)."""
    return options.connection_type == ConnectionType.Never


def refuse_offline(options, action: str) -> None:
    """Raise `OfflineDeviceError` for `action` ("run" or "attach") when `options` target an offline IPU."""
    if is_offline(options):
        raise OfflineDeviceError(f"{_REFUSALS[action]}. {_FIX}")


def connect_loaded(options) -> None:
    """As PopTorch's `poptorch.load`: options saved for an offline target connect (`Always`) and forget the
    offline IPU version, so the loaded model runs. `options` must be unfrozen."""
    if is_offline(options):
        options.connectionType(ConnectionType.Always)
        options._values.pop("ipu_version", None)
