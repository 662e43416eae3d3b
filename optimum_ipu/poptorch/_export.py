"""`model.compileAndExport(filename)` and `poptorch.load(filename)`: a compiled model saved and loaded back.

PopTorch saves the Poplar executable (and, by default, the model's weights) so a later process runs
without compiling. Here the executable is the module itself, so the file holds what rebuilds the
same compiled model: the module (weights and class references, pickled as `torch.save` does), the
frozen options, the optimizer with its state and the hyper-parameters the model was given, and the
shapes and dtypes of the example inputs. `load` wraps the module again, restores the optimizer and
compiles it for those shapes: the model it returns continues exactly where the saved one was.

Reading a file runs none of its code. Before anything is unpickled, every global the file names is
checked (`torch.serialization.get_unsafe_globals_in_checkpoint` reads them without running them): a
model class (`nn.Module`), an optimizer class, or one of optimum-ipu's poptorch types, each from a
module already imported. The file is then loaded by torch's `weights_only` unpickler with just those
allowed. Anything else (a function, a class of another kind) refuses the file, naming it and the
global. `trust_file=True` unpickles the whole file as `torch.load(weights_only=False)` does, for a
file the user wrote whose model has hooks of its own.
"""

from __future__ import annotations

import collections
import pickle
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils import _pytree as pytree

from optimum_ipu.poptorch._logging import Error
from optimum_ipu.poptorch._offline import connect_loaded

__all__ = ["ExampleTensor", "example_inputs", "example_of", "export", "load", "read"]

FORMAT = "optimum-ipu poptorch executable v1"


