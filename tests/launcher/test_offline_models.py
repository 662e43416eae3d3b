"""A model, config or tokenizer that needs the Hub while offline is one line naming it, where, and the way out."""

import pytest

from optimum_ipu.launcher import LauncherError, run_notebook, run_script
from tests.launcher.test_notebook import write_notebook

MISSING = "someone/model-not-in-any-cache"

SCRIPT = f"""
from dataclasses import dataclass, field

from transformers import AutoConfig, HfArgumentParser


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default={MISSING!r})
    tokenizer_name: str = field(default=None)


(args,) = HfArgumentParser(ModelArguments).parse_args_into_dataclasses()
config = AutoConfig.from_pretrained(args.model_name_or_path)
"""


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))  # nothing cached
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_a_scripts_model_needing_the_hub_offline_names_the_id_the_line_and_the_scripts_flags(
    offline, tmp_path
):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with pytest.raises(LauncherError) as raised:
        run_script(script, [])
    message = str(raised.value)
    assert message.startswith("train.py:14: ")
    assert f"{MISSING!r} needs the Hugging Face Hub, which is offline here" in message
    assert "the script's --model_name_or_path, --tokenizer_name" in message
    assert "Traceback" not in message


def test_a_notebooks_model_needing_the_hub_offline_names_the_cell(offline, tmp_path):
    notebook = write_notebook(tmp_path / "nb.ipynb", [
        ("code", "from transformers import AutoConfig"),
        ("code", f"config = AutoConfig.from_pretrained({MISSING!r})"),
    ])  # fmt: skip
    with pytest.raises(
        LauncherError, match=rf"nb.ipynb cell 2:1: {MISSING!r} needs the Hugging Face Hub.*local folder"
    ):
        run_notebook(notebook, [])


def test_a_scripts_other_oserror_keeps_its_traceback(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text("open('/no/such/file.txt')\n")
    assert run_script(script, []) == 1
    assert "FileNotFoundError" in capsys.readouterr().err
