"""`optimum.graphcore`: an `optimum` namespace portion whose names map to optimum-ipu or say what to use.

Mirrors `optimum/graphcore/` and `optimum_ipu/compat/_names.py`, `_tables.py`.
"""

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optimum_ipu.compat import NoEquivalentError
from optimum_ipu.compat._names import Missing
from optimum_ipu.compat._tables import TABLES

ROOT = Path(__file__).resolve().parents[2]

# The top-level names Optimum Graphcore 0.7.1's `optimum/graphcore/__init__.py` exported.
GRAPHCORE_0_7_NAMES = """
IPUConfig IPUTrainer IPUTrainerState IPUTrainingArguments IPUSeq2SeqTrainer IPUSeq2SeqTrainingArguments
pipeline IPUFillMaskPipeline IPUTokenClassificationPipeline __version__
PipelinedBartForConditionalGeneration PipelinedBartForSequenceClassification PipelinedBertModel
PipelinedBertForMaskedLM PipelinedBertForMultipleChoice PipelinedBertForPreTraining
PipelinedBertForQuestionAnswering PipelinedBertForSequenceClassification PipelinedBertForTokenClassification
PipelinedConvNextForImageClassification PipelinedDistilBertForMaskedLM PipelinedDistilBertForMultipleChoice
PipelinedDistilBertForQuestionAnswering PipelinedDistilBertForSequenceClassification
PipelinedDistilBertForTokenClassification PipelinedGPT2ForSequenceClassification
PipelinedGPT2ForTokenClassification PipelinedGPT2LMHeadModel PipelinedHubertForSequenceClassification
PipelinedLxmertForQuestionAnswering PipelinedMT5ForConditionalGeneration PipelinedRobertaForMaskedLM
PipelinedRobertaForMultipleChoice PipelinedRobertaForQuestionAnswering PipelinedRobertaForSequenceClassification
PipelinedRobertaForTokenClassification PipelinedT5ForConditionalGeneration PipelinedT5EncoderModel
PipelinedViTForImageClassification PipelinedWav2Vec2ForPreTraining PipelinedMPNetModel PipelinedMPNetForMaskedLM
""".split()

ENTRIES = [(module, name, entry) for module, table in TABLES.items() for name, entry in table.items()]


