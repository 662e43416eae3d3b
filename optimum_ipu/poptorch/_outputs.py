"""What a PopTorch call returns: the loss found among a model's outputs, and outputs per `OutputMode`.

A call runs M = device iterations x gradient accumulation x replicas micro-batches. PopTorch (PopART's
anchors) orders them [device iteration][accumulation step][replica] and returns, for every output of
`forward`, the micro-batches the output mode selects, concatenated along dim 0; a 0-dim output (a
loss) becomes a vector, or stays 0-dim when one micro-batch is selected:

- All: every micro-batch (M results);
- Final: the last micro-batch of each replica (R results);
- Sum: per replica, the sum over device iterations and accumulation steps (R results);
- EveryN(N): every micro-batch of device iterations N-1, 2N-1, ... (DI/N x GA x R results).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils import _pytree as pytree

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.poptorch._logging import Error, logger
from optimum_ipu.poptorch.enums import OutputMode

IDENTITY_LOSS = "_poptorch_identity_loss"

NO_LOSS = (  # PopTorch's sentence first (code that matches on it keeps working), then the fix
    "Couldn't find a loss in graph! A training model's forward must return its loss: a 0-dim tensor that "
    "requires grad (e.g. `return logits, nn.functional.cross_entropy(logits, labels)`), or the loss wrapped "
    "in poptorch.identity_loss(loss, reduction=...). A model without a loss runs with poptorch.inferenceModel."
)
MULTIPLE_LOSSES = (
    "Multiple independent losses found in graph. Graph must have one final loss. Wrap final graph loss in "
    "poptorch.identity_loss."
)


def _reaches(start: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether `target` was used to compute `start` (a walk of `start`'s autograd graph)."""
    goal, seen, todo = target.grad_fn, set(), [start.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        if node is goal:
            return True
        seen.add(node)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return False


NO_TRAINABLE_PARAMETER = (
    "The loss depends on no trainable parameter (every parameter it is computed from has requires_grad=False, "
    "or it is computed from the inputs and buffers only): this poptorch.trainingModel runs and changes no "
    "weight, as on PopTorch. To train, set requires_grad=True on the parameters to learn and compute the loss "
    "from the model's output; to evaluate only, use poptorch.inferenceModel."
)


def find_loss(output: Any, frozen: bool = False) -> int:
    """The index, among `output`'s flattened leaves, of the loss a training call backpropagates.

    The loss is an output wrapped in `identity_loss` (PopTorch's loss, whether or not a trainable parameter
    reaches it), else a 0-dim output that requires grad, else, for a `frozen` model (no parameter requires
    grad, so no output can), a 0-dim floating output: PopTorch finds its loss in the graph then too (a
    torch loss is one) and runs, updating nothing. When several qualify, the one computed from all the
    others (a total of partial losses) is the loss. A loss no trainable parameter reaches is said once a
    compile.
    """
    leaves = pytree.tree_leaves(output)
    tensors = [(i, t) for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
    candidates = [(i, t) for i, t in tensors if getattr(t, IDENTITY_LOSS, None)]
    if not candidates:
        candidates = [(i, t) for i, t in tensors if t.requires_grad and t.dim() == 0]
    if not candidates and frozen:
        candidates = [(i, t) for i, t in tensors if t.dim() == 0 and t.is_floating_point()]
    if not candidates:
        raise Error(NO_LOSS)
    finals = [(i, t) for i, t in candidates if all(u is t or _reaches(t, u) for _, u in candidates)]
    if len(finals) != 1:
        raise Error(MULTIPLE_LOSSES)
    if not finals[0][1].requires_grad:
        logger.warning(NO_TRAINABLE_PARAMETER)
    return finals[0][0]


def loss_for_backward(loss: torch.Tensor) -> torch.Tensor:
    """A scalar to call backward on: `identity_loss(x, reduction="none")` sends a gradient of ones. A loss
    that reaches no trainable parameter is cut from its graph, so its backward reaches no weight either."""
    loss = loss if loss.dim() == 0 else loss.sum()
    return loss if loss.requires_grad else loss.detach().requires_grad_()


def _combine(items: list[Any]) -> Any:
    """Concatenate per-micro-batch outputs along dim 0 (0-dim ones stacked) as PopTorch returns them."""
    first = items[0]
    if isinstance(first, torch.Tensor):
        if len(items) == 1:
            return first
        return torch.stack(items) if first.dim() == 0 else torch.cat(items, dim=0)
    return first


def _sum(items: list[Any]) -> Any:
    first = items[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(items).sum(dim=0) if len(items) > 1 else first
    return first


def select_outputs(
    outputs: list[Any],
    device_iterations: int,
    accumulation: int,
    replicas: int,
    mode: OutputMode,
    period: int,
) -> Any:
    """PopTorch's return value from per-micro-batch `outputs` in [device iteration][accumulation][replica] order."""
    di, ga, r = device_iterations, accumulation, replicas
    layout = CallLayout(di, r, ga)

    def at(d: int, g: int, k: int) -> Any:
        return outputs[layout.poptorch_index(d, g, k)]

    if mode == OutputMode.All:
        chosen = outputs
    elif mode == OutputMode.Final:
        chosen = [at(di - 1, ga - 1, k) for k in range(r)]
    elif mode == OutputMode.EveryN:
        chosen = [at(d, g, k) for d in range(period - 1, di, period) for g in range(ga) for k in range(r)]
    elif mode == OutputMode.Sum:
        chosen = []
        for k in range(r):
            per_replica = [at(d, g, k) for d in range(di) for g in range(ga)]
            flat = [pytree.tree_flatten(o)[0] for o in per_replica]
            spec = pytree.tree_flatten(per_replica[0])[1]
            chosen.append(pytree.tree_unflatten([_sum(list(column)) for column in zip(*flat)], spec))
    else:
        raise ValueError(f"unresolved output mode {mode!r}")
    if not chosen:
        raise Error(f"OutputMode.EveryN with period {period} selects nothing of {di} device iterations.")
    flat = [pytree.tree_flatten(o)[0] for o in chosen]
    spec = pytree.tree_flatten(chosen[0])[1]
    return pytree.tree_unflatten([_combine(list(column)) for column in zip(*flat)], spec)


BACKWARD_ON_OUTPUT = (
    "backward() cannot be called explicitly on outputs of a PopTorch model. If you're using a trainingModel, the "
    "backwards pass is performed automatically when invoking the model. If you're using an inferenceModel, you "
    "should use a trainingModel instead."
)
_REFUSAL = ("backward", "__getstate__")


def _refused_backward(*_: Any, **__: Any) -> None:
    raise Error(BACKWARD_ON_OUTPUT)


def refuse_backward(outputs: Any) -> None:
    """`backward()` on a returned tensor raises PopTorch's error (the call already ran backward and the update).

    The refusal is an attribute of the tensor; pickling (`torch.save`) leaves it out, so a saved output
    loads as a plain tensor, with `weights_only=True` too, without optimum-ipu installed.
    """
    if isinstance(outputs, (list, tuple)):
        for element in outputs:
            refuse_backward(element)
    elif isinstance(outputs, torch.Tensor):
        tensor = weakref.ref(outputs)  # a strong reference from its own attribute would be a cycle

        def state_without_refusal() -> dict[str, Any]:
            owner = tensor()
            attributes = vars(owner) if owner is not None else {}
            return {k: v for k, v in attributes.items() if k not in _REFUSAL}

        outputs.backward = _refused_backward
        outputs.__getstate__ = state_without_refusal  # what torch's Tensor.__reduce_ex__ saves


def detached(output: Any) -> Any:
    """`output` with every tensor detached (a tensor or a tuple of tensors directly: the common forwards)."""
    if isinstance(output, torch.Tensor):
        return output.detach()
    if type(output) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in output):
        return type(output)(t.detach() for t in output)
    return pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, output)
