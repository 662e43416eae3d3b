"""Run a Python script as `python SCRIPT ARGS` would, with the compatibility shims installed.

The script runs as `__main__` (`runpy`), with `sys.argv` as if it had been run directly and its own
folder first on `sys.path` (so its sibling modules import, as `trainer_qa` beside `run_qa.py`).
Its exit status is returned: `sys.exit(code)` gives `code`, an exception gives 1 after the
script's traceback (without the launcher's frames). A `LauncherError` raised inside a shim is
returned to the caller with the script's line added, for the one-line message.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tokenize
import traceback
from collections.abc import Iterator
from pathlib import Path

from optimum_ipu.launcher import _context
from optimum_ipu.launcher._report import LauncherError, run_notes
from optimum_ipu.launcher.shims import compatibility_shims

__all__ = ["exit_code", "print_user_traceback", "program_environment", "run_script"]


@contextlib.contextmanager
def program_environment(context: _context.RunContext, argv: list[str]) -> Iterator[None]:
    """`sys.argv`, `sys.path` and the launcher's context for one program; all put back afterwards."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    previous = _context.set_current(context)
    sys.argv = argv
    sys.path.insert(0, str(context.path.parent))
    try:
        with run_notes():
            yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        _context.set_current(previous)


def exit_code(exit_: SystemExit) -> int:
    """The process status `sys.exit(code)` means: None is 0, an int is itself, anything else is printed and 1."""
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    print(exit_.code, file=sys.stderr)
    return 1


def _is_user_frame(filename: str, user_files: tuple[str, ...]) -> bool:
    return filename in user_files


def print_user_traceback(error: BaseException, user_files: tuple[str, ...]) -> None:
    """Print `error` as Python prints it for `python SCRIPT`: its traceback from the first frame of the
    user's code on; the launcher's frames above it (runner, runpy, notebook) are not the user's.

    An error with no frame of the user's code shows no frames at all. Above all a script or cell that
    does not parse, whose `SyntaxError` comes from the launcher compiling it: it prints the file or
    cell, the line, the caret and the message, exactly what `python SCRIPT` prints for it.

    Like the interpreter, it then records `error` as the unhandled one (`sys.last_type`, `last_value`,
    `last_traceback`; `last_exc` from 3.12): at exit, the runtime reads there that the program failed,
    and leaves its process group without waiting for the other processes (a peer may be blocked in a
    collective that waits for this one; see `runtime.distributed._close_process_group`).
    """
    tb = error.__traceback__
    while tb is not None and not _is_user_frame(tb.tb_frame.f_code.co_filename, user_files):
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb, file=sys.stderr)
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = error


def where_in_user_code(error: BaseException, user_files: tuple[str, ...]) -> str:
    """`name:line` of the last user frame `error` passed through, or '' if none."""
    place = ""
    tb = error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if _is_user_frame(filename, user_files):
            place = f"{Path(filename).name.strip('<>')}:{tb.tb_lineno}"
        tb = tb.tb_next
    return place


_OFFLINE_MARKERS = (
    "couldn't connect to 'https://huggingface.co'",
    "offlinemodeisenabled",
    "offline mode is enabled",
)
_REPO_ARGUMENTS = ("pretrained_model_name_or_path", "path_or_repo_id", "repo_id", "name_or_path")


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def hub_offline_error(error: BaseException, user_files: tuple[str, ...]) -> LauncherError | None:
    """One line for a `from_pretrained` that needed the Hub while offline (or unreachable), else None.

    transformers raises an `OSError` whose traceback runs through its own hub code and names no
    model; the line names the model id (read from the failing call's frame), where in the user's
    code it was asked for, and the way out: the script's own model flags, or a local folder.
    """
    if not any(
        any(marker in f"{type(e).__name__} {e}".lower() for marker in _OFFLINE_MARKERS) for e in _chain(error)
    ):
        return None
    name = None
    tb = error.__traceback__
    while tb is not None:
        for argument in _REPO_ARGUMENTS:
            value = tb.tb_frame.f_locals.get(argument)
            if isinstance(value, (str, os.PathLike)) and name is None:
                name = str(value)
        tb = tb.tb_next
    offline = any(os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    why = "which is offline here" if offline else "which could not be reached"
    context = _context.current()
    if context.kind == "script" and context.model_flags:
        way_out = f"give a local model folder with the script's {', '.join(context.model_flags)}"
    else:
        way_out = "load it from a local folder (one written by save_pretrained)"
    way_out += ", or put the model in the local Hugging Face cache first (`hf download MODEL` while online)"
    place = where_in_user_code(error, user_files)
    what = f"{name!r}" if name else "a model, config or tokenizer"
    return LauncherError(
        f"{place + ': ' if place else ''}{what} needs the Hugging Face Hub, {why}: {way_out}."
    )


def _read_script(script: Path, shown: str | os.PathLike) -> str:
    """The script's text, decoded as Python decodes it, whatever the locale's encoding: UTF-8, unless a
    PEP 263 coding line (`# -*- coding: latin-1 -*-`) or a byte order mark says otherwise.

    Raises:
        LauncherError: the file cannot be read, or is not text in its encoding (naming `shown`, the
            path as the user gave it, and PEP 263's way out).
    """
    try:
        with tokenize.open(script) as handle:
            return handle.read()
    except OSError as error:
        raise LauncherError(f"{shown}: cannot read the script ({error}).") from None
    except (SyntaxError, UnicodeDecodeError) as error:  # an unknown coding name, or bytes not in the encoding
        reason = error.msg.replace(f" for {str(script)!r}", "") if isinstance(error, SyntaxError) else str(error)
        raise LauncherError(
            f"{shown}: cannot read the script: {reason}. Python reads a script as UTF-8 unless its first or second "
            "line declares another encoding (PEP 263, e.g. `# -*- coding: latin-1 -*-`): save the file as UTF-8, "
            "or add the coding line of the encoding it is in."
        ) from None


def run_script(path: str | os.PathLike, args: list[str], serve_metrics: bool = True) -> int:
    """Run the Python script `path` with command-line `args` as `__main__`; return its exit status.

    Raises:
        LauncherError: the file is missing or not a script, or a shim stopped the script (the
            message then starts with the script's file and line).
    """
    import runpy

    script = Path(path)
    if not script.is_file():
        what = "a folder" if script.is_dir() else "no such file"
        raise LauncherError(f"{path}: {what}; give the path of a Python script (.py) or a notebook (.ipynb).")
    script = script.resolve()
    source = _read_script(script, path)
    context = _context.RunContext(path=script, kind="script", data_flags=_context.data_file_flags(source),
                                  model_flags=_context.model_flags(source), serve_metrics=serve_metrics)  # fmt: skip
    user_files = (str(script),)
    with program_environment(context, [str(path), *args]), compatibility_shims(notebook=False):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exit_:
            return exit_code(exit_)
        except LauncherError as error:
            place = where_in_user_code(error, user_files)
            raise LauncherError(f"{place}: {error}" if place else str(error)) from None
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # the script's own failure: its traceback, status 1
            offline = hub_offline_error(error, user_files)
            if offline is not None:
                raise offline from None
            print_user_traceback(error, user_files)
            return 1
    return 0