def run_python(code: str, *paths: Path) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with `paths` first on sys.path (as separate install roots)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*(str(p) for p in paths), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_optimum_is_a_namespace_package_shared_with_other_extensions(tmp_path):
    # Another Optimum extension installed elsewhere (its own `optimum/` folder, no __init__.py there
    # either, as Hugging Face's `optimum` ships since it became a namespace).
    other = tmp_path / "site" / "optimum" / "fake_extension"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("NAME = 'fake'\n")
    done = run_python(
        """
        import optimum, optimum.fake_extension, optimum.graphcore
        assert optimum.__file__ is None, optimum.__file__   # a namespace, not a regular package
        assert len(list(optimum.__path__)) >= 2
        print(optimum.fake_extension.NAME, optimum.graphcore.IPUConfig.__module__)
        """,
        tmp_path / "site",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fake", "optimum_ipu.configuration.ipu_config"]
    assert not (ROOT / "optimum" / "__init__.py").exists()


def test_optimums_own_modules_import_beside_optimum_graphcore():
    """Optimum Graphcore was an extension of Hugging Face's Optimum, and its code imports Optimum's modules
    too (the external_model notebook: `from optimum.utils import logging`); Optimum is a dependency."""
    done = run_python(
        """
        from optimum.utils import logging
        from optimum.graphcore.modeling_utils import PipelineMixin
        print(type(logging.get_logger("notebook")).__name__, PipelineMixin.__module__.split(".")[0])
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Logger", "optimum_ipu"]


def test_importing_optimum_graphcore_is_light():
    done = run_python(
        "import sys, optimum.graphcore, optimum.graphcore.modeling_utils; print('torch' in sys.modules)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # names resolve on first use, like optimum_ipu's own


def test_every_top_level_name_of_optimum_graphcore_0_7_is_there():
    import optimum.graphcore as og

    assert set(GRAPHCORE_0_7_NAMES) <= set(og.__all__)
    for name in GRAPHCORE_0_7_NAMES:
        assert getattr(og, name) is not None
    assert og.__version__ == "0.7.1"


def test_the_names_notebooks_use_are_optimum_ipus_own():
    import transformers

    import optimum_ipu
    from optimum.graphcore import IPUConfig, IPUTrainer, IPUTrainerState, IPUTrainingArguments, pipeline
    from optimum.graphcore.modeling_utils import to_pipelined
    from optimum_ipu.compat import modeling, pipelines

    assert IPUConfig is optimum_ipu.IPUConfig and IPUTrainer is optimum_ipu.IPUTrainer
    assert IPUTrainingArguments is optimum_ipu.IPUTrainingArguments
    assert IPUTrainerState is transformers.TrainerState
    assert pipeline is pipelines.pipeline and to_pipelined is modeling.to_pipelined


@pytest.mark.parametrize(("module", "name", "entry"), [e for e in ENTRIES if not isinstance(e[2], Missing)],
                         ids=lambda v: v if isinstance(v, str) else "")  # fmt: skip
def test_every_alias_resolves(module, name, entry):
    assert getattr(importlib.import_module(module), name) is not None


@pytest.mark.parametrize(("module", "name", "entry"), [e for e in ENTRIES if isinstance(e[2], Missing)],
                         ids=lambda v: v if isinstance(v, str) else "")  # fmt: skip
def test_every_name_without_equivalent_imports_and_says_what_to_use_on_use(module, name, entry):
    placeholder = getattr(importlib.import_module(module), name)  # importing it is fine: scripts import a lot
    with pytest.raises(NoEquivalentError, match="Instead: ") as raised:
        placeholder()
    assert f"`{module}.{name}`" in str(raised.value) and entry.instead in str(raised.value)


def test_a_missing_name_fails_on_every_use_with_the_same_message():
    from optimum.graphcore.generation import MODELS_SUPPORTING_KV_CACHE
    from optimum.graphcore.generation import IPUGenerationMixin as Missing

    for use in (
        lambda: Missing(model=None, args=None),
        lambda: Missing.from_pretrained,
        lambda: type("MyModel", (Missing,), {}),
        lambda: object in MODELS_SUPPORTING_KV_CACHE,
    ):
        with pytest.raises(NoEquivalentError, match=r"IPUGenerationMixin|MODELS_SUPPORTING_KV_CACHE"):
            use()
    with pytest.raises(NoEquivalentError, match=r"IPUGenerationMixin"):
        Missing()
    assert isinstance(NoEquivalentError("x"), NotImplementedError)
    assert not hasattr(Missing, "__wrapped__")  # introspection still answers plainly


def test_the_seq2seq_trainer_names_are_ours():
    from optimum.graphcore import IPUSeq2SeqTrainer, IPUSeq2SeqTrainingArguments
    from optimum.graphcore.trainer_seq2seq import IPUSeq2SeqTrainer as from_module
    from optimum.graphcore.training_args_seq2seq import IPUSeq2SeqTrainingArguments as args_from_module
    from optimum_ipu import trainer_seq2seq

    assert IPUSeq2SeqTrainer is from_module is trainer_seq2seq.IPUSeq2SeqTrainer
    assert IPUSeq2SeqTrainingArguments is args_from_module is trainer_seq2seq.IPUSeq2SeqTrainingArguments


def test_unknown_names_are_plain_attribute_errors():
    import optimum.graphcore as og

    assert not hasattr(og, "NotAGraphcoreName")
    with pytest.raises(ImportError, match="NotAGraphcoreName"):
        exec("from optimum.graphcore import NotAGraphcoreName", {})


def test_star_import_and_dir_list_the_names():
    import optimum.graphcore as og

    namespace: dict = {}
    exec("from optimum.graphcore import *", namespace)
    assert {"IPUConfig", "IPUTrainer", "pipeline", "IPUSeq2SeqTrainer"} <= set(namespace)
    assert "IPUTrainingArguments" in dir(og)


def test_every_table_has_its_module_file():
    for module in TABLES:
        assert importlib.import_module(module).__all__ == sorted(TABLES[module])
