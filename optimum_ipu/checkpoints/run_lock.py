"""One training run at a time per output folder: a lock that a second run meets when it starts.

Two runs saving checkpoints into one `output_dir` destroy each other's work: each save first removes
the staging folders it finds (those of a killed run, it assumes), so one run deletes the checkpoint
the other is writing, and rotation deletes the other's checkpoints. So the process that writes a
run's checkpoints holds `output_dir/.optimum-ipu-run.lock` while it trains, and a second run that
starts there is refused with one error naming the run that holds it (its pid, host and start), before
it trains or touches a file.

The lock is the operating system's (`fcntl.flock` on the file, which works across processes on one
machine and, through the lock manager, on NFS): it is released when its process ends in any way, so
a crash or a `kill -9` leaves no lock that blocks the next run. The file only records who holds it.
A run that finds the record of a run that ended without releasing it takes the lock over, and says so
once. A clean end deletes the file. Nothing of another run is ever deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; the run goes on unlocked, with one warning
    fcntl = None

__all__ = ["LOCK_FILE", "output_dir_lock"]

logger = logging.getLogger(__name__)

LOCK_FILE = ".optimum-ipu-run.lock"


def _read_record(fd: int) -> dict | None:
    """Who the lock file says holds (or held) the lock; None for an empty file, {} for an unreadable one."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _describe(record: dict | None) -> str:
    if not record:
        return "a run that left no record of itself"
    return f"pid {record.get('pid', '?')} on host {record.get('host', '?')}, started {record.get('started', '?')}"


def _write_record(fd: int) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}  # fmt: skip
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(record) + "\n").encode())
    os.fsync(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file `fd` is open on: a releasing run deletes the file, and a lock
    taken on a deleted file would not be seen by the next run, which creates a new one."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _ended_here(record: dict | None) -> bool:
    """Whether the record names a process of this host that has ended."""
    if not record or record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return False
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def _in_use(folder: Path, path: Path, record: dict | None) -> RuntimeError:
    message = (
        f"{folder} is the output_dir of another training run that is running now ({_describe(record)}), which "
        "writes its checkpoints there: two runs saving into one folder delete each other's checkpoints. Give "
        "this run its own output_dir (--output_dir), or wait until that run ends. (The run's lock is "
        f"{path}; it is released when that run ends, also when it crashes.)"
    )
    if _ended_here(record):  # processes it forked (data loader workers) share its lock until they exit
        message += (
            f" Process {record['pid']} has ended, but processes it started (data loader workers) still hold "
            "the lock; they end on their own within seconds: start this run again then."
        )
    return RuntimeError(message)


@contextlib.contextmanager
def output_dir_lock(output_dir: str | os.PathLike) -> Iterator[None]:
    """Hold the lock of `output_dir` (created if missing) for the block: one training run at a time.

    Raises:
        RuntimeError: a live process holds it; the message names that run (pid, host, start) and
            the way out (another output_dir, or waiting).
    """
    folder = Path(output_dir)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    if fcntl is None:
        logger.warning("No file locks on this system: a second run started in %s would not be refused.", folder)
        yield
        return
    while True:  # until the lock is taken on the file that `path` names
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = _read_record(fd)
            os.close(fd)
            raise _in_use(folder, path, record) from None
        except OSError as error:  # a file system without locks (ENOLCK, EOPNOTSUPP)
            os.close(fd)
            logger.warning("Cannot lock %s (%s): a second run started in %s would not be refused.",
                           path, error, folder)  # fmt: skip
            yield
            return
        if _same_file(fd, path):
            break
        os.close(fd)  # the run that held it deleted the file meanwhile: lock the file that is there now
    try:
        previous = _read_record(fd)
        if previous is not None:
            logger.warning("Taking over the lock of %s: the run that held it (%s) ended without releasing it "
                           "(it crashed or was killed).", folder, _describe(previous))  # fmt: skip
        _write_record(fd)
        yield
    finally:
        with contextlib.suppress(OSError):
            if _same_file(fd, path):
                os.unlink(path)  # deleted while still locked: the next run creates and locks a new file
        os.close(fd)  # releases the lock
        if created:  # a run that saved nothing leaves no empty folder behind it either
            with contextlib.suppress(OSError):
                folder.rmdir()
