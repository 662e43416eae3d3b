"""The custom ops Graphcore published with its applications, run by name for `poptorch.custom_op`.

On an IPU, `poptorch.custom_op(inputs, name, domain, domain_version, example_outputs, attributes)`
adds a PopART operator, found by (domain, name, version) among those a compiled library registered
(the applications load theirs with `ctypes.cdll.LoadLibrary` first) or among PopART's own. The
simulated IPU cannot run IPU code, so the ops those applications call are written here in PyTorch,
one function each, with the semantics their C++ sources give (forward values, gradients, side
effects, attributes and their defaults):

| op | domain | application |
|---|---|---|
| `RemapCE` | ai.graphcore | conformer, Swin, MAE, GPT-2: a tile-layout remap, identity on values |
| `CopyTensor` | ai.graphcore | YOLOv4: a copy |
| `Ctc` | ai.graphcore | conformer: PopART's CTC loss, [loss, gradient of the per-sample losses] |
| `ExpMovAvg` | com.acme | DINO: teacher <- factor * teacher + (1 - factor) * student, in place |
| `Nms` | ai.graphcore | YOLOv4: multi-class non-maximum suppression |

Any other op is an error naming it and listing these. The outputs are returned as PopTorch
returns them: a list shaped and typed like `example_outputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

from optimum_ipu.poptorch._ipu_context import current
from optimum_ipu.poptorch._logging import Error

__all__ = ["SUPPORTED", "check_attributes", "run_custom_op", "supported_ops"]

AttributeValue = float | int | str | list | tuple
OpFunction = Callable[[list[torch.Tensor], dict[str, AttributeValue]], list[torch.Tensor]]

SUPPORTED: dict[str, tuple[str, OpFunction]] = {}  # op name -> (domain, function)
DOMAIN_VERSION = 1  # every published op is version 1 of its domain


def _custom_op(name: str, domain: str) -> Callable[[OpFunction], OpFunction]:
    def register(function: OpFunction) -> OpFunction:
        SUPPORTED[name] = (domain, function)
        return function

    return register


def supported_ops() -> str:
    """The ops that run here, as `name (domain)`, for messages."""
    return ", ".join(f"{name} ({domain})" for name, (domain, _) in SUPPORTED.items())


# -- PopTorch's argument checks ---------------------------------------------------------------------------------
def check_attributes(attributes: dict[str, AttributeValue] | None) -> None:
    """PopTorch's rules: string keys; float, int, string values or homogeneous lists/tuples of them; ASCII text."""
    if attributes is None:
        return
    for key, value in attributes.items():
        if not isinstance(key, str):
            raise ValueError("All attribute keys must be strings.")
        if not isinstance(value, (float, int, str, list, tuple)):
            raise ValueError(
                "Attribute values must be floats, ints, strings or a list/tuple of float, ints of strings."
            )
        if isinstance(value, (list, tuple)) and any(not isinstance(v, type(value[0])) for v in value):
            raise ValueError("The types in a list/tuple attribute must all be the same.")
    for text in [*attributes.keys(), *attributes.values()]:
        for s in text if isinstance(text, (list, tuple)) else [text]:
            if isinstance(s, str) and not s.isascii():
                raise ValueError(f"{s} contains non-ASCII characters.")


def _tensors(what: str, values: Any, name: str) -> list[torch.Tensor]:
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, torch.Tensor) for v in values):
        raise Error(
            f"poptorch.custom_op({name!r}): {what} must be a list or tuple of tensors, got {values!r}."
        )
    return list(values)


def _unsupported(name: str, domain: str, why: str) -> Error:
    return Error(
        f"poptorch.custom_op({name!r}, domain {domain!r}) runs a Poplar/PopART custom operation compiled for the "
        f"IPU, which the simulated IPU cannot run{why}. The custom ops Graphcore published with its applications "
        f"run here by name: {supported_ops()}. For any other, write the op in PyTorch (a torch.autograd.Function) "
        "and call it instead of poptorch.custom_op."
    )


