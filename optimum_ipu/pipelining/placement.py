"""Where each encoder layer goes: the `layers_per_ipu` rule of Optimum Graphcore, as a pure function.

This is the one place that turns an IPU config's `layers_per_ipu` (with `-1` wildcards) into an IPU
index per layer. Pipelining, the memory model and the layout planner all build on it, so it knows
nothing of models: only counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from optimum_ipu.configuration.schema import IPUConfigError


class PlacementError(IPUConfigError):
    """A `layers_per_ipu` that cannot place the model's layers on the pipeline's IPUs.

    An `IPUConfigError` (Optimum Graphcore's `IncompatibleIPUConfigError`, a `ValueError`), the class
    the original raised for a config that does not fit the model, so code catching it still does.
    """


def expand_layers_per_ipu(layers_per_ipu: Sequence[int], ipus_per_replica: int) -> list[int]:
    """Return `layers_per_ipu` with one entry per IPU.

    A single `[-1]` (or any all-wildcard list) stands for "split evenly over every IPU", so it is
    widened to `ipus_per_replica` wildcards; any other list must already have one entry per IPU.
    """
    layers = [int(n) for n in layers_per_ipu]
    if any(n < -1 for n in layers):
        raise PlacementError(f"layers_per_ipu={layers}: entries must be >= -1 (-1 is the wildcard).")
    if len(layers) == ipus_per_replica:
        return layers
    if layers and all(n == -1 for n in layers):
        return [-1] * ipus_per_replica
    raise PlacementError(
        f"layers_per_ipu={layers} has {len(layers)} entries but ipus_per_replica={ipus_per_replica}: "
        f"give one entry per IPU, or set ipus_per_replica={len(layers)}."
    )


def layer_counts_per_ipu(num_layers: int, layers_per_ipu: Sequence[int], ipus_per_replica: int) -> list[int]:
    """Resolve wildcards into the number of layers on each IPU of one replica's pipeline.

    Explicit counts are honoured; the remaining layers are split evenly over the wildcard IPUs with
    the remainder on the last wildcard IPU. With one IPU everything is on IPU 0.
    """
    if num_layers < 0:
        raise PlacementError(f"the model has a negative number of layers ({num_layers}).")
    if ipus_per_replica < 1:
        raise PlacementError(f"ipus_per_replica must be >= 1, got {ipus_per_replica}.")
    if ipus_per_replica == 1:
        return [num_layers]

    layers = expand_layers_per_ipu(layers_per_ipu, ipus_per_replica)
    wildcards = [i for i, n in enumerate(layers) if n == -1]
    explicit = sum(n for n in layers if n != -1)

    if not wildcards:
        if explicit != num_layers:
            raise PlacementError(
                f"layers_per_ipu={layers} places {explicit} layers but the model has {num_layers}: "
                f"make the counts sum to {num_layers}, or use -1 on some IPUs to split the rest evenly."
            )
        return layers

    rest = num_layers - explicit
    if rest < 0:
        raise PlacementError(
            f"layers_per_ipu={layers} places {explicit} layers explicitly but the model has only "
            f"{num_layers}: lower the explicit counts."
        )
    share, remainder = divmod(rest, len(wildcards))
    counts = list(layers)
    for i in wildcards:
        counts[i] = share
    counts[wildcards[-1]] += remainder
    return counts


def ipu_of_each_layer(num_layers: int, layers_per_ipu: Sequence[int], ipus_per_replica: int) -> list[int]:
    """Return the IPU index of every layer, in layer order.

    >>> ipu_of_each_layer(6, [-1], 2)
    [0, 0, 0, 1, 1, 1]
    >>> ipu_of_each_layer(7, [-1, 2, -1, 2], 4)
    [0, 1, 1, 2, 2, 3, 3]
    """
    counts = layer_counts_per_ipu(num_layers, layers_per_ipu, ipus_per_replica)
    return [ipu for ipu, count in enumerate(counts) for _ in range(count)]


def stage_of_each_block(ipus: Sequence[int], ipus_per_replica: int) -> list[int]:
    """Pipeline stage of each block, from each block's IPU in the order the forward runs them.

    As PopTorch's `AutoStage.AutoIncrement` (which Optimum Graphcore sets) numbers them: while the
    forward moves on to higher IPUs, IPU k's blocks are stage k; once it goes back to an IPU it had
    left (a head tied to the word embedding, on IPU 0 after the last layer), each change of IPU from
    there on starts a stage of its own, numbered on from `ipus_per_replica`.
    """
    stages: list[int] = []
    highest, returned = 0, False
    for position, ipu in enumerate(ipus):
        if not returned and ipu >= highest:
            highest = ipu
            stages.append(ipu)
        elif returned and ipu == ipus[position - 1]:
            stages.append(stages[-1])
        else:
            returned = True
            stages.append(max(ipus_per_replica, stages[-1] + 1))
    return stages
