"""Where each encoder layer goes: the `layers_per_ipu` rule of Optimum Graphcore, as a pure function.

This is the one place that turns an IPU config's `layers_per_ipu` (with `-1` wildcards) into an IPU
index per layer. Pipelining, the memory model and the layout search all build on it, so it knows
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
    raise PlacementError(  # Optimum Graphcore's sentence first: code that matches on it keeps working
        "layers_per_ipu has a non-default value set, but its length does not match ipus_per_replica: "
        f"layers_per_ipu={layers} has {len(layers)} entries but ipus_per_replica={ipus_per_replica}. "
        f"Give one entry per IPU, or set ipus_per_replica={len(layers)}."
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
                "layers_per_ipu does not define the correct number of layers for the current model: "
                f"layers_per_ipu={layers} places {explicit} layers but the model has {num_layers}. "
                f"Make the counts sum to {num_layers}, or use -1 on some IPUs to split the rest evenly."
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


def encoder_decoder_cut(
    counts: Sequence[int], num_encoder_layers: int, attribute: str = "layers_per_ipu"
) -> int:
    """How many of a pipeline's IPUs (with `counts` layers each, encoder then decoder) the encoder takes
    when the encoder and the decoder run as two pipelines of their own, as for generation.

    The cut must fall between two IPUs (no IPU holds layers of both) and give the encoder a power of
    two of IPUs; of the cuts that qualify (empty IPUs make several), the largest, as Optimum Graphcore
    chose it. `attribute` names the setting in the error (`inference_layers_per_ipu`).

    >>> encoder_decoder_cut([0, 8, 8, 0], 8)
    2
    """
    running, ends, cuts = 0, [], []
    for ipus, count in enumerate(counts, start=1):
        running += count
        if running == num_encoder_layers:
            ends.append(ipus)
            if ipus & (ipus - 1) == 0:
                cuts.append(ipus)
    if not cuts:
        where = (
            f"they end with IPU {ends[-1] - 1}, so the encoder would take {ends[-1]} IPUs"
            if ends
            else "an IPU holds layers of both"
        )
        raise PlacementError(  # Optimum Graphcore's sentence first, then ours
            f"Unable to find a valid split of ipu_config.{attribute}: "
            f"{attribute}={list(counts)} cannot be split between the encoder ({num_encoder_layers} layers) and the "
            f"decoder ({sum(counts) - num_encoder_layers} layers): the encoder's layers must fill the first 1, 2, 4, "
            f"... IPUs exactly, and {where}. Move layers so the encoder's end on IPU 0, 1, 3, 7, ..."
        )
    return max(cuts)