def run_custom_op(
    inputs: Sequence[torch.Tensor],
    name: str,
    domain: str,
    domain_version: int,
    example_outputs: Sequence[torch.Tensor],
    attributes: dict[str, AttributeValue] | None = None,
) -> list[torch.Tensor]:
    """Run the custom op `name` of `domain` on `inputs`: a list of tensors shaped and typed like `example_outputs`."""
    check_attributes(attributes)
    inputs = _tensors("inputs", inputs, name)
    examples = _tensors("example_outputs", example_outputs, name)
    if name not in SUPPORTED:
        raise _unsupported(name, domain, "")
    op_domain, function = SUPPORTED[name]
    if domain != op_domain:
        raise _unsupported(name, domain, f" ({name} runs here in domain {op_domain!r}, not {domain!r})")
    if domain_version != DOMAIN_VERSION:
        raise _unsupported(
            name, domain, f" ({name} runs here as version {DOMAIN_VERSION}, not {domain_version})"
        )
    # A shape-only trace (the cost model's) gets empty outputs like the examples, as from PopTorch's meta kernel.
    if any(t.is_meta for t in inputs):
        return [torch.empty(e.shape, dtype=e.dtype, device="meta") for e in examples]
    outputs = function(inputs, dict(attributes or {}))
    if len(outputs) != len(examples):
        raise Error(
            f"poptorch.custom_op({name!r}) has {len(outputs)} outputs but {len(examples)} example_outputs were "
            "given: give one example tensor per output."
        )
    for i, (out, example) in enumerate(zip(outputs, examples)):
        if out.shape != example.shape:
            raise Error(
                f"poptorch.custom_op({name!r}): output {i} is shaped {list(out.shape)} but example_outputs[{i}] is "
                f"shaped {list(example.shape)}: give an example of the output's shape."
            )
    return [out.to(example.dtype) for out, example in zip(outputs, examples)]


def _arity(name: str, inputs: list[torch.Tensor], count: int, names: str) -> None:
    if len(inputs) != count:
        raise Error(f"poptorch.custom_op({name!r}) takes {count} inputs ({names}), got {len(inputs)}.")


# -- the ops ----------------------------------------------------------------------------------------------------
@_custom_op("RemapCE", "ai.graphcore")
def remap_ce(inputs: list[torch.Tensor], attributes: dict[str, AttributeValue]) -> list[torch.Tensor]:
    """Copy a tensor to a tile layout that suits the next matmul (forward) or its gradient (backward).

    The layout attributes (`fwd_grain_size`, `bwd_grain_size`, `fwd_clone_layout`, ..., or GPT-2's
    `grain_size`) only place data on tiles, so the op is the identity on values and on gradients.
    """
    _arity("RemapCE", inputs, 1, "the tensor to remap")
    return [inputs[0].clone()]


@_custom_op("CopyTensor", "ai.graphcore")
def copy_tensor(inputs: list[torch.Tensor], attributes: dict[str, AttributeValue]) -> list[torch.Tensor]:
    """A copy of the input (YOLOv4 copies its output before the NMS); the gradient passes through unchanged."""
    _arity("CopyTensor", inputs, 1, "the tensor to copy")
    return [inputs[0].clone()]


class _CtcLossAndGradient(torch.autograd.Function):
    """Per-sample CTC losses and their gradient computed together, as PopLibs does in PopART's forward op.

    The backward multiplies the kept gradient by the incoming one per sample (PopART's CtcGradOp),
    so the loss is computed once per step. The gradient is torch's (and PopLibs' by default): it
    assumes `log_probs` come from a log-softmax, which the applications' do.
    """

    @staticmethod
    def forward(ctx, log_probs, targets, input_lengths, target_lengths, blank: int, zero_infinity: bool):
        with torch.enable_grad():
            lp = log_probs.detach().float().requires_grad_()
            losses = F.ctc_loss(
                lp, targets.long(), input_lengths.long(), target_lengths.long(),
                blank=blank, reduction="none", zero_infinity=zero_infinity,
            )  # fmt: skip
            (gradient,) = torch.autograd.grad(losses.sum(), lp)
        ctx.save_for_backward(gradient)
        ctx.mark_non_differentiable(gradient)
        return losses.detach(), gradient

    @staticmethod
    def backward(ctx, loss_gradient, _):
        (gradient,) = ctx.saved_tensors
        return gradient * loss_gradient.float()[None, :, None], None, None, None, None, None


_REDUCTIONS = ("Sum", "Mean", "None")
_OUT_TYPES = {"FLOAT": torch.float32, "FLOAT16": torch.float16}


