"""`poptorch.registerPreCompileHook` / `registerPostCompileHook`: callables run around every compile.

Programs and libraries on PopTorch (Lightning's IPU strategy among them) use these to set up and undo
state that only the traced forward should see, or to time compiles. As on PopTorch 3.4, a hook takes no
argument and runs at every compile of any wrapped model (the first call, `compile`, `compileAndExport`,
`poptorch.load`), in the order registered; the post-compile hooks run even when the compile fails, so
what a pre-compile hook set up is always undone. Each registration returns a
`torch.utils.hooks.RemovableHandle` whose `remove()` unregisters the hook.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

from torch.utils.hooks import RemovableHandle

__all__ = ["registerPostCompileHook", "registerPreCompileHook", "with_compile_hooks"]

_pre_compile: collections.OrderedDict[int, Callable[[], Any]] = collections.OrderedDict()
_post_compile: collections.OrderedDict[int, Callable[[], Any]] = collections.OrderedDict()


def _register(hooks: collections.OrderedDict, hook: Callable[[], Any], kind: str) -> RemovableHandle:
    if not callable(hook):
        # PopTorch's sentence, then what it got
        raise RuntimeError(
            f"{kind} hook must be callable: got {type(hook).__name__}, pass a function of no arguments."
        )
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def registerPreCompileHook(hook: Callable[[], Any]) -> RemovableHandle:
    """Call `hook()` before every compile of a wrapped model; `.remove()` on the handle unregisters it.

    Raises:
        RuntimeError: `hook` is not callable.
    """
    return _register(_pre_compile, hook, "Pre-compile")


def registerPostCompileHook(hook: Callable[[], Any]) -> RemovableHandle:
    """Call `hook()` after every compile of a wrapped model, failed ones too; `.remove()` unregisters it.

    Raises:
        RuntimeError: `hook` is not callable.
    """
    return _register(_post_compile, hook, "Post-compile")


def with_compile_hooks(compile_method: Callable) -> Callable:
    """Decorate `PoplarExecutor.compile`: the pre-compile hooks before it, the post-compile hooks after it."""

    @functools.wraps(compile_method)
    def compile_with_hooks(*args: Any, **kwargs: Any) -> Any:
        try:
            for hook in list(_pre_compile.values()):
                hook()
            return compile_method(*args, **kwargs)
        finally:
            for hook in list(_post_compile.values()):
                hook()

    return compile_with_hooks
