"""What to change when a layout does not fit: each remedy re-estimated, not guessed.

Every suggestion is checked by running the memory model again with the change applied, so the
advice says how much it frees on the IPU that overflows and whether the whole pipeline then fits.
"""

from __future__ import annotations

from collections.abc import Mapping

from optimum_ipu.costmodel.hardware import ChipSpec
from optimum_ipu.costmodel.memory import MemoryReport, MiB, estimate_memory
from optimum_ipu.costmodel.profile import ModelProfile
from optimum_ipu.costmodel.workload import Workload


def _outcome(before: MemoryReport, after: MemoryReport, ipu: int) -> str:
    total = after.ipus[ipu].total
    verdict = (
        "fits" if after.fits else f"still out of memory on IPU {', '.join(map(str, after.out_of_memory))}"
    )
    return (
        f"IPU {ipu}: {before.ipus[ipu].total / MiB:.0f} -> {total / MiB:.0f} MiB "
        f"({100 * total / after.capacity:.0f}%), {verdict}"
    )


def move_layers(
    profile: ModelProfile, layers_per_ipu: list[int], workload: Workload, hardware: ChipSpec
) -> list[int] | None:
    """Shift layers one at a time from the fullest IPU to its emptier neighbour until all fit."""
    n = workload.ipus_per_replica
    counts = list(layers_per_ipu)
    for _ in range(4 * max(profile.num_layers, 1)):
        report = estimate_memory(profile, profile.placement(counts, n), workload, hardware)
        if report.fits:
            return counts
        usage = [m.total / report.capacity for m in report.ipus]
        worst = max(range(n), key=lambda k: usage[k] if counts[k] else -1.0)
        if not counts[worst]:
            return None
        neighbours = [j for j in (worst - 1, worst + 1) if 0 <= j < n]
        target = min(neighbours, key=lambda j: usage[j])
        if usage[target] >= usage[worst]:
            return None
        counts[worst] -= 1
        counts[target] += 1
    return None


def advise(
    profile: ModelProfile,
    ipu_of: Mapping[str, int],
    workload: Workload,
    hardware: ChipSpec,
    report: MemoryReport,
) -> list[str]:
    """Concrete changes that relieve the IPUs out of memory in `report`, most effective first."""
    if report.fits:
        return []
    worst = max(report.out_of_memory, key=lambda k: report.ipus[k].total)
    mem = report.ipus[worst]
    options: list[tuple[int, str]] = []

    def trial(change: str, new_workload: Workload, placement: Mapping[str, int] = ipu_of) -> None:
        after = estimate_memory(profile, placement, new_workload, hardware)
        options.append(
            (
                after.ipus[worst].total if not after.fits else -1,
                f"{change} ({_outcome(report, after, worst)})",
            )
        )

    n = workload.ipus_per_replica
    if n > 1:
        current = [m.layers for m in report.ipus]
        moved = move_layers(profile, current, workload, hardware)
        if moved is not None and moved != current:
            trial(
                f"move layers off IPU {worst}: layers_per_ipu={moved}", workload, profile.placement(moved, n)
            )
    if (
        workload.training
        and not workload.recompute_checkpoint_every_layer
        and mem.activations > 0.05 * report.capacity
    ):
        trial(
            "recompute_checkpoint_every_layer=True", workload.replace(recompute_checkpoint_every_layer=True)
        )
    if mem.optimizer:
        trial("optimizer_state_offchip=True", workload.replace(optimizer_state_offchip=True))
        if workload.replication_factor > 1 and not workload.replicated_tensor_sharding:
            trial("replicated_tensor_sharding=True", workload.replace(replicated_tensor_sharding=True))
    if mem.table_bytes:
        factor = workload.embedding_factor * 2
        trial(
            f"embedding_serialization_factor={factor}",
            workload.replace(embedding_factor=factor, embedding_splits_per_ipu=None),
        )
    proportion = workload.matmul_proportion[worst]
    if mem.temporaries > 0.1 * report.capacity and proportion > 0.05:
        lower = list(workload.matmul_proportion)
        lower[worst] = round(max(0.05, proportion / 2), 2)
        trial(
            f"matmul_proportion={lower} (matmuls on IPU {worst} run slower)",
            workload.with_matmul_proportion(lower),
        )
    activations = mem.stash + mem.activations
    if workload.micro_batch_size > 1 and activations:
        half = workload.micro_batch_size // 2
        freed = activations * (1 - half / workload.micro_batch_size)
        options.append(
            (int(mem.total - freed), f"lower the micro-batch to {half} and raise gradient accumulation to keep the "
             f"combined batch (IPU {worst}: about {(mem.total - freed) / MiB:.0f} MiB; activations scale with it)")
        )  # fmt: skip
    options.sort(key=lambda o: o[0])
    advice = [text for _, text in options]
    fixed = mem.code + mem.weights + mem.gradients
    if fixed > report.capacity:
        advice.insert(
            0,
            f"IPU {worst}'s code, weights and gradient accumulators alone take {fixed / MiB:.0f} MiB: only "
            "fewer layers there (more IPUs per replica) can fix it",
        )
    advice.append(
        f"spread the model over more IPUs (ipus_per_replica={2 * n}), or let `optimum-ipu plan ... --auto` "
        "search layouts and matmul proportions"
    )
    return advice