@_custom_op("Ctc", "ai.graphcore")
def ctc(inputs: list[torch.Tensor], attributes: dict[str, AttributeValue]) -> list[torch.Tensor]:
    """PopART's CTC loss: [reduced loss, gradient of each sample's loss with respect to the log-probabilities].

    Inputs: log-probabilities [T, N, C] (float), targets [N, S], input lengths [N], target lengths
    [N] (integers). Attributes: `reduction` "Sum", "Mean" (each loss divided by its target length,
    at least 1, then the mean over the batch, as torch's "mean") or "None" (the loss is then [N]);
    `blank` (default 0); `zeroInfinity` (default 0: an impossible alignment's infinite loss is kept);
    `outDataType` "FLOAT" or "FLOAT16" (anything else, such as the conformer's "UNDIFINED", keeps the
    input's type); `enableReducedClassesInLabel` only plans tile memory. The loss's gradient flows to
    the log-probabilities; the second output is a value, without gradient.
    """
    _arity("Ctc", inputs, 4, "log-probabilities, targets, input lengths, target lengths")
    log_probs, targets, input_lengths, target_lengths = inputs
    if log_probs.dim() != 3 or not log_probs.is_floating_point():
        raise Error(
            f"poptorch.custom_op('Ctc'): input 0 is the log-probabilities, a float tensor [T, N, C]; got "
            f"{log_probs.dtype} {list(log_probs.shape)}."
        )
    batch = log_probs.shape[1]
    if targets.dim() != 2 or targets.shape[0] != batch:
        raise Error(
            f"poptorch.custom_op('Ctc'): input 1 is the targets [N, S] with N = {batch} (dim 1 of the "
            f"log-probabilities); got {list(targets.shape)}."
        )
    for i, lengths in ((2, input_lengths), (3, target_lengths)):
        if list(lengths.shape) != [batch]:
            raise Error(
                f"poptorch.custom_op('Ctc'): input {i} is the {'input' if i == 2 else 'target'} lengths [N] "
                f"with N = {batch}; got {list(lengths.shape)}."
            )
    reduction = attributes.get("reduction", "Mean")
    if reduction not in _REDUCTIONS:
        raise Error(
            f"poptorch.custom_op('Ctc'): reduction {reduction!r} is not one of {', '.join(_REDUCTIONS)}."
        )
    blank = int(attributes.get("blank", 0))
    if not 0 <= blank < log_probs.shape[2]:
        raise Error(
            f"poptorch.custom_op('Ctc'): blank {blank} is not a class of the {log_probs.shape[2]} classes."
        )
    out_type = _OUT_TYPES.get(str(attributes.get("outDataType", "UNDEFINED")), log_probs.dtype)

    losses, gradient = _CtcLossAndGradient.apply(
        log_probs, targets, input_lengths, target_lengths, blank, bool(attributes.get("zeroInfinity", 0))
    )
    if reduction == "Sum":
        loss = losses.sum()
    elif reduction == "Mean":
        loss = (losses / target_lengths.clamp(min=1).to(losses.dtype)).mean()
    else:
        loss = losses
    return [loss.to(out_type), gradient.to(out_type)]


# ExpMovAvg updates inside a training model wait for the weight update (see `exp_mov_avg`).
_pending_averages: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
_step_hook: Any = None


def _move_average(teacher: torch.Tensor, student: torch.Tensor, factor: torch.Tensor) -> None:
    with torch.no_grad():
        f = factor.to(torch.float32).reshape(())
        teacher.copy_(f * teacher.float() + (1 - f) * student.detach().float())


def _apply_pending_averages(optimizer, args, kwargs) -> None:
    """Optimizer step pre-hook: the averages queued since the last update, from the student before it."""
    pending = list(_pending_averages.values())
    _pending_averages.clear()
    for teacher, student, factor in pending:
        _move_average(teacher, student, factor)


@_custom_op("ExpMovAvg", "com.acme")
def exp_mov_avg(inputs: list[torch.Tensor], attributes: dict[str, AttributeValue]) -> list[torch.Tensor]:
    """Move the teacher weight toward the student's, in place: teacher <- f * teacher + (1 - f) * student.

    Inputs: the student weight, the teacher weight (updated in place; also the output) and the factor
    f (one element). DINO calls it in `forward` for every weight pair. The application's pattern
    turns it into a PopART moving-average accumulate that runs after the gradient-accumulation loop,
    once per weight update, from the student weights of that step. So inside a `trainingModel` the
    update is queued (one per teacher weight) and applied when the optimizer steps, before the
    student changes; the forward passes of the step all see the same teacher, as on the IPU. Outside
    a training model (plain PyTorch, an `inferenceModel`) it is applied at once. A compile's trace
    changes nothing.
    """
    global _step_hook
    _arity("ExpMovAvg", inputs, 3, "student weight, teacher weight, factor")
    student, teacher, factor = inputs
    if student.shape != teacher.shape:
        raise Error(
            f"poptorch.custom_op('ExpMovAvg'): the student {list(student.shape)} and teacher "
            f"{list(teacher.shape)} weights differ in shape."
        )
    if factor.numel() != 1:
        raise Error(f"poptorch.custom_op('ExpMovAvg'): the factor has one element, got {list(factor.shape)}.")
    running = current()
    if running is not None and running.compiling:
        return [teacher]
    if running is not None and running.training:
        if _step_hook is None:
            _step_hook = register_optimizer_step_pre_hook(_apply_pending_averages)
        _pending_averages[id(teacher)] = (teacher, student, factor.detach().clone())
    else:
        _move_average(teacher, student, factor)
    return [teacher]


