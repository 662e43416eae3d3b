"""PopTorch's on-device control flow and host callbacks: `for_loop`, `cond`, `CPU`.

On an IPU these become subgraphs of the compiled program (an ONNX Loop, an If, a host callback). The
simulated IPU runs the model eagerly, so each is the Python it stands for, with PopTorch's rules kept:
the bodies get copies of their inputs, a loop feeds every output back as the next iteration's input,
the results come back as a list, and loops and branches are inference-only (PopART has no gradient for
them: a `trainingModel` fails at compile with PopTorch's message). A CPU op runs its function on the
host's CPU tensors and hands the results back to the model's device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from optimum_ipu.poptorch._ipu_context import current
from optimum_ipu.poptorch._logging import Error

__all__ = ["CPU", "cond", "for_loop"]

_LOOP_NOT_LIST = "poptorch.for_loop expects input tensors (inputs) to be a list of tensors."
_COND_NOT_LIST = (
    "poptorch.cond expects then_inps and else_inps tensors to be a list of tensors. (Object is not list)"
)


def _as_list(outputs: Any) -> list:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _refuse_training(name: str) -> None:
    running = current()
    if running is not None and running.training:
        raise Error(f"poptorch.{name}() is only supported in inference.")


def for_loop(count: int, body: Callable[..., Any], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run `body` `count` times, each iteration's outputs being the next one's inputs; return the last outputs.

    `body` takes as many tensors as `inputs` holds and returns as many (a tensor or a tuple/list), each
    with its input's shape and dtype (the loop-carried values of the IPU's loop). The inputs are passed
    by value: in-place ops in `body` leave the caller's tensors alone. Returns a list of tensors (the
    inputs, copied, for `count` 0). Inference only inside a PopTorch wrapper, as on PopTorch.
    """
    if not isinstance(inputs, list):
        raise ValueError(f"{_LOOP_NOT_LIST} (Object is not list)")
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                f"{_LOOP_NOT_LIST} (Object contained in list at index {index} is not torch.tensor)"
            )
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise Error(
            f"poptorch.for_loop: count must be a non-negative int (the loop's trip count is fixed at compile "
            f"time), got {count!r}."
        )
    _refuse_training("for_loop")
    values = [t.clone() for t in inputs]  # passed by value, as the IPU's loop does
    for iteration in range(count):
        outputs = _as_list(body(*values))
        if len(outputs) != len(values):
            raise Error(
                f"poptorch.for_loop: the body returned {len(outputs)} tensors for {len(values)} inputs; each "
                "iteration's outputs are the next iteration's inputs, so return one per input, in order."
            )
        for index, (out, before) in enumerate(zip(outputs, values)):
            if not isinstance(out, torch.Tensor) or out.shape != before.shape or out.dtype != before.dtype:
                got = (
                    f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
                )
                raise Error(
                    f"poptorch.for_loop: output {index} of the body in iteration {iteration} is {got}, but input "
                    f"{index} is {tuple(before.shape)} {before.dtype}; a loop-carried tensor keeps its shape and "
                    "dtype."
                )
        values = outputs
    return values


