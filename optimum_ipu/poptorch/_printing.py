"""`poptorch.module_repr` and `poptorch.print`: a module's text with the blocks `BeginBlock` put on it.

`repr(module)` does not show forward pre-hooks, which is where `BeginBlock` annotates a layer, so a
placed model prints as an unplaced one. PopTorch 3.4's `module_repr` writes torch's module text with
each module's pre-hooks first, on the module's own line (`BeginBlock(user_id=enc, ipu_id=1) Linear(...)`);
these write the same text, so a program that logs its placement this way reads as it did on an IPU.
"""

from __future__ import annotations

import builtins
from typing import Any

from torch import nn

__all__ = ["module_repr", "print"]


def module_repr(module: nn.Module) -> str:
    """`repr(module)`, with the repr of each module's forward pre-hooks (each followed by a space)
    before its class name: the blocks `BeginBlock` started show where they start."""
    own = [line for line in module.extra_repr().split("\n") if module.extra_repr()]
    children = []
    for name, child in module._modules.items():
        text = "None" if child is None else module_repr(child)
        children.append(f"({name}): " + text.replace("\n", "\n  "))
    hooks = "".join(f"{hook!r} " for hook in module._forward_pre_hooks.values())
    head = f"{hooks}{module._get_name()}("
    if len(own) == 1 and not children:  # a leaf's one-line settings stay on its line, as torch writes them
        return f"{head}{own[0]})"
    if own or children:
        return head + "\n  " + "\n  ".join(own + children) + "\n)"
    return head + ")"


def print(obj: Any) -> None:  # noqa: A001 - PopTorch's name, used as poptorch.print(model)
    """Print `obj`; a module is printed first with its blocks (`module_repr`), then as `print` shows it,
    as PopTorch's `poptorch.print` does."""
    if isinstance(obj, nn.Module):
        builtins.print(module_repr(obj))
    builtins.print(obj)
