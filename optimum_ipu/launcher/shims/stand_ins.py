"""Stand-ins for packages and interactive helpers a script or notebook expects but this environment lacks.

- `torchvision.transforms` when torchvision is not installed (image examples and notebook).
- Graphcore's `examples_utils` when it is not installed: `notebook_logging` (notebooks' usage logging) and
  `load_lib`.
- In notebooks only: `IPython.display` (`display`, `HTML`, `Markdown`, `Audio`, `clear_output`) and
  `IPython.get_ipython()` (None, as outside an IPython shell) when IPython is not installed, printing as text; and `huggingface_hub.notebook_login()`, which would wait for a login widget.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from importlib.machinery import ModuleSpec

from optimum_ipu.launcher._report import LauncherError, note_once
from optimum_ipu.launcher.shims._base import Shim, Skip
from optimum_ipu.launcher.shims._patch import Patches

__all__ = ["EXAMPLES_UTILS", "IPYTHON_DISPLAY", "NOTEBOOK_LOGIN", "TORCHVISION"]


def _install_torchvision(patches: Patches) -> Skip | None:
    if importlib.util.find_spec("torchvision") is not None:
        return Skip("torchvision is installed")
    from optimum_ipu.launcher.shims.torchvision_transforms import NAMES, make_modules

    # transformers asks (once, cached) whether torchvision is installed; ask before the stand-in exists,
    # so that transformers keeps its torchvision-free image processors.
    import_utils = importlib.import_module("transformers.utils.import_utils")
    if hasattr(import_utils, "is_torchvision_available"):
        import_utils.is_torchvision_available()

    def on_use() -> None:
        note_once("torchvision", f"torchvision is not installed: torchvision.transforms is optimum-ipu's stand-in "
                  f"({', '.join(NAMES)}; PIL images, torchvision's crop boxes and random draws).")  # fmt: skip

    def on_missing(name: str) -> Exception:
        return LauncherError(
            f"{name}: torchvision is not installed, and optimum-ipu's stand-in only provides torchvision.transforms."
            f"{{{', '.join(NAMES)}}}; install torchvision (a build that matches your torch) to use {name}."
        )

    for name, module in make_modules(on_use, on_missing).items():
        patches.set_item(sys.modules, name, module)
    return None


TORCHVISION = Shim(
    name="torchvision.transforms",
    replaces="`from torchvision.transforms import ...` when torchvision is not installed",
    by="optimum-ipu's stand-in: Compose, Lambda, ToTensor, Normalize, Resize, CenterCrop, RandomResizedCrop and "
    "RandomHorizontalFlip on PIL images, with torchvision's output sizes, crop boxes and random draws (torch's "
    "generator, same order); anything else in torchvision stops with a line saying to install it",
    install=_install_torchvision,
)


def _install_examples_utils(patches: Patches) -> Skip | None:
    if importlib.util.find_spec("examples_utils") is not None:
        return Skip("Graphcore's examples_utils is installed")
    from optimum_ipu.sdk.examples_utils import load_lib

    package = types.ModuleType(
        "examples_utils", "optimum-ipu's stand-in for Graphcore's examples_utils: load_lib and notebook_logging."
    )
    package.__path__ = []
    package.__spec__ = ModuleSpec("examples_utils", None, is_package=True)  # find_spec answers, as for a module
    package.load_lib = load_lib
    logging_module = types.ModuleType(
        "examples_utils.notebook_logging",
        "optimum-ipu's stand-in for Graphcore's notebook usage logging (the gc_logger IPython extension): nothing "
        "is logged.",
    )
    logging_module.__spec__ = ModuleSpec("examples_utils.notebook_logging", None)

    def package_getattr(name: str):
        if name == "notebook_logging":
            note_once("examples_utils.notebook_logging", "examples_utils is not installed: "
                      "examples_utils.notebook_logging is optimum-ipu's stand-in, and Graphcore's notebook usage "
                      "logging (%load_ext gc_logger) records nothing.")  # fmt: skip
            return logging_module
        raise AttributeError(f"module 'examples_utils' has no attribute {name!r} (optimum-ipu's stand-in for "
                             "Graphcore's examples_utils has load_lib and notebook_logging; pip install "
                             "examples-utils for the rest)")  # fmt: skip

    package.__getattr__ = package_getattr
    patches.set_item(sys.modules, "examples_utils", package)
    patches.set_item(sys.modules, "examples_utils.notebook_logging", logging_module)
    return None


EXAMPLES_UTILS = Shim(
    name="examples_utils",
    replaces="`from examples_utils import notebook_logging` (with `%load_ext gc_logger`) and "
    "`examples_utils.load_lib(...)`, when Graphcore's examples-utils package is not installed",
    by="optimum-ipu's stand-in: `notebook_logging` logs nothing (Graphcore's notebook usage logging), `load_lib` "
    "checks the custom-op source exists and loads nothing (the ops run by name through `poptorch.custom_op`)",
    install=_install_examples_utils,
)


class _Rich:
    """What `HTML(...)` / `Markdown(...)` return: the text, shown as text."""

    def __init__(self, data=None, *args, **kwargs):
        self.data = data

    def __repr__(self) -> str:
        return str(self.data)


class _Audio:
    """What `Audio(data, rate=...)` returns: shown as one line saying what would play."""

    def __init__(self, data=None, filename=None, url=None, embed=None, rate=None, autoplay=False, **kwargs):
        import numpy as np

        self.samples = None if data is None else int(np.asarray(data).size)
        self.source = filename or url
        self.rate = rate

    def __repr__(self) -> str:
        if self.samples is None:
            return f"<IPython.display.Audio: {self.source}>"
        return f"<IPython.display.Audio: {self.samples} samples at {self.rate} Hz>"


def _display(*objects, **kwargs) -> None:
    for item in objects:
        print(repr(item) if isinstance(item, _Rich) else item)


def _install_ipython_display(patches: Patches) -> Skip | None:
    if importlib.util.find_spec("IPython") is not None:
        return Skip("IPython is installed")
    package = types.ModuleType("IPython", "optimum-ipu's stand-in for IPython (display only).")
    display = types.ModuleType(
        "IPython.display", "optimum-ipu's stand-in for IPython.display: prints as text."
    )
    package.__path__ = []
    package.display = display

    def display_getattr(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        note_once(
            "IPython.display",
            "IPython is not installed: IPython.display's display/HTML/Markdown print as text.",
        )
        if name == "display":
            return _display
        if name in ("HTML", "Markdown"):
            return _Rich
        if name == "Audio":
            return _Audio
        if name == "clear_output":
            return lambda wait=False: None  # a script's output is not cleared
        raise LauncherError(f"IPython.display.{name}: IPython is not installed and optimum-ipu's stand-in only has "
                            "display, HTML, Markdown, Audio and clear_output; pip install ipython")  # fmt: skip

    display.__getattr__ = display_getattr
    # Outside an IPython shell IPython's get_ipython() is None; matplotlib asks it of any imported IPython.
    package.get_ipython = lambda: None
    # matplotlib patches IPython's backend table for IPython < 8.24; there is no IPython to patch.
    package.version_info = (8, 24, 0, "")
    patches.set_item(sys.modules, "IPython", package)
    patches.set_item(sys.modules, "IPython.display", display)
    return None


IPYTHON_DISPLAY = Shim(
    name="IPython.display",
    replaces="`from IPython.display import display, HTML` in a notebook, when IPython is not installed",
    by="`display` printing its arguments, `HTML`/`Markdown` shown as their text, `Audio` as one line, "
    "`get_ipython()` None (as outside an IPython shell)",
    install=_install_ipython_display,
    notebooks_only=True,
)


def _notebook_login(*args, **kwargs) -> None:
    note_once("notebook_login", "notebook_login() skipped: no interactive login under optimum-ipu run (set HF_TOKEN "
              "or run `hf auth login` beforehand if the notebook needs the Hub).")  # fmt: skip


def _install_notebook_login(patches: Patches) -> Skip | None:
    hub = importlib.import_module("huggingface_hub")
    patches.set(hub, "notebook_login", _notebook_login)
    return None


NOTEBOOK_LOGIN = Shim(
    name="notebook_login",
    replaces="`huggingface_hub.notebook_login()` in a notebook (waits for a login widget)",
    by="a note and nothing else: the login you have (HF_TOKEN, a saved token) is used as it is",
    install=_install_notebook_login,
    notebooks_only=True,
)
