"""`model.compileAndExport(filename)` and `poptorch.load(filename)`: a compiled model saved and loaded back.

PopTorch saves the Poplar executable (and, by default, the model's weights) so a later process runs
without compiling. Here the executable is the module itself, so the file holds what rebuilds the
same compiled model: the module (weights and code references, pickled as `torch.save` does), the
frozen options, the optimizer with its state and the hyper-parameters the model was given, and the
shapes and dtypes of the example inputs. `load` wraps the module again, restores the optimizer and
compiles it for those shapes: the model it returns continues exactly where the saved one was.

As with `torch.save(model)`, the model's class (and its forward hooks) must be importable where the
file is loaded.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from optimum_ipu.poptorch._logging import Error
from optimum_ipu.poptorch.optim import _IPUMixin

__all__ = ["example_inputs", "example_of", "export", "load", "read"]

FORMAT = "optimum-ipu poptorch executable v1"


@dataclass(frozen=True)
class _ExampleTensor:
    """Shape and dtype of an example input (its values are not needed to compile)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@contextlib.contextmanager
def _importable(optimizer) -> Iterator[None]:
    """An optimizer optimum-ipu subclassed on the fly (fp16 update of a torch optimizer) pickles as its torch class."""
    cls = type(optimizer)
    named = getattr(sys.modules.get(cls.__module__), cls.__qualname__, None)
    dynamic = issubclass(cls, _IPUMixin) and named is not cls and cls.__bases__[:1] == (_IPUMixin,)
    if dynamic:
        optimizer.__class__ = cls.__bases__[1]
    try:
        yield
    finally:
        if dynamic:
            optimizer.__class__ = cls


def example_of(args: tuple, kwargs: dict):
    """`(args, kwargs)` with every tensor replaced by its shape and dtype (what compiling depends on)."""
    return pytree.tree_map(
        lambda t: _ExampleTensor(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t,
        (args, kwargs),
    )


def export(wrapper, filename: str, example) -> None:
    """Write `wrapper`, compiled for inputs like `example` (from `example_of`), to `filename`."""
    content = {
        "format": FORMAT,
        "training": wrapper._training,
        "model": wrapper._user_model,
        "options": wrapper._options,
        "optimizer": wrapper._optimizer,
        "hyperparameters": wrapper._hyperparameters,
        "example": example,
    }
    with _importable(wrapper._optimizer):
        try:
            torch.save(content, filename)
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            raise Error(
                f"compileAndExport({filename!r}) cannot save the model: {error}. The file holds the module as "
                "torch.save(model) does, so its class and forward hooks must be defined at a module's top level "
                "(no lambdas or local functions)."
            ) from error


def load(filename: str, edit_opts_fn: Callable | None = None):
    """The compiled model `compileAndExport` wrote to `filename`, attached and ready to run.

    Args:
        filename: the file written by `model.compileAndExport(filename, ...)`.
        edit_opts_fn: called with a copy of the saved options before the model is wrapped (e.g. to
            change options that do not alter the compiled graph).
    """
    from optimum_ipu.poptorch._poplar_executor import PoplarExecutor

    content = read(filename)
    options = content["options"].clone()
    if edit_opts_fn is not None:
        edit_opts_fn(options)
    wrapper = PoplarExecutor(content["model"], options, content["training"], content["optimizer"])
    if content["hyperparameters"] is not None:
        wrapper._hyperparameters = content["hyperparameters"]
    args, kwargs = example_inputs(content)
    wrapper.compile(*args, **kwargs)
    return wrapper


def read(filename: str) -> dict:
    """What `export` wrote to `filename` (a clear error for any other file)."""
    content = torch.load(filename, weights_only=False)
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise Error(
            f"{filename} is not a file written by compileAndExport of optimum-ipu's poptorch "
            f"(expected format {FORMAT!r}). A Poplar executable from a real IPU cannot be loaded here: export the "
            "model again with optimum-ipu."
        )
    return content


def example_inputs(content: dict) -> tuple[tuple, dict]:
    """Inputs of the saved shapes and dtypes (zeros), to compile for."""
    return pytree.tree_map(
        lambda e: torch.zeros(e.shape, dtype=e.dtype) if isinstance(e, _ExampleTensor) else e,
        content["example"],
    )
