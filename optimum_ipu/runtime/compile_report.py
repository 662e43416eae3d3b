"""Compiling for the simulated IPU: checks, the hardware report, and the executable.

"Compilation" here does what a user of PopTorch relies on it for: it refuses configurations a real
IPU system would refuse (with a message saying what to change), estimates per-IPU memory and fails
like Poplar's out-of-memory when a layout cannot fit, estimates the throughput a real system would
reach. The executables themselves (`executor.py`) are built once the optimizer exists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from optimum_ipu.runtime import checks
from optimum_ipu.runtime.executor import batch_size_of, split_batch

logger = logging.getLogger(__name__)


@dataclass
class CompilationReport:
    """The hardware report (None when `analyse_hardware=False`), compile time and IPUs attached."""

    report: Any
    seconds: float
    num_ipus: int


def _first_micro_batch(batch: Mapping[str, Any], micro_batch_size: int) -> dict[str, Any]:
    parts = max(batch_size_of(batch) // micro_batch_size, 1)
    return split_batch(batch, parts)[0]


def _analyse(pipelined, ipu_config, micro_batch: dict, *, training: bool, hardware: str, optimizer: str, fp32: bool):
    from optimum_ipu.costmodel.analysis import analyse

    report = analyse(
        pipelined.module, pipelined.plan, ipu_config, micro_batch_size=batch_size_of(micro_batch),
        sample_inputs=micro_batch, hardware=hardware, training=training, optimizer=optimizer, fp32=fp32,
        cache_dir=ipu_config.executable_cache_dir or None,
    )  # fmt: skip
    report.memory.raise_if_out_of_memory()
    return report


def _log_done(report, seconds: float) -> None:
    verb = "Loaded" if report is not None and report.from_cache else "Compiled"
    logger.info("%s model in %.2f secs", verb, seconds)


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
) -> CompilationReport:
    """Check and analyse `pipelined` for training under `ipu_config` (in training mode)."""
    start = time.perf_counter()
    logger.info("Compiling Model...")
    with tqdm(total=2, desc="Graph compilation", leave=False, disable=not logger.isEnabledFor(logging.INFO)) as bar:
        checks.check_pipelined_training(ipu_config.gradient_accumulation_steps, ipu_config.ipus_per_replica)
        num_ipus = checks.check_num_ipus(ipu_config.ipus_per_replica, ipu_config.replication_factor, auto_round_num_ipus)
        bar.update()
        report = None
        if analyse_hardware:
            micro_batch = _first_micro_batch(sample_batch, micro_batch_size)
            report = _analyse(
                pipelined, ipu_config, micro_batch, training=True, hardware=hardware, optimizer=optimizer_name, fp32=fp32
            )
        bar.update()
    seconds = time.perf_counter() - start
    _log_done(report, seconds)
    if report is not None:
        logger.info("\n%s", report.summary())
    return CompilationReport(report, seconds, num_ipus)


def compile_inference(
    pipelined,
    ipu_config,
    *,
    sample_batch: Mapping[str, Any],
    hardware: str = "mk2",
    fp32: bool = False,
    pipelined_execution: bool = False,
    auto_round_num_ipus: bool = False,
    analyse_hardware: bool = True,
) -> CompilationReport:
    """Check and analyse `pipelined` for inference under `ipu_config` (in inference mode)."""
    start = time.perf_counter()
    logger.info("Compiling Model...")
    if pipelined_execution:
        checks.check_pipelined_inference(ipu_config.device_iterations, ipu_config.ipus_per_replica)
    num_ipus = checks.check_num_ipus(ipu_config.ipus_per_replica, ipu_config.replication_factor, auto_round_num_ipus)
    report = None
    if analyse_hardware:
        per_call = ipu_config.device_iterations * ipu_config.replication_factor
        micro_batch = _first_micro_batch(sample_batch, max(batch_size_of(sample_batch) // per_call, 1))
        report = _analyse(
            pipelined, ipu_config, micro_batch, training=False, hardware=hardware, optimizer="adamw", fp32=fp32
        )
    seconds = time.perf_counter() - start
    _log_done(report, seconds)
    if report is not None:
        logger.info("\n%s", report.summary())
    return CompilationReport(report, seconds, num_ipus)
