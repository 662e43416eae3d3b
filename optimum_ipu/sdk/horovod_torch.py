"""`horovod.torch` for the instances `poprun` launches: Horovod's calls on torch.distributed's collectives.

Graphcore's PyTorch applications, launched by poprun, use Horovod beside PopTorch for what happens on
the host: agree on a seed (`broadcast`), start from instance 0's weights (`broadcast_parameters`),
and add up metrics and throughput over the instances (`allreduce`, `grouped_allreduce`,
`allgather`). Horovod is a separate install with its own MPI or Gloo controller; poprun's instances
are torchrun processes, so these calls run on the process group torchrun sets up (the one PopTorch's models use: gloo for CPU tensors, NCCL
beside it for GPU ones). Alone (no launch) there is one process and each collective returns its input.

poprun serves this module as `horovod.torch` (from `poprun_stand_ins/`, put on the instances'
`PYTHONPATH`) only when no real Horovod is installed; a real one is never shadowed. Like Horovod,
every call but `init` needs `init()` first. Horovod's gradient machinery (`DistributedOptimizer`,
`broadcast_optimizer_state`) is not here: PopTorch's `trainingModel` already all-reduces its
replicas' gradients over the instances.
"""

from __future__ import annotations

import atexit
import enum
import operator
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from optimum_ipu.runtime.distributed import _close_process_group, process_group_backend
from optimum_ipu.sdk import launch as contract

__all__ = [
    "Average",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather",
    "allreduce",
    "allreduce_",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_parameters",
    "grouped_allreduce",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]


class ReduceOp(enum.IntEnum):
    """How `allreduce` combines the processes' tensors (Horovod's `hvd.Average`, `hvd.Sum`, ...)."""

    Average = 0
    Sum = 1
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Min, Max, Product = ReduceOp.Average, ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product

_TORCH_OPS = {
    ReduceOp.Average: dist.ReduceOp.SUM,  # divided by the size afterwards, as Horovod does
    ReduceOp.Sum: dist.ReduceOp.SUM,
    ReduceOp.Min: dist.ReduceOp.MIN,
    ReduceOp.Max: dist.ReduceOp.MAX,
    ReduceOp.Product: dist.ReduceOp.PRODUCT,
}

_initialized = False
_closes_at_exit = False


