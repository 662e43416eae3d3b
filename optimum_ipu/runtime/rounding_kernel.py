"""Stochastic rounding's draws and noise in one compiled pass over a chunk (`rounding_kernel.c`).

Rounding a chunk with torch ops draws one Mersenne Twister word per two elements through `random_()`,
one C++ call per word (about 3.6 ns each on the project's AMD EPYC), then makes four more passes to cut
the noise to 13 bits, widen it, add it and cut the low bits. The C function does the same draws from
the same generator (its state read with `get_state()` and written back with `set_state()`), and adds
and cuts the noise in the same pass: the same bits, about ten times faster. It is the largest single
cost of an fp16 update that torch alone could not take back.

It is compiled on first use with the machine's C compiler (`$CC`, else `cc`, `gcc` or `clang`), for
this CPU (`-march=native`, retried without it), into `<cache>/kernels/` (see `optimum_ipu._cache_folder`),
under a name made of its source, flags and CPU, so a shared home folder serves each machine its own.
A compiled file is never trusted unchecked: `rounding.py` compares it against torch's own draws first.
Without a compiler, or with `OPTIMUM_IPU_COMPILED_ROUNDING=off`, rounding runs on torch's calls, with the
same bits; the first case is said once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from optimum_ipu._cache_folder import cache_root
from optimum_ipu._once import warn_once

logger = logging.getLogger(__name__)

ENVIRONMENT = "OPTIMUM_IPU_COMPILED_ROUNDING"
_SOURCE = Path(__file__).with_name("rounding_kernel.c")
_FLAG_SETS = (["-O3", "-march=native"], ["-O3"])  # this CPU's vector units where the compiler knows it
_lock = threading.Lock()
_loaded: dict[str, Callable[[torch.Tensor, torch.Generator], bool] | None] = {}

RoundChunk = Callable[[torch.Tensor, torch.Generator], bool]


def wanted() -> bool:
    """Whether the environment lets the kernel be used (`OPTIMUM_IPU_COMPILED_ROUNDING`: `auto`, `off`)."""
    value = os.environ.get(ENVIRONMENT, "auto").strip().lower()
    if value not in ("auto", "off"):
        raise ValueError(
            f"{ENVIRONMENT}={os.environ[ENVIRONMENT]!r} is not a setting: use 'auto' (compile the stochastic-rounding "
            "kernel when a C compiler is found; the default) or 'off' (torch's calls only: the same bits, slower)."
        )
    return value == "auto"


def load_rounding_kernel() -> RoundChunk | None:
    """The compiled `round_chunk(part, generator)`, built once per process; None when it cannot be built.

    `part` is a contiguous fp32 CPU tensor, rounded in place (its 13 low bits cut after the noise);
    `generator` a CPU `torch.Generator`, advanced as the torch calls would advance it. It returns False,
    having changed nothing, for a generator state it does not read. It holds no lock on the generator
    between reading and writing its state: give it a generator no other thread draws from.
    """
    with _lock:
        if "kernel" not in _loaded:
            _loaded["kernel"] = _build()
        return _loaded["kernel"]


def _build() -> RoundChunk | None:
    try:
        compiler = shlex.split(os.environ.get("CC", "")) or [
            next(filter(None, map(shutil.which, ("cc", "gcc", "clang"))), "")
        ]
    except ValueError as error:  # CC with an unclosed quote
        _fall_back(f"CC={os.environ['CC']!r} cannot be read as a command ({error})")
        return None
    if not compiler[0]:
        _fall_back("no C compiler (cc, gcc or clang) was found; set CC to one")
        return None
    errors = []
    for flags in _FLAG_SETS:
        try:
            return _bind(ctypes.CDLL(str(_compiled(compiler, flags))))
        except Exception as error:  # noqa: BLE001 (a compiler, a folder or a home that fails: torch's calls)
            errors.append(f"{' '.join([Path(compiler[0]).name, *compiler[1:], *flags])}: "
                          f"{(str(error).strip().splitlines() or [type(error).__name__])[-1]}")  # fmt: skip
    _fall_back(f"compiling {_SOURCE.name} failed ({'; '.join(errors)})")
    return None


def _fall_back(why: str) -> None:
    warn_once(
        logger,
        "Stochastic rounding runs on torch's generator calls, without its compiled kernel: %s. The rounded values "
        "are the same; the rounding is several times slower. %s=off says this is wanted.",
        why, ENVIRONMENT, key="no compiled rounding",
    )  # fmt: skip


def _cpu() -> str:
    """What the compiled code depends on besides its source and flags: the processor and its features."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    picked = [line for line in lines if line.startswith(("model name", "flags", "Features"))][:2]
    return "\n".join([platform.machine(), platform.processor(), *picked])


def _compiled(compiler: list[str], flags: list[str]) -> Path:
    """The shared library for `flags`, compiled now unless the cache has it (written whole, then renamed)."""
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(compiler).encode(), " ".join(flags).encode(), _cpu().encode()]))
    name = f"rounding-{key.hexdigest()[:24]}.so"
    for folder in _folders():
        target = folder / name
        try:
            if target.is_file():
                return target
            folder.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(dir=folder, suffix=".so.partial")
        except OSError:
            continue  # a read-only cache: the next folder
        os.close(handle)
        try:
            subprocess.run(
                [*compiler, *flags, "-fPIC", "-shared", "-o", partial, str(_SOURCE)],
                check=True, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            os.replace(partial, target)  # another process compiling the same file replaces it with the same
        except subprocess.CalledProcessError as error:
            raise OSError(error.stderr or error.stdout or str(error)) from None
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        return target
    raise OSError("no writable folder for the compiled file (the cache folder and the temporary folder)")


def _folders():
    """Where a compiled file may be kept: the cache folder, else a folder of this user's in the temporary
    folder, used only if no one else can write to it (a library loaded from there runs its code here)."""
    try:
        yield cache_root() / "kernels"
    except (RuntimeError, KeyError, OSError):  # no home folder to find (Path.home() on a user without one)
        pass
    private = Path(tempfile.gettempdir()) / f"optimum-ipu-kernels-{getattr(os, 'getuid', lambda: 'user')()}"
    try:
        private.mkdir(mode=0o700, exist_ok=True)
        status = private.lstat()
    except OSError:
        return
    owned = not hasattr(os, "getuid") or status.st_uid == os.getuid()
    if stat.S_ISDIR(status.st_mode) and owned and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        yield private


def _bind(library: ctypes.CDLL) -> RoundChunk:
    function = library.optimum_ipu_round_chunk
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]

    def round_chunk(part: torch.Tensor, generator: torch.Generator) -> bool:
        """Round `part` in place and advance `generator`; False (nothing changed) for a state it does not read."""
        state = generator.get_state()
        if function(part.data_ptr(), part.numel(), state.data_ptr(), state.numel()) != 0:
            return False
        generator.set_state(state)
        return True

    return round_chunk
