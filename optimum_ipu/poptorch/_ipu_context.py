"""Whether the user's forward is running "on the IPU": inside a `trainingModel`/`inferenceModel` call.

PopTorch's helpers behave differently there (`poptorch.isRunningOnIpu()` is True, `for_loop` and
`cond` refuse a training graph, `MultiConv` checks its scope, a CPU op moves its tensors to the host),
so the wrapper marks the time it runs the user's module: `compile()` (the trace, the stage plan and the
cost model's meta-device trace, `compiling` True) and every call. A module-level stack rather than a
context variable: backward may re-run a checkpointed forward on autograd's own thread, and the answer
must be the same there (PopTorch keeps one global flag too).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["Running", "current", "isRunningOnIpu", "running_model"]


@dataclasses.dataclass(frozen=True)
class Running:
    """The wrapper whose call is running, and whether it is compiling (tracing) rather than running."""

    wrapper: Any  # a PoplarExecutor (not imported: it imports this module)
    compiling: bool

    @property
    def training(self) -> bool:
        return bool(self.wrapper.training)

    @property
    def options(self) -> Any:
        return self.wrapper.options


_stack: list[Running] = []


def current() -> Running | None:
    """The innermost running wrapper call, or None outside any (plain PyTorch)."""
    return _stack[-1] if _stack else None


def isRunningOnIpu() -> bool:
    """True while a `poptorch` wrapper runs (or compiles) the model, False outside one.

    Lets a model take a separate path on the IPU (`if poptorch.isRunningOnIpu(): ...`); like PopTorch's,
    it is False while the model is being built or called as a plain module.
    """
    return bool(_stack)


def running_model(compiling: bool) -> Callable:
    """Decorate a wrapper method that runs the user's module (`compile`, `__call__`) to mark it as on the IPU."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def marked(self, *args: Any, **kwargs: Any) -> Any:
            _stack.append(Running(self, compiling))
            try:
                return method(self, *args, **kwargs)
            finally:
                _stack.pop()

        return marked

    return decorate