def _iou(box: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Intersection over union of `box` [4] with each of `boxes` [N, 4], corners (x1, y1, x2, y2)."""
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    best_area = (box[2] - box[0]) * (box[3] - box[1])
    width = (torch.minimum(boxes[:, 2], box[2]) - torch.maximum(boxes[:, 0], box[0])).clamp(min=0)
    height = (torch.minimum(boxes[:, 3], box[3]) - torch.maximum(boxes[:, 1], box[1])).clamp(min=0)
    inter = width * height
    return inter / (area + best_area - inter)


# The score a taken or suppressed (box, class) gets: the lowest finite float, as the IPU kernel writes.
_REMOVED = torch.finfo(torch.float32).min


@_custom_op("Nms", "ai.graphcore")
def nms(inputs: list[torch.Tensor], attributes: dict[str, AttributeValue]) -> list[torch.Tensor]:
    """Multi-class non-maximum suppression, per image: [indices, scores, boxes, classes, lengths].

    Inputs: scores [B, N, C] (a score per box and class) and boxes [B, N, 4] (x1, y1, x2, y2).
    Attributes: `threshold` (IoU, default 0.5), `scoreThreshold` (default the lowest float),
    `numDetections` K (default 100, at most N), `sigma` (default 0; above 0, soft-NMS: scores are
    multiplied by exp(-IoU^2 / sigma) instead of removed), `useGather` (a layout choice).

    Up to K times per image: the highest remaining (box, class) score is taken if it is above
    `scoreThreshold` (else the image is done), and every other box whose score for that class is
    above `scoreThreshold` and whose IoU with the taken box exceeds `threshold` is suppressed for that
    class. Outputs: the taken box indices [B, K] (-1 past the end), their scores [B, K] (0 past the
    end), boxes [B, K, 4] (0), classes [B, K] (int32 max) and how many were taken [B] (int32).
    Computed in fp32. The IPU kernel stops every image of a batch at the first image that runs out of
    scores above the threshold (leaving the others' remaining slots as padding while their counts say
    K); here each image runs to its own end, as the application's CPU path does.
    """
    _arity("Nms", inputs, 2, "scores [B, N, C], boxes [B, N, 4]")
    scores, boxes = inputs
    if scores.dim() != 3 or boxes.dim() != 3 or boxes.shape[:2] != scores.shape[:2] or boxes.shape[2] != 4:
        raise Error(
            "poptorch.custom_op('Nms') takes scores [B, N, C] and boxes [B, N, 4]; got "
            f"{list(scores.shape)} and {list(boxes.shape)}."
        )
    batch, n, classes = scores.shape
    threshold = float(attributes.get("threshold", 0.5))
    score_threshold = float(attributes.get("scoreThreshold", -torch.finfo(torch.float32).max))
    k = int(attributes.get("numDetections", 100))
    sigma = float(attributes.get("sigma", 0.0))
    if not threshold > 0 or not 0 < k <= n:
        raise Error(
            f"poptorch.custom_op('Nms'): threshold must be above 0 and numDetections between 1 and the {n} boxes; "
            f"got threshold {threshold}, numDetections {k}."
        )
    indices = torch.full((batch, k), -1, dtype=torch.int32, device=scores.device)
    top_scores = torch.zeros((batch, k), dtype=torch.float32, device=scores.device)
    top_boxes = torch.zeros((batch, k, 4), dtype=torch.float32, device=scores.device)
    top_classes = torch.full(
        (batch, k), torch.iinfo(torch.int32).max, dtype=torch.int32, device=scores.device
    )
    lengths = torch.full((batch,), k, dtype=torch.int32, device=scores.device)
    with torch.no_grad():
        for b in range(batch):
            remaining = scores[b].detach().float().clone()  # [N, C]
            image_boxes = boxes[b].detach().float()
            for i in range(k):
                best = int(remaining.argmax())  # the first of equal scores, as PopLibs' argmax
                box, cls = divmod(best, classes)
                score = float(remaining[box, cls])
                if not score > score_threshold:
                    lengths[b] = i
                    break
                indices[b, i], top_scores[b, i], top_classes[b, i] = box, score, cls
                top_boxes[b, i] = image_boxes[box]
                remaining[box, cls] = _REMOVED
                column = remaining[:, cls]
                iou = _iou(image_boxes[box], image_boxes)
                live = column > score_threshold
                if sigma == 0.0:
                    column[live & (iou > threshold)] = _REMOVED
                else:
                    column[live] *= torch.exp(-(iou[live] ** 2) / sigma)
    return [indices, top_scores, top_boxes, top_classes, lengths]
