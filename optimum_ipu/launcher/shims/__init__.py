"""The compatibility shims of `optimum-ipu run`, and the context that installs and removes them.

Shims exist only while the launcher runs a script or notebook: `compatibility_shims()` installs
them on entry and restores every patched attribute on exit. Nothing here runs on
`import optimum_ipu` or `import optimum.graphcore`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from optimum_ipu.launcher._report import note
from optimum_ipu.launcher.shims._base import Shim, Skip
from optimum_ipu.launcher.shims._patch import Patches
from optimum_ipu.launcher.shims.audio_decoding import AUDIO_DECODING
from optimum_ipu.launcher.shims.datasets_api import LOAD_DATASET
from optimum_ipu.launcher.shims.metrics_api import EVALUATE_LOAD, LOAD_METRIC
from optimum_ipu.launcher.shims.stand_ins import EXAMPLES_UTILS, IPYTHON_DISPLAY, NOTEBOOK_LOGIN, TORCHVISION
from optimum_ipu.launcher.shims.trainer_api import RESUME_FROM_MODEL_FOLDER
from optimum_ipu.launcher.shims.transformers_api import (
    AS_TARGET_PROCESSOR,
    AS_TARGET_TOKENIZER,
    AUTO_FEATURE_EXTRACTOR,
    CONFIG_DEFAULTS,
    IS_OFFLINE_MODE,
    SEND_EXAMPLE_TELEMETRY,
    TOKENIZER_METHODS,
    TOKENIZER_OLD_KEYWORDS,
    USE_AUTH_TOKEN,
)

__all__ = ["SHIMS", "Shim", "compatibility_shims"]

# In install order: use_auth_token wraps from_pretrained before AutoFeatureExtractor's fallback wraps it again.
SHIMS: tuple[Shim, ...] = (
    SEND_EXAMPLE_TELEMETRY,
    IS_OFFLINE_MODE,
    USE_AUTH_TOKEN,
    AUTO_FEATURE_EXTRACTOR,
    CONFIG_DEFAULTS,
    TOKENIZER_METHODS,
    TOKENIZER_OLD_KEYWORDS,
    AS_TARGET_TOKENIZER,
    AS_TARGET_PROCESSOR,
    LOAD_DATASET,
    AUDIO_DECODING,
    LOAD_METRIC,
    EVALUATE_LOAD,
    RESUME_FROM_MODEL_FOLDER,
    TORCHVISION,
    EXAMPLES_UTILS,
    IPYTHON_DISPLAY,
    NOTEBOOK_LOGIN,
)


@contextlib.contextmanager
def compatibility_shims(notebook: bool = False) -> Iterator[dict[str, Skip | None]]:
    """Install the shims (the notebook-only ones too when `notebook`), yield what each did, then remove them.

    Yields:
        shim name -> None (installed) or the `Skip` saying why not. A shim that does not fit the
        installed library versions is also reported as one note line.
    """
    patches = Patches()
    status: dict[str, Skip | None] = {}
    try:
        for shim in SHIMS:
            if shim.notebooks_only and not notebook:
                continue
            status[shim.name] = result = shim.install(patches)
            if isinstance(result, Skip) and result.problem:
                note(f"shim {shim.name!r} does not apply to the installed versions: {result.reason}.")
        yield status
    finally:
        patches.restore()