def cond(
    condition: torch.Tensor | bool,
    then_body: Callable[..., Any],
    then_inps: list[torch.Tensor],
    else_body: Callable[..., Any],
    else_inps: list[torch.Tensor],
) -> list[torch.Tensor]:
    """Run `then_body(*then_inps)` if `condition` (a one-element tensor) is true, else `else_body(*else_inps)`.

    Returns the branch's outputs as a list. The bodies may also read tensors of the enclosing forward;
    their inputs are copies. Both branches must return the same number of outputs, of the same shapes
    (checked when the wrapper compiles, where both branches are traced as on PopTorch; afterwards only
    the chosen branch runs). Inference only inside a PopTorch wrapper, as on PopTorch.
    """
    if not isinstance(then_inps, list) or not isinstance(else_inps, list):
        raise ValueError(_COND_NOT_LIST)
    if isinstance(condition, torch.Tensor) and condition.numel() != 1:
        raise Error(
            f"poptorch.cond: the condition must be a tensor of one element (a bool), got shape "
            f"{tuple(condition.shape)}."
        )
    running = current()
    if running is None:  # plain PyTorch, as PopTorch's own CPU path: the branch, on the inputs themselves
        chosen = then_body(*then_inps) if condition else else_body(*else_inps)
        return _as_list(chosen)
    _refuse_training("cond")
    on_meta = isinstance(condition, torch.Tensor) and condition.device.type == "meta"
    take_then = True if on_meta else bool(condition)  # the cost model's trace has no values: either branch
    if not running.compiling:
        body, inputs = (then_body, then_inps) if take_then else (else_body, else_inps)
        return _as_list(body(*[t.clone() for t in inputs]))
    then_out = _as_list(then_body(*[t.clone() for t in then_inps]))
    else_out = _as_list(else_body(*[t.clone() for t in else_inps]))
    if len(then_out) != len(else_out):
        raise Error(
            f"poptorch.cond: then_body returned {len(then_out)} outputs and else_body {len(else_out)}; both "
            "branches must return the same number of outputs (the result of cond is one list of tensors)."
        )
    for index, (a, b) in enumerate(zip(then_out, else_out)):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape != b.shape:
            raise Error(
                f"poptorch.cond: output {index} is {tuple(a.shape)} in then_body and {tuple(b.shape)} in "
                "else_body; return the same shape from both branches (PopTorch reshapes the then-branch "
                "output to the else-branch shape, which the simulated IPU does not do)."
            )
    return then_out if take_then else else_out


class CPU:
    """Run a function on the host in the middle of the model: a PopTorch host callback.

    `CPU(layer_to_call, ID)`; calling it calls `layer_to_call` with the same arguments, moved to the
    host's CPU, and returns its outputs (a tensor, or a list for several) on the model's device. A
    module given as `layer_to_call` has its parameters frozen (`requires_grad_(False)`), as PopTorch
    does. PopTorch documents CPU ops for inference graphs only: here a `trainingModel` may use one on
    tensors that need no gradient (its outputs carry none); an input that needs a gradient is an error,
    since the host callback has no backward.
    """

    def __init__(self, layer_to_call: Callable[..., Any], ID: str):  # noqa: N803 - PopTorch's argument name
        self._layer_to_call = layer_to_call
        if isinstance(layer_to_call, torch.nn.Module):
            layer_to_call.requires_grad_(False)
        self._ID = ID
        self.in_shapes: list[torch.Size] | None = None
        self.out_shapes: list[torch.Size] | None = None

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        running = current()
        if running is None:  # plain PyTorch: the function itself
            return self._layer_to_call(*inputs, **kwargs)
        if running.training and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            raise Error(
                f"poptorch.CPU op {self._ID!r}: CPU ops are only supported in inference graphs, and this one is "
                "given a tensor that needs a gradient in a trainingModel (a host callback has no backward). "
                "Detach its inputs (the op then returns constants of the graph) or run it in an inferenceModel."
            )
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        on_meta = device.type == "meta"  # the cost model's trace: shapes only, nothing crosses to the host
        # the host's own copies (as PopTorch's callback buffers): an in-place op there leaves the model's alone
        host = [
            t.detach().to("cpu", copy=True) if isinstance(t, torch.Tensor) and not on_meta else t
            for t in inputs
        ]
        outputs = self._layer_to_call(*host, **kwargs)
        single = not isinstance(outputs, (list, tuple))
        outs = [outputs] if single else list(outputs)
        self.in_shapes = [t.shape for t in tensors]
        self.out_shapes = [o.shape for o in outs if isinstance(o, torch.Tensor)]
        back = [o.detach().to(device) if isinstance(o, torch.Tensor) else o for o in outs]
        return back[0] if single else back
