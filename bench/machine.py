"""The machine a bench ran on, printed first by every bench: a timing holds only for its CPU.

Kept free of third-party imports so that a bench can print it from any Python environment, including
the 2022 interpreter and libraries `bench/host_work_env.sh` builds to redo the published notebooks'
host work as they ran it.
"""

from __future__ import annotations

import os
import platform
import sys

# CPU flags that decide how fast fp16 / bf16 arithmetic runs on a CPU.
FP16_FLAGS = ("avx2", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OPTIMUM_IPU_FP16_COMPUTE")


def cpu_description() -> str:
    """The CPU's name, which fp16-relevant flags it has, and the ISA limits set in the environment."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    present = " ".join(f if f in flags else f"-{f}" for f in FP16_FLAGS) if flags else "flags unknown"
    limits = (
        ", ".join(f"{v}={os.environ[v]}" for v in ISA_VARIABLES if os.environ.get(v)) or "no ISA limits set"
    )
    return f"CPU: {name} ({os.cpu_count()} cores visible); {present} (- = absent); {limits}"


def python_description(*packages: str) -> str:
    """The interpreter's version and the versions of `packages` (those importable), for a bench whose
    figures depend on the Python doing the work."""
    from importlib.metadata import PackageNotFoundError, version

    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            versions.append(f"{name} absent")
    return f"Python {platform.python_version()} ({sys.executable}); " + ", ".join(versions)