def init(*args: Any, **kwargs: Any) -> None:
    """Start Horovod: join torchrun's process group when the launch has more than one process.

    Horovod's arguments (communicators, process sets) have no meaning here and are ignored. The group
    is the one `poptorch.trainingModel` and `popdist.init()` join (same backends), so whichever comes
    first serves all three; it is shut down in step by every process at exit.
    """
    global _initialized, _closes_at_exit
    if int(os.environ.get(contract.INSTANCES_ENV, "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend=process_group_backend())
    if _distributed() and not _closes_at_exit:
        # Every process leaves the group together, before the interpreter's finalization (the reason is in
        # runtime.distributed); a PopTorch model registers the same, and the second call finds nothing to do.
        atexit.register(_close_process_group)
        _closes_at_exit = True
    if not _initialized and sys.modules.get("horovod.torch") is sys.modules[__name__] and _launch_rank() == 0:
        sys.stdout.flush()
        print("poprun: horovod.torch is optimum-ipu's stand-in (Horovod is not installed): its collectives run on "
              "torch.distributed over poprun's instances.", file=sys.stderr, flush=True)  # fmt: skip
    _initialized = True


def _launch_rank() -> int:
    """This process's rank in the launch, before or without `init()` (torchrun's `RANK`)."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get(contract.INSTANCE_ENV, "0"))


def shutdown() -> None:
    """Stop Horovod: later calls need `init()` again (the process group stays for PopTorch's models)."""
    global _initialized
    _initialized = False


def is_initialized() -> bool:
    """Whether `init()` was called (and not `shutdown()`)."""
    return _initialized


def _check_initialized() -> None:
    if not _initialized:
        raise ValueError("Horovod has not been initialized; use hvd.init().")


def _distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _instances(n: int) -> str:
    return "the 1 instance is 0" if n == 1 else f"the {n} instances are 0 {'and' if n == 2 else '...'} {n - 1}"


def _root(call: str, root_rank: Any) -> int:
    """`root_rank` as an instance index, or a ValueError naming the instances (every process raises alike)."""
    n = dist.get_world_size() if _distributed() else 1
    try:
        index = operator.index(root_rank)
    except TypeError:
        index = None
    if index is None or not 0 <= index < n:
        raise ValueError(f"hvd.{call}: root_rank={root_rank!r} names no instance: {_instances(n)}.")
    return index


# A tensor's shape and dtype as the processes exchange them: [ndim, dtype, d0 ... d7, product of the rest].
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)  # fmt: skip
_DIMS = 8


def _signature(tensor: torch.Tensor) -> torch.Tensor:
    shape = list(tensor.shape)
    dims = shape[:_DIMS] + [0] * (_DIMS - len(shape[:_DIMS]))
    rest = 1
    for d in shape[_DIMS:]:
        rest *= d
    code = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else len(_DTYPES)
    return torch.tensor([len(shape), code, *dims, rest], dtype=torch.int64)


def _described(row: list[int]) -> str:
    ndim, code = row[0], row[1]
    dims = row[2 : 2 + min(ndim, _DIMS)]
    shape = f"({dims[0]},)" if ndim == 1 else f"({', '.join(map(str, dims))}{', ...' if ndim > _DIMS else ''})"
    return f"shape {shape} {_DTYPES[code] if code < len(_DTYPES) else 'of another dtype'}"


def _check_alike(call: str, tensor: torch.Tensor, first_dim_may_differ: bool = False) -> None:
    """Every process passes a tensor of one shape and dtype (but for the first dimension, with
    `first_dim_may_differ`), as Horovod checks; else a ValueError on every process naming what each passed.

    Unchecked, gloo reduces tensors of different sizes into a wrong result on one process and leaves
    another waiting for data that never comes. The check is one small all-gather of the shapes.
    """
    if not _distributed():
        return
    mine = _signature(tensor)
    rows = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    rows = [row.tolist() for row in rows]
    compared = [row[:2] + row[3:] if first_dim_may_differ else row for row in rows]
    if any(row != compared[0] for row in compared):
        passed = "; ".join(f"instance {k} passed {_described(row)}" for k, row in enumerate(rows))
        alike = "shape (but for the first dimension) and dtype" if first_dim_may_differ else "shape and dtype"
        raise ValueError(
            f"hvd.{call}: the instances' tensors do not match ({passed}): every instance must pass a tensor of the "
            f"same {alike}, as in Horovod."
        )


def size() -> int:
    """Processes of the launch (poprun's instances)."""
    _check_initialized()
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's index among them."""
    _check_initialized()
    return _launch_rank()


def local_rank() -> int:
    """This process's index on this machine (torchrun's `LOCAL_RANK`; every instance runs on this one)."""
    _check_initialized()
    return int(os.environ.get(contract.LOCAL_INSTANCE_ENV, "0"))


def local_size() -> int:
    """Processes on this machine (torchrun's `LOCAL_WORLD_SIZE`)."""
    _check_initialized()
    return int(os.environ.get(contract.LOCAL_INSTANCES_ENV, "1"))


def _reduce_op(average: bool | None, op: ReduceOp | None) -> ReduceOp:
    if average is not None and op is not None:
        raise ValueError("The op parameter supersedes average; give one of them, not both.")
    if op is None:
        return ReduceOp.Sum if average is False else ReduceOp.Average
    if op not in _TORCH_OPS:
        raise ValueError(
            f"op={op!r} is not simulated: use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product."
        )
    return ReduceOp(op)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    **kwargs: Any,
) -> torch.Tensor:
    """Combine `tensor` over the processes in place (Average by default) and return it.

    `average=False` means Sum (Horovod's older spelling). An integer tensor's average is rounded
    toward zero.
    """
    _check_initialized()
    reduce = _reduce_op(average, op)
    _check_alike("allreduce", tensor)
    if prescale_factor != 1.0:
        tensor.mul_(prescale_factor)
    if _distributed():
        dist.all_reduce(tensor, op=_TORCH_OPS[reduce])
        if reduce == ReduceOp.Average:
            if tensor.is_floating_point() or tensor.is_complex():
                tensor.div_(dist.get_world_size())
            else:
                tensor.copy_(torch.div(tensor, dist.get_world_size(), rounding_mode="trunc"))
    if postscale_factor != 1.0:
        tensor.mul_(postscale_factor)
    return tensor


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              op: ReduceOp | None = None, **kwargs: Any) -> torch.Tensor:  # fmt: skip
    """`tensor` combined over the processes (Average by default), as a new tensor; `tensor` is unchanged."""
    return allreduce_(tensor.detach().clone(), average=average, name=name, op=op, **kwargs)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      op: ReduceOp | None = None, **kwargs: Any) -> list[torch.Tensor]:  # fmt: skip
    """Each of `tensors` combined over the processes, as new tensors, in order."""
    return [allreduce(t, average=average, op=op, **kwargs) for t in tensors]


