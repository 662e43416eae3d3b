"""The package's rooms import downward only: no import circle between folders, no import up a layer.

Read from the bottom: the config schema knows nothing else; the runtime runs host calls on
`nn.Module`s and knows neither transformers' cut specs nor the cost model; pipelining places a model
on IPUs and hands the runtime its stages; the cost model estimates; compiling joins the runtime's
checks to the cost model's estimate; the trainer and the front ends sit on top. An import that runs
up (runtime -> pipelining, costmodel -> commands) ties a lower layer to a user-facing one and makes a
newcomer read the house back and forth; this test names the file and line that does it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "optimum_ipu"

# Room (a folder or a top-level module of optimum_ipu) -> layer; a room imports only lower layers.
LAYERS: dict[str, int] = {
    "_quoting": 0,
    "_once": 0,
    "_cache_folder": 0,
    "_matplotlib": 0,
    "call_layout": 0,
    "overrides": 0,
    "configuration": 1,
    "checkpoints": 2,
    "runtime": 3,
    "pipelining": 4,
    "costmodel": 5,
    "compiling": 6,
    "training_args": 7,
    "training_calls": 7,
    "generation": 7,
    "trainer": 8,
    "trainer_seq2seq": 9,
    "poptorch": 9,
    "poptorch_geometric": 10,
    "launcher": 9,
    "sdk": 10,
    "compat": 10,
    "commands": 11,
    "cli": 12,
    "__init__": 13,
}


# Deliberate calls up a layer: (file, room imported) -> why. The import must sit inside a function
# (made at call time, never on importing the lower room); any other upward import still fails.
BRIDGES: dict[tuple[str, str], str] = {
    ("optimum_ipu/configuration/ipu_config.py", "poptorch"): (
        "IPUConfig.to_options(): Optimum Graphcore's API builds a poptorch.Options from a config"
    ),
    ("optimum_ipu/launcher/shims/stand_ins.py", "sdk"): (
        "the examples_utils stand-in of `optimum-ipu run` serves the SDK's one load_lib, as poprun's does"
    ),
}


def _room(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _room_of_name(name: str) -> str:
    """The room `from optimum_ipu import <name>` (or `from .. import <name>` at the top) takes `name` from:
    the room of that name (`trainer`), else the package's `__init__`, which holds every other name
    (`IPUTrainer`, `__file__`, `__version__`): importing one of them needs the whole package."""
    return name if (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file() else "__init__"


def _imports_inside_functions(tree: ast.AST) -> set[int]:
    inside = set()
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside |= {id(node) for node in ast.walk(func) if isinstance(node, (ast.Import, ast.ImportFrom))}
    return inside


def _imported_rooms(path: Path, bridges_allowed: bool = False):
    """(line, room) of every optimum_ipu room `path` imports, at module level or inside a function.

    With `bridges_allowed`, an import listed in BRIDGES for this file is left out when it sits in a function.
    """
    package_parts = path.relative_to(PACKAGE).parts[:-1]
    tree = ast.parse(path.read_text(), str(path))
    inside = _imports_inside_functions(tree)
    relative = path.relative_to(PACKAGE.parent).as_posix()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = list(package_parts[: len(package_parts) - node.level + 1])
                parts += node.module.split(".") if node.module else []
                rooms = [parts[0]] if parts else [_room_of_name(alias.name) for alias in node.names]
            elif node.module and node.module.split(".")[0] == "optimum_ipu":
                parts = node.module.split(".")[1:]
                rooms = [parts[0]] if parts else [_room_of_name(alias.name) for alias in node.names]
            else:
                continue
        elif isinstance(node, ast.Import):
            # `import optimum_ipu` runs the package's __init__ (every room); `import optimum_ipu.x` room x.
            rooms = [a.name.split(".")[1] if "." in a.name else "__init__" for a in node.names
                     if a.name.split(".")[0] == "optimum_ipu"]  # fmt: skip
        else:
            continue
        for room in rooms:
            if bridges_allowed and (relative, room) in BRIDGES and id(node) in inside:
                continue
            yield node.lineno, room


def test_every_room_has_a_layer():
    rooms = {_room(p) for p in PACKAGE.rglob("*.py")}
    assert not rooms - set(LAYERS), (
        f"place these in LAYERS (tests/test_layers.py): {sorted(rooms - set(LAYERS))}"
    )


def test_imports_run_down_the_layers_only():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _room(path)
        for line, room in _imported_rooms(path, bridges_allowed=True):
            if room != here and room in LAYERS and LAYERS[room] >= LAYERS.get(here, 99):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({here}) imports {room}")
    assert not upward, "imports that run up a layer or sideways:\n" + "\n".join(upward)


def test_bridges_are_used_and_made_at_call_time_only():
    for (relative, room), why in BRIDGES.items():
        path = PACKAGE.parent / relative
        every = [line for line, r in _imported_rooms(path) if r == room]
        allowed = [line for line, r in _imported_rooms(path, bridges_allowed=True) if r == room]
        assert every, (
            f"BRIDGES lists {relative} -> {room} ({why}), but the file no longer imports it: drop the entry."
        )
        assert not allowed, (
            f"{relative} imports {room} outside a function (lines {allowed}): import it at call time."
        )