@dataclass(frozen=True)
class _ExampleTensor:
    """Shape and dtype of an example input (its values are not needed to compile)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


ExampleTensor = _ExampleTensor  # a tensor input as compiled for (`_compiled_inputs`); saved files name the class


def _rebuild_defaultdict(default_factory, items: dict) -> collections.defaultdict:
    """A `defaultdict` (an optimizer's `state`) back from a file: torch's `weights_only` unpickler
    fills plain dicts only, so `_Pickler` writes each one as this call on a plain dict."""
    return collections.defaultdict(default_factory, items)


class _Pickler(pickle.Pickler):
    """`pickle.Pickler` writing a `defaultdict` as `_rebuild_defaultdict(factory, dict)`."""

    def reducer_override(self, obj):
        if type(obj) is collections.defaultdict:
            return _rebuild_defaultdict, (obj.default_factory, dict(obj))
        return NotImplemented


# What `torch.save(pickle_module=...)` uses of a pickle module: its name, `Pickler` and `dump`.
_PICKLE_MODULE = types.ModuleType("optimum_ipu_export_pickle")
_PICKLE_MODULE.Pickler = _Pickler
_PICKLE_MODULE.dump = lambda obj, file, protocol=None: _Pickler(file, protocol).dump(obj)


def example_of(args: tuple, kwargs: dict):
    """`(args, kwargs)` with every tensor replaced by its shape and dtype (what compiling depends on)."""
    return pytree.tree_map(
        lambda t: _ExampleTensor(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t,
        (args, kwargs),
    )


def run_state(wrapper, random: bool = True) -> dict:
    """What a training model's next call depends on beyond its weights and optimizer: the automatic loss
    scale where it got to and, with `random`, the replicas' random streams and stochastic rounding's
    generators (PopTorch's `rng_state`). Under several processes that share the replicas, each process
    holds its own replicas' streams current (the others' are shared only at checkpoints a trainer writes):
    its file continues exactly for those."""
    executable = wrapper._executable
    state = {"loss_scaler": executable.loss_scaler.state_dict() if hasattr(executable, "loss_scaler") else None}
    if random:
        state["streams"] = wrapper._streams.state_dict() if wrapper._streams is not None else None
        state["rounding"] = {device: g.get_state() for device, g in wrapper._rounding_generators.items()}
    return state


def restore_run_state(wrapper, state: dict) -> None:
    """Put `run_state`'s values back into a compiled `wrapper`."""
    if state.get("loss_scaler") is not None and hasattr(wrapper._executable, "loss_scaler"):
        wrapper._executable.loss_scaler.load_state_dict(state["loss_scaler"])
    if state.get("streams") is not None and wrapper._streams is not None:
        # `poptorch.load(edit_opts_fn=...)` may have changed the replicas: the ones both have carry on
        wrapper._streams.load_state_dict(state["streams"], replicas_may_change=True)
    for device, generator_state in (state.get("rounding") or {}).items():
        # the dict every optimizer the model takes draws from (`training_settings`): filled in place
        wrapper._rounding_generators[device] = torch.Generator(device=device)
        wrapper._rounding_generators[device].set_state(generator_state)


def export(wrapper, filename: str, example, export_model: bool = True, save_rng_state: bool = True) -> None:
    """Write `wrapper`, compiled for inputs like `example` (from `example_of`), to `filename`.

    With `export_model=False` (PopTorch's option) the file holds no model, weights or optimizer: only
    what `loadExecutable` compiles a model given to it for (the options and the input shapes). A training
    model's `run_state` goes with the model, its random part unless `save_rng_state=False`.
    """
    content = {
        "format": FORMAT,
        "training": wrapper._training,
        "model": wrapper._user_model if export_model else None,
        "options": wrapper._options,
        "optimizer": wrapper._optimizer if export_model else None,
        "hyperparameters": wrapper._hyperparameters if export_model else None,
        "run_state": run_state(wrapper, save_rng_state) if export_model and wrapper._training else None,
        "example": example,
    }
    try:
        torch.save(content, filename, pickle_module=_PICKLE_MODULE)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise Error(
            f"compileAndExport({filename!r}) cannot save the model: {error}. The file holds the module as "
            "torch.save(model) does, so its class and forward hooks must be defined at a module's top level "
            "(no lambdas or local functions)."
        ) from error


def load(filename: str, edit_opts_fn: Callable | None = None, trust_file: bool = False):
    """The compiled model `compileAndExport` wrote to `filename`, attached and ready to run.

    Args:
        filename: the file written by `model.compileAndExport(filename, ...)`.
        edit_opts_fn: called with a copy of the saved options before the model is wrapped (e.g. to
            change options that do not alter the compiled graph).
        trust_file: unpickle the whole file, functions included (a model with forward hooks of its
            own needs it). Only for a file you wrote: a crafted file runs code when it is unpickled.
    """
    from optimum_ipu.poptorch._poplar_executor import PoplarExecutor

    content = read(filename, trust_file=trust_file)
    if content["model"] is None:
        raise Error(
            f"{filename} was saved with export_model=False: it holds no model. Wrap the same model "
            f"(poptorch.inferenceModel or trainingModel) and call model.loadExecutable({filename!r})."
        )
    options = content["options"].clone()
    connect_loaded(options)  # a model exported for an offline target runs once loaded, as on PopTorch
    if edit_opts_fn is not None:
        edit_opts_fn(options)
    wrapper = PoplarExecutor(content["model"], options, content["training"], content["optimizer"])
    if content["hyperparameters"] is not None:
        wrapper._hyperparameters = content["hyperparameters"]
    args, kwargs = example_inputs(content)
    wrapper.compile(*args, **kwargs)
    if content.get("run_state"):
        restore_run_state(wrapper, content["run_state"])
    return wrapper


def read(filename: str, trust_file: bool = False) -> dict:
    """What `export` wrote to `filename`, unpickling nothing but the globals `_allowed_globals` admits
    (everything with `trust_file`); a clear error for any other file."""
    not_ours = (
        f"{filename} is not a file written by compileAndExport of optimum-ipu's poptorch (expected format "
        f"{FORMAT!r}). A Poplar executable from a real IPU cannot be loaded here: export the model again "
        "with optimum-ipu."
    )
    if trust_file:
        content = torch.load(filename, weights_only=False)
    else:
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(filename)
        except (RuntimeError, ValueError, pickle.UnpicklingError, OSError) as error:
            raise Error(f"{not_ours} ({error})") from error
        with torch.serialization.safe_globals(_allowed_globals(filename, names)):
            try:
                content = torch.load(filename, weights_only=True)
            except pickle.UnpicklingError as error:
                reason = str(error).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
                raise Error(
                    f"{filename} cannot be read without running code from it ({reason}). If you wrote it, "
                    "load it with trust_file=True, or export the model again."
                ) from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise Error(not_ours)
    return content


def _own_types() -> set:
    """optimum-ipu's poptorch types an exported file may hold: options, enums, execution strategies,
    optimizers, the example inputs' shapes, BeginBlock's forward pre-hook (`_pre_hook` in older files)
    and a function wrapped by BlockFunction (the function it wraps is checked on its own)."""
    from optimum_ipu.poptorch import _annotations, blocks, enums, optim, options

    own = {_ExampleTensor, _rebuild_defaultdict, _annotations._pre_hook, _annotations._BlockHook,
           _annotations._BlockFunction}  # fmt: skip
    for module in (blocks, enums, optim, options):
        own.update(
            v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__
        )
    return own


# Types of torch and of the standard library a module or optimizer pickles with, beyond torch's defaults.
_LIBRARY_TYPES = (
    torch.utils.hooks.RemovableHandle,
    torch.Generator,
    dict,
    list,
    set,
    collections.OrderedDict,
)


def _resolve(name: str):
    """The object a pickled global `module.qualname` names, looked up in modules already imported only
    (importing one would run its code); `KeyError` naming the module when none of its prefixes is."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            value = module
            for attribute in parts[cut:]:
                value = getattr(value, attribute, None)
            return value
    raise KeyError(".".join(parts[:-1]))


def _allowed_globals(filename: str, names: list[str]) -> list:
    """The objects behind `names` (the globals a file's pickle would call), each a model class, an
    optimizer class or one of our types; an `Error` naming the first other one, before anything runs."""
    own = _own_types()
    allowed, refused = [], []
    for name in names:
        try:
            value = _resolve(name)
        except KeyError as missing:
            module = missing.args[0]
            raise Error(
                f"{filename} holds a model of class {name}, whose module {module} is not imported, and the file "
                f"is not unpickled to find it: import {module} before loading (as for torch.load, the model's "
                "class must be importable)."
            ) from None
        safe = (
            value in own
            or value in _LIBRARY_TYPES
            or (isinstance(value, type) and issubclass(value, (nn.Module, torch.optim.Optimizer)))
        )
        (allowed if safe else refused).append(value if safe else name)
    if refused:
        raise Error(
            f"{filename}: loading it would call {', '.join(sorted(refused))}, which "
            f"{'is' if len(refused) == 1 else 'are'} not a model class (nn.Module), an optimizer or one of "
            "optimum-ipu's poptorch types, so nothing in the file ran. If you wrote this file (a model with a "
            "forward hook of its own, say), load it with trust_file=True, which unpickles it whole as "
            "torch.load(weights_only=False) does; never for a file from elsewhere."
        )
    return allowed


def example_inputs(content: dict) -> tuple[tuple, dict]:
    """Inputs of the saved shapes and dtypes (zeros), to compile for."""
    return pytree.tree_map(
        lambda e: torch.zeros(e.shape, dtype=e.dtype) if isinstance(e, _ExampleTensor) else e,
        content["example"],
    )
