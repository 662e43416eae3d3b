"""`examples_utils.load_lib` for Graphcore's applications launched by `poprun` (see `poprun_stand_ins/`)."""

from __future__ import annotations

import logging
import os

from optimum_ipu._once import warn_once

logger = logging.getLogger("examples_utils")


def load_lib(path: str | os.PathLike, *args, **kwargs) -> None:
    """Stand in for building and loading the Poplar custom-op library at `path`: it must exist (the real
    build fails otherwise); nothing is built or loaded, because the custom operations Graphcore shipped
    with its applications run by name through `poptorch.custom_op`. Returns None (the library object)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"examples_utils.load_lib: {path!r} does not exist.")
    warn_once(
        logger,
        "examples_utils.load_lib(%r): the custom-op library is not built or loaded on the simulated IPU; "
        "the custom ops Graphcore shipped with its applications run by name through poptorch.custom_op.",
        path,
    )
