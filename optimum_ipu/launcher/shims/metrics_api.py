"""Shims for loading metrics: `evaluate.load` offline, and `datasets.load_metric` (removed in datasets 3).

Both serve the launcher's offline metrics (`optimum_ipu.launcher.metrics`) by name. Any other
metric goes to evaluate as before; if evaluate cannot get it from the Hub, the run stops with one
line naming the metric and how to provide it locally.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os

from optimum_ipu.launcher import _context
from optimum_ipu.launcher._report import LauncherError, note_once
from optimum_ipu.launcher.metrics import SERVED_METRICS, build_metric, served_metric_name
from optimum_ipu.launcher.shims._base import Shim, Skip
from optimum_ipu.launcher.shims._patch import Patches

__all__ = ["EVALUATE_LOAD", "LOAD_METRIC"]

_MODULE_OPTIONS = ("process_id", "num_process", "cache_dir", "experiment_id", "keep_in_memory")


def _describe(call: str, path: str, config_name: str | None) -> str:
    return f"{call}({path!r}" + (f", {config_name!r})" if config_name else ")")


def _serve(call: str, path: str, config_name: str | None, options: dict):
    name = served_metric_name(path) if _context.current().serve_metrics else None
    if name is None:
        return None
    legacy = call == "load_metric"  # datasets 2's metric, where its results differ from evaluate's
    metric = build_metric(name, config_name, legacy, **{k: v for k, v in options.items() if v is not None})
    hub = "datasets 2's metric" if legacy and SERVED_METRICS[name].datasets_target else "the Hub metric"
    note_once(f"metric:{name}:{legacy}", f"{_describe(call, path, config_name)}: served offline by optimum-ipu "
              f"(same result keys, scale and options as {hub}).")  # fmt: skip
    return metric


def _not_served(call: str, path: str, config_name: str | None, error: Exception) -> LauncherError:
    offline = any(os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE"))
    why = "which is offline here" if offline else f"which could not be reached ({type(error).__name__})"
    name = path.removeprefix("evaluate-metric/")
    if name in SERVED_METRICS:  # served, but --hub-metrics asked for the Hub's copy
        return LauncherError(
            f"{_describe(call, path, config_name)} needs the Hugging Face Hub, {why}; --hub-metrics turned off "
            f"optimum-ipu's offline copy of {name!r}: run without --hub-metrics to use it."
        )
    return LauncherError(
        f"{_describe(call, path, config_name)} needs the Hugging Face Hub, {why}, and optimum-ipu does not serve "
        f"{name!r} offline (it serves {', '.join(SERVED_METRICS)}): load it once with the Hub reachable (evaluate "
        f"caches it), or save its metric script in a folder and load that folder, e.g. evaluate.load('./{name}')."
    )


def _install_evaluate_load(patches: Patches) -> Skip | None:
    if importlib.util.find_spec("evaluate") is None:
        return Skip("evaluate is not installed (scripts that import it need `pip install evaluate`)")
    evaluate = importlib.import_module("evaluate")
    original = evaluate.load

    @functools.wraps(original)
    def load(path, config_name=None, module_type=None, process_id=0, num_process=1, cache_dir=None,
             experiment_id=None, keep_in_memory=False, download_config=None, download_mode=None, revision=None,
             **init_kwargs):  # fmt: skip
        options = dict(process_id=process_id, num_process=num_process, cache_dir=cache_dir,
                       experiment_id=experiment_id, keep_in_memory=keep_in_memory, **init_kwargs)  # fmt: skip
        served = _serve("evaluate.load", path, config_name, options)
        if served is not None:
            return served
        try:
            return original(path, config_name, module_type, process_id, num_process, cache_dir, experiment_id,
                            keep_in_memory, download_config, download_mode, revision, **init_kwargs)  # fmt: skip
        except (FileNotFoundError, ConnectionError) as error:
            if os.path.exists(path):
                raise
            raise _not_served("evaluate.load", path, config_name, error) from None

    patches.set(evaluate, "load", load)
    return None


EVALUATE_LOAD = Shim(
    name="evaluate.load",
    replaces="`evaluate.load(NAME)` of a Hub metric (downloads the metric's script: fails offline)",
    by="optimum-ipu's offline copy of the metric when it serves NAME (see the table of metrics); any other metric "
    "is loaded by evaluate as before (`--hub-metrics` loads every metric from the Hub)",
    install=_install_evaluate_load,
)


def _load_metric(path, config_name=None, process_id=0, num_process=1, cache_dir=None, experiment_id=None,
                 keep_in_memory=False, download_config=None, download_mode=None, revision=None, **init_kwargs):  # fmt: skip
    note_once("datasets.load_metric", "datasets.load_metric() was removed in datasets 3: loading the metric as "
              "evaluate.load() does.")  # fmt: skip
    if importlib.util.find_spec("evaluate") is None:
        raise LauncherError(
            f"{_describe('load_metric', path, config_name)}: datasets 3 removed load_metric, and optimum-ipu serves "
            "metrics through the evaluate package, which is not installed: pip install evaluate"
        )
    evaluate = importlib.import_module("evaluate")
    options = dict(process_id=process_id, num_process=num_process, cache_dir=cache_dir, experiment_id=experiment_id,
                   keep_in_memory=keep_in_memory, **init_kwargs)  # fmt: skip
    served = _serve("load_metric", path, config_name, options)
    if served is not None:
        return served
    return evaluate.load(path, config_name, download_config=download_config, download_mode=download_mode,
                         revision=revision, **options)  # fmt: skip


def _install_load_metric(patches: Patches) -> Skip | None:
    datasets = importlib.import_module("datasets")
    if hasattr(datasets, "load_metric"):
        return Skip("datasets still has load_metric")
    patches.set(datasets, "load_metric", _load_metric)
    return None


LOAD_METRIC = Shim(
    name="load_metric",
    replaces="`from datasets import load_metric` (removed in datasets 3)",
    by="a `load_metric(NAME, CONFIG)` that loads the metric as `evaluate.load` does (offline copies included; "
    "needs the evaluate package)",
    install=_install_load_metric,
)
