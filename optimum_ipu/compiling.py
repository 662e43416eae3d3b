"""Compiling for the simulated IPU: checks and the hardware report, returned as a `CompileResult`.

"Compilation" here does what a user of PopTorch relies on it for: it refuses configurations a real
IPU system would refuse (with a message saying what to change), estimates per-IPU memory and fails
like Poplar's out-of-memory when a layout cannot fit, estimates the throughput a real system would
reach. The executables themselves (`runtime/executor.py`) are built once the optimizer exists.

It sits above `runtime/` (whose checks it runs) and `costmodel/` (whose estimate it reports), so
neither of those imports the other; IPUTrainer and the pipelines call it. `CompileResult` holds the
cost model's `CompileReport` with what compiling itself measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from optimum_ipu._once import warn_once
from optimum_ipu.runtime import checks
from optimum_ipu.runtime.batches import batch_size_of, split_batch

logger = logging.getLogger(__name__)


_HALF_PARTIALS = {
    "emulated": "fp16 values, fp32 partial sums (emulated on the host's fp32 units), fp16 results",
    "native": "torch's native fp16 kernels",
}


@dataclass
class CompileResult:
    """What compiling produced: the cost model's report, time taken, IPUs attached, fp16 compute mode.

    Attributes:
        report: the cost model's `CompileReport` (None when `analyse_hardware=False`).
        seconds: compile time (excluded from the speed metrics, as PopTorch's).
        num_ipus: IPUs attached (a power of two).
        fp16_compute: "emulated", "native", or None for an fp32 run.
    """

    report: Any
    seconds: float
    num_ipus: int
    fp16_compute: str | None = None

    def describe_precision(self) -> str:
        """One line for the log: how fp16 matmuls are computed on this backend."""
        if self.fp16_compute is None:
            return "precision: fp32"
        return f"precision: fp16, matmuls {self.fp16_compute} ({_HALF_PARTIALS[self.fp16_compute]})"


def _first_micro_batch(batch: Mapping[str, Any], micro_batch_size: int) -> dict[str, Any]:
    parts = max(batch_size_of(batch) // micro_batch_size, 1)
    return split_batch(batch, parts)[0]




def _workload(ipu_config, micro_batch: dict, *, training: bool, optimizer: str, fp32: bool, ipus_per_replica: int,
              state_types=None):  # fmt: skip
    """The cost model's workload of `ipu_config` in its current mode, for micro-batches like `micro_batch`."""
    from optimum_ipu.costmodel.workload import Workload

    return Workload.from_ipu_config(
        ipu_config, micro_batch_size=batch_size_of(micro_batch), training=training, optimizer=optimizer, fp32=fp32,
        ipus_per_replica=ipus_per_replica, state_types=state_types,
    )  # fmt: skip


def _analyse(model, plan, workload, micro_batch: dict, *, hardware: str, cache_dir: str | None = None,
             memory_check: str = "auto"):  # fmt: skip
    """Price `workload` for `model` placed by `plan`; an out-of-memory estimate is raised or warned of."""
    from optimum_ipu.costmodel.analysis import analyse_workload
    from optimum_ipu.costmodel.memory import memory_check_from_environment

    training = workload.training
    report = analyse_workload(
        model, plan, workload, micro_batch, hardware=hardware, cache_dir=cache_dir or None
    )
    check = memory_check_from_environment() if memory_check in (None, "auto") else memory_check
    memory = report.memory
    memory.raise_if_out_of_memory(check)
    near = memory.may_not_fit or memory.surely_out_of_memory  # what a run going ahead is warned of
    if near:
        worst = max((memory.ipus[i] for i in near), key=lambda m: m.total)
        message = (
            f"{'Training' if training else 'Inference'}: IPU {worst.ipu}'s estimated memory is "
            f"{100 * worst.total / memory.capacity:.0f}% of its limit, within or beyond the memory model's error of "
            f"±{100 * memory.error:.0f}% (IPUs {', '.join(map(str, near))}): a real IPU may not fit this layout. "
            f"Going ahead (memory check: {check}); the compile report has the per-IPU table."
        )
        warn_once(logger, message)
    return report


def _finish(report, start: float, num_ipus: int, fp16_compute: str | None) -> CompileResult:
    result = CompileResult(report, time.perf_counter() - start, num_ipus, fp16_compute)
    verb = "Loaded" if report is not None and report.from_cache else "Compiled"
    logger.info("%s model in %.2f secs", verb, result.seconds)
    logger.info(result.describe_precision())
    if report is not None:
        report.precision = result.describe_precision()
        logger.info("\n%s", report.summary())
    return result


def compile_training(
    pipelined,
    ipu_config,
    *,
    sample_batch: Mapping[str, Any],
    micro_batch_size: int,
    hardware: str = "mk2",
    optimizer_name: str = "adamw",
    fp32: bool = False,
    auto_round_num_ipus: bool = False,
    analyse_hardware: bool = True,
    fp16_compute: str | None = None,
    state_types=None,
    memory_check: str = "auto",
    processes: int = 1,
) -> CompileResult:
    """Check and analyse `pipelined` for training under `ipu_config` (in training mode).

    `state_types`: the optimizer's state types (`costmodel.workload.StateTypes`; default Optimum
    Graphcore's for the precision). `memory_check`: when an out-of-memory estimate refuses the layout
    ("margin", "strict", "off"; "auto" reads `OPTIMUM_IPU_MEMORY_CHECK`, see `MemoryReport`).
    `processes`: the processes sharing the run's replicas or stages out (torchrun's world size), each
    attaching to its share of the IPUs.
    """
    start = time.perf_counter()
    logger.info("Compiling Model...")
    with tqdm(
        total=2, desc="Graph compilation", leave=False, disable=not logger.isEnabledFor(logging.INFO)
    ) as bar:
        checks.check_pipelined_training(
            ipu_config.gradient_accumulation_steps, ipu_config.ipus_per_replica, pipelined.plan.forward_stages
        )
        num_ipus = checks.check_num_ipus(
            ipu_config.ipus_per_replica, ipu_config.replication_factor, auto_round_num_ipus, processes
        )
        bar.update()
        report = None
        if analyse_hardware:
            micro_batch = _first_micro_batch(sample_batch, micro_batch_size)
            workload = _workload(ipu_config, micro_batch, training=True, optimizer=optimizer_name, fp32=fp32,
                                 ipus_per_replica=pipelined.plan.ipus_per_replica, state_types=state_types)  # fmt: skip
            report = _analyse(
                pipelined.module, pipelined.plan, workload, micro_batch, hardware=hardware,
                cache_dir=ipu_config.executable_cache_dir, memory_check=memory_check,
            )  # fmt: skip
        bar.update()
    return _finish(report, start, num_ipus, fp16_compute)


def compile_inference(
    pipelined,
    ipu_config,
    *,
    sample_batch: Mapping[str, Any],
    micro_batch_size: int,
    hardware: str = "mk2",
    fp32: bool = False,
    auto_round_num_ipus: bool = False,
    analyse_hardware: bool = True,
    fp16_compute: str | None = None,
    memory_check: str = "auto",
) -> CompileResult:
    """Check and analyse `pipelined` for sharded inference under `ipu_config` (in inference mode)."""
    start = time.perf_counter()
    logger.info("Compiling Model...")
    num_ipus = checks.check_num_ipus(
        ipu_config.ipus_per_replica, ipu_config.replication_factor, auto_round_num_ipus
    )
    report = None
    if analyse_hardware:
        micro_batch = _first_micro_batch(sample_batch, micro_batch_size)
        workload = _workload(ipu_config, micro_batch, training=False, optimizer="adamw", fp32=fp32,
                             ipus_per_replica=pipelined.plan.ipus_per_replica)  # fmt: skip
        report = _analyse(
            pipelined.module, pipelined.plan, workload, micro_batch, hardware=hardware,
            cache_dir=ipu_config.executable_cache_dir, memory_check=memory_check,
        )  # fmt: skip
    return _finish(report, start, num_ipus, fp16_compute)


def report_layout(
    model,
    plan,
    workload,
    *,
    micro_batch: Mapping[str, Any],
    num_ipus: int,
    hardware: str = "mk2",
    fp16_compute: str | None = None,
    memory_check: str = "auto",
) -> CompileResult:
    """The memory table and throughput estimate of a layout whose compile checks the caller ran itself.

    PopTorch's wrappers check with PopTorch's own rules and wording (sharded training, for one, has
    no gradient-accumulation rule), build the cost model's `Workload` from their options, then report
    through here: the same cost model and log lines as `compile_training` / `compile_inference`, and
    the same out-of-memory error.
    """
    start = time.perf_counter()
    logger.info("Compiling Model...")
    report = _analyse(model, plan, workload, dict(micro_batch), hardware=hardware, memory_check=memory_check)
    return _finish(report, start, num_ipus, fp16_compute)
