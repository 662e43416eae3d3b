"""PopTorch's versions of two `torch_cluster` ops used by PyTorch Geometric models: `nearest` and `fps`.

PopTorch lowers both to IPU graphs (a distance matrix, then arg-min / arg-max) with torch_cluster's
results, and checks its arguments before; here they are the same computation in PyTorch, with
PopTorch's signatures, checks and output types (int32 indices, as its IPU graphs return).
"""

from __future__ import annotations

import torch

from optimum_ipu.poptorch._logging import Error

__all__ = ["fps", "nearest"]


def _batch_list(batch: list[int] | torch.Tensor, name: str) -> list[int]:
    values = batch.tolist() if isinstance(batch, torch.Tensor) else list(batch)
    if values != sorted(values):
        raise ValueError(f"'{name}' is not sorted")
    return values


def nearest(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_x: list[int] | torch.Tensor | None = None,
    batch_y: list[int] | torch.Tensor | None = None,
) -> torch.Tensor:
    """For each point of `x`, the index of the nearest point of `y` (Euclidean) in the same sample.

    `batch_x` / `batch_y` (sorted lists or tensors, one sample index per point) assign the points to
    samples; left out, every point is in sample 0. Points are rows of 2-D tensors (a 1-D tensor is
    one feature per point). Every sample of `x` must have points in `y`. Returns int32 indices, as
    PopTorch does; of equally near points, the first.
    """
    if not isinstance(x, torch.Tensor):
        raise Error(f"`nearest` must take a torch.tensor `x` input. {type(x)} is not supported.")
    if not isinstance(y, torch.Tensor):
        raise Error(f"`nearest` must take a torch.tensor `y` input. {type(y)} is not supported.")
    for name, batch in (("batch_x", batch_x), ("batch_y", batch_y)):
        if batch is not None and not isinstance(batch, (list, torch.Tensor)):
            raise Error(
                f"`batch_x` and `batch_y` must be torch.Tensors or lists while `{name}` is of type {type(batch)}."
            )
    x2 = x.reshape(-1, 1) if x.dim() == 1 else x
    y2 = y.reshape(-1, 1) if y.dim() == 1 else y
    if x2.dim() > 2 or y2.dim() > 2:
        raise ValueError(
            f"Inputs `x` and `y` should be max 2D tensors, while `x` has {x.dim()} dims and `y` has {y.dim()} dims."
        )
    if x2.shape[1] != y2.shape[1]:
        raise ValueError(f"Inputs shapes inconsistent x.shape[1]={x2.shape[1]} vs. y.shape[1]={y2.shape[1]}")
    bx = _batch_list(batch_x, "batch_x") if batch_x is not None and len(batch_x) else None
    by = _batch_list(batch_y, "batch_y") if batch_y is not None and len(batch_y) else None
    if bx is None and by is None:
        bx, by = [0] * x2.shape[0], [0] * y2.shape[0]
    bx = bx if bx is not None else [0] * x2.shape[0]
    by = by if by is not None else [0] * y2.shape[0]
    if len(bx) != x2.shape[0]:
        raise ValueError("x.size(0) == batch_x.size(0)")
    if len(by) != y2.shape[0]:
        raise ValueError("y.size(0) == batch_y.size(0)")
    if not set(bx) <= set(by):
        raise ValueError("Some batch indices occur in 'batch_x' that do not occur in 'batch_y'")
    dtype = torch.promote_types(x2.dtype, torch.float32) if x2.is_floating_point() else torch.float32
    distances = torch.cdist(x2.to(dtype), y2.to(dtype))
    samples_x = torch.tensor(bx, device=x.device)
    samples_y = torch.tensor(by, device=x.device)
    distances = distances.masked_fill(samples_x[:, None] != samples_y[None, :], float("inf"))
    return distances.argmin(dim=1).to(torch.int32)


def fps(src: torch.Tensor, ptr: list[int], ratio: float = 0.5, random_start: bool = False) -> torch.Tensor:
    """Farthest point sampling: per sample, `ceil(ratio * points)` points, each the farthest from those taken.

    `src` [N, D] holds the points of all samples; sample i is rows `ptr[i]:ptr[i + 1]`. Each sample
    starts from its first point, or a random one with `random_start` (torch's generator), then
    repeatedly takes the point whose distance to the nearest point taken is largest (the first of
    equals). Returns the taken rows' indices into `src`, sample by sample, as int32.
    """
    if not isinstance(src, torch.Tensor):
        raise Error(f"`fps` must take a torch.tensor input. {type(src)} is not supported.")
    if not isinstance(ptr, list):
        raise Error("`ptr` must be a list of integers.")
    if not len(ptr) >= 2:
        raise Error("`ptr` must containt at least 2 elements.")
    if not isinstance(ratio, float):
        raise Error(f"`ratio` must be of float type. {type(ratio)} is not supported.")
    if not isinstance(random_start, bool):
        raise Error(f"`random_start` must be of bool type. {type(random_start)} is not supported.")
    if ratio <= 0.0 or ratio > 1.0:
        raise Error(f"`ratio` ({ratio}) has to be in range (0.0, 1.0>")
    if src.dim() != 2:
        raise Error(f"`src` is supposed to be 2d Tensor, while it has {src.dim()} dims")
    if len(ptr) > src.shape[0] + 1:
        raise Error(f"`ptr` length ({len(ptr)}) is supposed to be < src.size(0) ({src.shape[0]})")
    points = src.detach().to(
        torch.promote_types(src.dtype, torch.float32) if src.is_floating_point() else torch.float32
    )
    # ceil(count * ratio) in float32, as PopTorch and torch_cluster compute it (25 * 0.6 rounds up to 16).
    sizes = torch.tensor(ptr[1:]) - torch.tensor(ptr[:-1])
    counts = torch.ceil(sizes.float() * torch.tensor(ratio, dtype=torch.float32)).long()
    taken: list[int] = []
    for (start, end), count in zip(zip(ptr[:-1], ptr[1:]), counts.tolist()):
        if count == 0:
            continue
        sample = points[start:end]
        first = int(torch.randint(0, end - start, ())) if random_start else 0
        chosen = [first]
        nearest_taken = torch.cdist(sample, sample[first : first + 1]).squeeze(1)
        for _ in range(count - 1):
            farthest = int(nearest_taken.argmax())
            chosen.append(farthest)
            nearest_taken = torch.minimum(
                nearest_taken, torch.cdist(sample, sample[farthest : farthest + 1]).squeeze(1)
            )
        taken.extend(start + i for i in chosen)
    return torch.tensor(taken, dtype=torch.int32, device=src.device)
