"""What the launcher knows about the program it runs, for messages that name the user's own flags.

When a script's data must come from the Hub while the Hub is offline, the useful advice is the
script's own flags for local files (`--train_file`, `--validation_file`, `--train_dir`, ...). They
are read from the script's source (its `HfArgumentParser` dataclass fields) before it runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RunContext", "current", "data_file_flags", "set_current"]

# Dataclass fields of the example scripts that point at local data.
_DATA_FIELD = re.compile(
    r"^\s+((?:train|validation|eval|test|predict)_(?:file|dir)|data_dir|dataset_path)\s*:", re.MULTILINE
)


@dataclass
class RunContext:
    """The program being run: a script (with its local-data flags) or a notebook.

    `serve_metrics` False (`--hub-metrics`) leaves every `evaluate.load` to evaluate and the Hub.
    """

    path: Path | None = None
    kind: str = "script"
    data_flags: list[str] = field(default_factory=list)
    model_flags: list[str] = field(default_factory=list)
    serve_metrics: bool = True


_current = RunContext()
_MODEL_FIELD = re.compile(
    r"^\s+(model_name_or_path|config_name|tokenizer_name|feature_extractor_name|image_processor_name|"
    r"ipu_config_name)\s*:",
    re.MULTILINE,
)


def model_flags(source: str) -> list[str]:
    """The `--flags` of a script's argument dataclasses that name a model, config or tokenizer."""
    return [f"--{name}" for name in dict.fromkeys(_MODEL_FIELD.findall(source))]


def current() -> RunContext:
    """The context of the run in progress (an empty one outside `optimum-ipu run`)."""
    return _current


def set_current(context: RunContext) -> RunContext:
    """Make `context` the current one; return the previous one (to put back afterwards)."""
    global _current
    previous, _current = _current, context
    return previous


def data_file_flags(source: str) -> list[str]:
    """The `--flags` of a script's argument dataclasses that take local data, in source order."""
    return [f"--{name}" for name in dict.fromkeys(_DATA_FIELD.findall(source))]
