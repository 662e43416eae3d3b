"""`optimum-ipu run`: Optimum Graphcore scripts and notebooks, unchanged, on today's libraries.

Optimum Graphcore 0.7's example scripts and notebooks call APIs that transformers v5 and datasets 3
removed (`send_example_telemetry`, `use_auth_token=`, `load_dataset(task=...)`, `load_metric`, ...)
and load metrics from the Hub. The launcher installs documented shims for those calls (each noted
once, when used), serves common metrics offline, runs the program, and removes the shims again.
Nothing here is imported by `import optimum_ipu` or `import optimum.graphcore`.

- `run_script(path, args)`: a `.py` file as `__main__`, `sys.argv` as if run directly.
- `run_notebook(path, args)`: a `.ipynb` file's code cells in order, shell and magic lines skipped.
- `compatibility_shims()`: the shims alone, as a context manager, for code of your own.
"""

from __future__ import annotations

from optimum_ipu.launcher._report import LauncherError
from optimum_ipu.launcher.notebook import run_notebook
from optimum_ipu.launcher.runner import run_script
from optimum_ipu.launcher.shims import SHIMS, compatibility_shims

__all__ = ["SHIMS", "LauncherError", "compatibility_shims", "run_notebook", "run_script"]