def allgather(tensor: torch.Tensor, name: str | None = None, **kwargs: Any) -> torch.Tensor:
    """Every process's `tensor`, concatenated along the first dimension in rank order.

    As in Horovod, the processes' tensors may differ in their first dimension (the others must agree).
    """
    _check_initialized()
    piece = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()  # a scalar gathers as [1]
    if not _distributed():
        return piece.clone()
    _check_alike("allgather", piece, first_dim_may_differ=True)
    lengths = [torch.zeros(1, dtype=torch.int64, device=piece.device) for _ in range(dist.get_world_size())]
    dist.all_gather(lengths, torch.tensor([piece.shape[0]], dtype=torch.int64, device=piece.device))
    longest = int(max(n.item() for n in lengths))
    padded = torch.zeros((longest, *piece.shape[1:]), dtype=piece.dtype, device=piece.device)
    padded[: piece.shape[0]] = piece
    gathered = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(gathered, padded)
    return torch.cat([g[: int(n.item())] for g, n in zip(gathered, lengths)])


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None, **kwargs: Any) -> torch.Tensor:
    """Overwrite `tensor` with process `root_rank`'s, in place, and return it."""
    _check_initialized()
    root = _root("broadcast", root_rank)
    if _distributed():
        _check_alike("broadcast", tensor)
        dist.broadcast(tensor, src=root)
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None, **kwargs: Any) -> torch.Tensor:
    """Process `root_rank`'s `tensor`, as a new tensor; `tensor` is unchanged."""
    return broadcast_(tensor.detach().clone(), root_rank)


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                         root_rank: int) -> None:  # fmt: skip
    """Give every process `root_rank`'s values of `params`, in place.

    `params` is a `state_dict()` or `named_parameters()` (name, tensor pairs), as in Horovod; the
    processes must list the same names in the same order.
    """
    _check_initialized()
    _root("broadcast_parameters", root_rank)
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    with torch.no_grad():
        for name, value in items:
            if not isinstance(value, torch.Tensor):
                raise ValueError(
                    f"broadcast_parameters: {name!r} is a {type(value).__name__}, not a tensor: pass "
                    "model.state_dict() or model.named_parameters()."
                )
            broadcast_(value.data, root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, **kwargs: Any) -> Any:
    """Process `root_rank`'s `obj` (any picklable object)."""
    _check_initialized()
    root = _root("broadcast_object", root_rank)
    if not _distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=root)
    return box[0]


def __getattr__(name: str):
    """Any other Horovod name: an `AttributeError` naming what this stand-in provides, and why not the rest."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"horovod.torch.{name} is not provided by optimum-ipu's stand-in for Horovod (poprun serves it because "
        f"Horovod is not installed), which has {', '.join(__all__)}. PopTorch's trainingModel already "
        "all-reduces its replicas' gradients over poprun's instances; for anything else, pip install horovod."
    )
