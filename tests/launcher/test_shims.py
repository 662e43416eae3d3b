"""The compatibility shims: each replaces a removed API as documented, is noted once, and is removed afterwards."""

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import datasets
import pytest
import torch
import transformers
from fixtures import (
    tiny_bert_config,
    tiny_image_processor,
    tiny_tokenizer,
    tiny_vit_model_dir,
    write_ipu_config,
    write_sentence_pairs_csv,
    write_tiny_imagefolder,
)
from transformers import BertForSequenceClassification

from optimum_ipu.launcher import LauncherError, compatibility_shims, run_script
from optimum_ipu.launcher._report import PREFIX

SCRIPTS = Path(__file__).parent / "scripts"


def notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(PREFIX)]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    tiny_tokenizer(directory)
    BertForSequenceClassification(tiny_bert_config(num_labels=2)).save_pretrained(directory)
    return directory


def test_old_style_script_runs_and_its_metrics_equal_a_plain_computation(bert_dir, tmp_path, capsys):
    """send_example_telemetry, use_auth_token=, load_metric and evaluate.load in one script of the 0.7 kind."""
    validation = write_sentence_pairs_csv(tmp_path / "validation.csv", rows=8)
    out = tmp_path / "out"
    code = run_script(SCRIPTS / "old_text_classification.py", [
        "--model_name_or_path", str(bert_dir), "--validation_file", str(validation),
        "--ipu_config_name", str(write_ipu_config(tmp_path / "ipu")), "--output_dir", str(out),
        "--per_device_eval_batch_size", "2", "--fp32", "--report_to", "none",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    result = json.loads((out / "results.json").read_text())
    labels = [int(line.rsplit(",", 1)[1]) for line in validation.read_text().splitlines()[1:]]
    predicted = [max(range(2), key=row.__getitem__) for row in result["logits"]]
    hits = [p == t for p, t in zip(predicted, labels)]
    tp = sum(p == t == 1 for p, t in zip(predicted, labels))
    fp, fn = (
        sum(p == 1 != t for p, t in zip(predicted, labels)),
        sum(t == 1 != p for p, t in zip(predicted, labels)),
    )
    assert result["metrics"]["eval_accuracy"] == sum(hits) / len(hits)
    assert result["metrics"]["eval_mrpc_accuracy"] == sum(hits) / len(hits)
    assert result["metrics"]["eval_mrpc_f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    assert result["name"] == "__main__"
    assert [n.split(":")[0] for n in notes(err)] == [
        f"{PREFIX} send_example_telemetry() was removed in transformers v5",
        f"{PREFIX} use_auth_token= was removed in transformers v5 and datasets 3",
        f"{PREFIX} evaluate.load('accuracy')",
        f"{PREFIX} datasets.load_metric() was removed in datasets 3",
        f"{PREFIX} load_metric('glue', 'mrpc')",
    ]  # each shim once, in the order the script used them


def test_use_auth_token_is_passed_on_as_token(monkeypatch):
    seen = {}
    original = transformers.configuration_utils.PretrainedConfig.__dict__["from_pretrained"].__func__

    def spy(cls, *args, **kwargs):
        seen.update(kwargs)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(
        transformers.configuration_utils.PretrainedConfig, "from_pretrained", classmethod(spy)
    )
    with compatibility_shims():
        try:
            transformers.BertConfig.from_pretrained("/nonexistent-folder-for-the-test", use_auth_token="hf_x")
        except OSError:
            pass
    assert seen.get("token") == "hf_x" and "use_auth_token" not in seen


def test_model_from_pretrained_with_use_auth_token_none_loads(bert_dir):
    with pytest.raises(TypeError, match="use_auth_token"):  # what transformers v5 does without the shim
        transformers.AutoModelForSequenceClassification.from_pretrained(bert_dir, use_auth_token=None)
    with compatibility_shims():
        model = transformers.AutoModelForSequenceClassification.from_pretrained(bert_dir, use_auth_token=None)
    assert model.config.num_labels == 2


def test_image_script_task_template_feature_extractor_and_torchvision(tmp_path, capsys):
    data = write_tiny_imagefolder(tmp_path / "images")
    model = tiny_vit_model_dir(tmp_path / "vit")
    tiny_image_processor(32).save_pretrained(model)
    out = tmp_path / "out.json"
    assert run_script(SCRIPTS / "image_task.py", [str(data), str(model), str(out)]) == 0, (
        capsys.readouterr().err
    )
    result = json.loads(out.read_text())
    assert result["columns"] == ["image", "labels"]  # datasets 2's template: label -> labels, others dropped
    assert result["labels"] == ["cat", "dog"]
    assert result["extractor"].startswith("ViTImageProcessor")
    # the stand-in transforms give what the image processor gives (resize to 32 px, mean/std 0.5)
    assert result["shape"] == [3, 32, 32] and result["dtype"] == "torch.float32"
    assert result["max_difference_to_processor"] < 1e-6
    err = capsys.readouterr().err
    assert "kept 'image', 'label' as 'labels'" in err
    assert "loaded ViTImageProcessorPil with AutoImageProcessor instead" in err


def test_task_template_with_ambiguous_columns_is_one_line(tmp_path):
    dataset = datasets.Dataset.from_dict({"a": ["x"], "b": ["y"], "label": [0]}).cast_column(
        "label", datasets.ClassLabel(names=["no", "yes"])
    )
    path = tmp_path / "d.jsonl"
    dataset.to_json(path)
    with compatibility_shims():
        with pytest.raises(
            LauncherError, match=r"cannot tell which column is the 'text' column among \['a', 'b', 'label'\]"
        ):
            datasets.load_dataset("json", data_files=str(path), task="text-classification")


def test_offline_hub_data_names_the_scripts_local_file_flags(capsys):
    with pytest.raises(LauncherError) as error:
        run_script(SCRIPTS / "behaviour.py", ["offline-data"])
    message = str(error.value)
    assert message.startswith("behaviour.py:")
    assert "load_dataset('glue', 'mrpc') needs the Hugging Face Hub, which is offline here" in message
    assert message.endswith("give the data as local files with the script's --train_file, --validation_file.")
    assert "\n" not in message


def test_a_metric_not_served_offline_is_one_line_naming_it(capsys):
    pytest.importorskip("evaluate")
    with pytest.raises(LauncherError) as error:
        run_script(SCRIPTS / "behaviour.py", ["unknown-metric"])
    message = str(error.value)
    assert (
        "evaluate.load('bleu') needs the Hugging Face Hub" in message
        and "does not serve 'bleu' offline" in message
    )
    assert "evaluate.load('./bleu')" in message


def test_send_example_telemetry_is_noted_once_and_sends_nothing(capsys):
    with compatibility_shims():
        from transformers.utils import send_example_telemetry

        send_example_telemetry("x", object())
        send_example_telemetry("x", object())
    assert len(notes(capsys.readouterr().err)) == 1


def test_is_offline_mode_answers_as_huggingface_hub_does(monkeypatch, capsys):
    constants = importlib.import_module("huggingface_hub.constants")
    with compatibility_shims():
        from transformers.utils import is_offline_mode

        for offline in (True, False):
            monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
            assert is_offline_mode() is offline
    assert notes(capsys.readouterr().err) == [
        f"{PREFIX} transformers.utils.is_offline_mode() was removed in transformers v5: answered by "
        "huggingface_hub.is_offline_mode() (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."
    ]


def snapshot() -> dict:
    """Identity of everything the shims touch."""
    from optimum_ipu.launcher.shims.transformers_api import _FROM_PRETRAINED_OWNERS, _owner

    owners = {t: _owner(t) for t in _FROM_PRETRAINED_OWNERS}
    hub = importlib.import_module("huggingface_hub")
    evaluate = importlib.import_module("evaluate") if importlib.util.find_spec("evaluate") else None
    return {
        **{t: o.__dict__.get("from_pretrained") for t, o in owners.items() if o is not None},
        "load_dataset": datasets.load_dataset,
        "load_metric": getattr(datasets, "load_metric", None),
        "evaluate.load": getattr(evaluate, "load", None),
        "send_example_telemetry": getattr(
            importlib.import_module("transformers.utils"), "send_example_telemetry", None
        ),
        "is_offline_mode": getattr(importlib.import_module("transformers.utils"), "is_offline_mode", None),
        "torchvision": sys.modules.get("torchvision"),
        "IPython": sys.modules.get("IPython"),
        "notebook_login": hub.__dict__.get("notebook_login"),
    }


def test_graphcore_examples_utils_imports_when_it_is_not_installed(tmp_path, capsys):
    """mt5_translation.ipynb and mt5_xnli.ipynb start with `from examples_utils import notebook_logging` and
    `%load_ext gc_logger` (Graphcore's notebook usage logging, from its examples-utils package): without the
    package the import stops the notebook. The stand-in logs nothing and says so once; `load_lib` is poprun's."""
    assert importlib.util.find_spec("examples_utils") is None  # the package is not installed here
    library = tmp_path / "custom_ops.cpp"
    library.write_text("")
    with compatibility_shims(notebook=True):
        import examples_utils.notebook_logging  # noqa: F401
        from examples_utils import load_lib, notebook_logging  # noqa: F401

        assert load_lib(library) is None
    assert "examples_utils" not in sys.modules and "examples_utils.notebook_logging" not in sys.modules
    assert any("examples_utils.notebook_logging" in line for line in notes(capsys.readouterr().err))


def test_shims_nest_and_a_stand_in_module_answers_find_spec():
    """A run inside a run (a script that calls `run_script`, or `compatibility_shims()` entered twice) asks
    `importlib.util.find_spec` of modules the outer run stands in for: each has a spec, as imported modules do."""
    with compatibility_shims():
        assert importlib.util.find_spec("examples_utils") is not None
        with compatibility_shims():
            import examples_utils  # noqa: F401
        assert importlib.util.find_spec("examples_utils.notebook_logging") is not None
    assert importlib.util.find_spec("examples_utils") is None


def test_every_patch_is_removed_when_the_run_ends():
    before = snapshot()
    with compatibility_shims(notebook=True) as status:
        during = snapshot()
    assert snapshot() == before
    installed = [name for name, skip in status.items() if skip is None]
    expected = {"send_example_telemetry", "is_offline_mode", "use_auth_token", "load_dataset(task=...)"}
    assert expected <= set(installed)
    assert during != before


def test_a_shim_that_does_not_fit_the_installed_versions_is_one_note_and_the_run_goes_on(monkeypatch, capsys):
    from optimum_ipu.launcher import shims
    from optimum_ipu.launcher.shims._base import Shim, Skip

    misfit = Shim(
        "misfit", "an API", "nothing", lambda patches: Skip("transformers 9 moved it; remove the call", True)
    )
    absent = Shim("absent", "an API", "nothing", lambda patches: Skip("the API is still there"))
    monkeypatch.setattr(shims, "SHIMS", (misfit, absent))
    with shims.compatibility_shims() as status:
        pass
    assert status == {
        "misfit": Skip("transformers 9 moved it; remove the call", True),
        "absent": Skip("the API is still there"),
    }
    assert notes(capsys.readouterr().err) == [
        f"{PREFIX} shim 'misfit' does not apply to the installed versions: transformers 9 moved it; remove the call."
    ]


def test_hub_metrics_turns_the_offline_copies_off(tmp_path):
    pytest.importorskip("evaluate")
    script = tmp_path / "metric.py"
    script.write_text("import evaluate\nevaluate.load('accuracy')\n")
    assert run_script(script, []) == 0
    with pytest.raises(
        LauncherError, match=r"--hub-metrics turned off optimum-ipu's offline copy of 'accuracy'"
    ):
        run_script(script, [], serve_metrics=False)


def test_encode_plus_and_batch_encode_plus_are_the_tokenizers_own_call(tmp_path):
    """mt5_xnli.ipynb calls `tokenizer.batch_encode_plus(list(zip(premises, hypotheses)), ...)`, which
    transformers v5 removed: the same encoding as `tokenizer(premises, hypotheses, ...)`."""
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    premises, hypotheses = ["alice lives in paris", "bob works at rome"], ["where is alice", "who works"]
    options = dict(padding="max_length", max_length=12, truncation=True)
    with compatibility_shims():
        batch = tokenizer.batch_encode_plus(list(zip(premises, hypotheses)), **options)
        single = tokenizer.batch_encode_plus(premises, **options)
        one = tokenizer.encode_plus(premises[0], hypotheses[0], **options)
    assert batch["input_ids"] == tokenizer(premises, hypotheses, **options)["input_ids"]
    assert single["input_ids"] == tokenizer(premises, **options)["input_ids"]
    assert one["input_ids"] == tokenizer(premises[0], hypotheses[0], **options)["input_ids"]
    assert not hasattr(type(tokenizer), "batch_encode_plus")  # removed again when the run ends


class _TargetModeTokenizer(transformers.BertTokenizer):
    """A tokenizer whose targets encode unlike its inputs, as Marian's (a target vocabulary) and mBART-50's
    (target-language tokens) do: in target mode its first token is [SEP] instead of [CLS]."""

    target_mode = False

    def _switch_to_target_mode(self):
        self.target_mode = True

    def _switch_to_input_mode(self):
        self.target_mode = False

    def _encode_plus(self, *args, **kwargs):
        encoding = super()._encode_plus(*args, **kwargs)
        if self.target_mode:
            ids = encoding["input_ids"]
            for row in ids if ids and isinstance(ids[0], list) else [ids]:
                row[0] = self.sep_token_id
        return encoding


def test_as_target_tokenizer_encodes_the_targets_as_text_target_does(tmp_path):
    """summarization.ipynb, translation.ipynb and mt5_translation.ipynb tokenize their labels inside
    `with tokenizer.as_target_tokenizer():`, which transformers v5 removed (AttributeError): v5 encodes
    targets with `tokenizer(text_target=...)`, and the context gives the same ids, then input mode again."""
    tiny_tokenizer(tmp_path / "tok")
    tokenizer = _TargetModeTokenizer.from_pretrained(tmp_path / "tok")
    targets, options = ["bob works at rome", "where is alice"], dict(max_length=10, padding="max_length", truncation=True)
    expected = tokenizer(text_target=targets, **options)["input_ids"]
    assert expected != tokenizer(targets, **options)["input_ids"]  # the fixture's targets do differ
    with compatibility_shims():
        with tokenizer.as_target_tokenizer():
            labels = tokenizer(targets, **options)
            one = tokenizer(targets[0], **options)
        after = tokenizer(targets, **options)
    assert labels["input_ids"] == expected
    assert one["input_ids"] == expected[0]
    assert after["input_ids"] == tokenizer(targets, **options)["input_ids"]  # input mode again on exit
    assert not hasattr(type(tokenizer), "as_target_tokenizer")  # removed again when the run ends


def test_encode_plus_of_one_tuple_of_two_texts_encodes_them_as_a_pair(tmp_path):
    """introduction_to_optimum_graphcore.ipynb calls `tokenizer.encode_plus((question, answer_text))`: transformers
    4's fast tokenizers read one (text, text_pair) tuple as a pair (their batch encoder's rule for each input),
    where transformers 5's call reads a tuple of texts as a batch of two."""
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    question, context = "where is alice", "alice lives in paris"
    with compatibility_shims():
        pair = tokenizer.encode_plus((question, context))
        listed = tokenizer.encode_plus([question, context], max_length=12, padding="max_length")
        words = tokenizer.encode_plus(["alice", "lives"], is_split_into_words=True)
    assert pair["input_ids"] == tokenizer(question, context)["input_ids"]
    assert pair["token_type_ids"] == tokenizer(question, context)["token_type_ids"]
    assert listed["input_ids"] == tokenizer(question, context, max_length=12, padding="max_length")["input_ids"]
    assert words["input_ids"] == tokenizer(["alice", "lives"], is_split_into_words=True)["input_ids"]


def test_as_target_processor_sends_calls_and_padding_to_the_tokenizer(tmp_path):
    """The wav2vec2 fine-tuning notebook encodes and pads its transcripts inside `with
    processor.as_target_processor():`, which transformers v5 removed. In transformers 4 the processor's call and
    `pad` went to its tokenizer there; v5's call would send a positional text to the feature extractor."""
    from transformers import Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2Processor

    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"[PAD]": 0, "[UNK]": 1, "|": 2, "a": 3, "b": 4, "c": 5}))
    tokenizer = Wav2Vec2CTCTokenizer(str(vocab), unk_token="[UNK]", pad_token="[PAD]", word_delimiter_token="|")
    processor = Wav2Vec2Processor(feature_extractor=Wav2Vec2FeatureExtractor(), tokenizer=tokenizer)
    texts = ["abc", "cab ba"]
    features = [{"input_ids": ids} for ids in tokenizer(texts)["input_ids"]]
    with compatibility_shims():
        with processor.as_target_processor():
            labels = processor(texts).input_ids
            padded = processor.pad(features, padding=True, return_tensors="pt")
        assert type(processor) is Wav2Vec2Processor  # the processor is itself again on exit
    assert labels == tokenizer(texts).input_ids
    assert torch.equal(padded["input_ids"], tokenizer.pad(features, padding=True, return_tensors="pt")["input_ids"])
    assert not hasattr(Wav2Vec2Processor, "as_target_processor")  # removed again when the run ends


def test_a_processor_in_target_mode_pickles_and_leaves_nothing_behind_the_run(tmp_path):
    """transformers 4's target mode was an attribute of the processor: a processor pickled inside the context
    (torch.save, spawned workers) pickled, in target mode; after the run its class is transformers' own again."""
    import pickle

    from transformers import Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2Processor

    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"[PAD]": 0, "[UNK]": 1, "|": 2, "a": 3, "b": 4, "c": 5}))
    tokenizer = Wav2Vec2CTCTokenizer(str(vocab), unk_token="[UNK]", pad_token="[PAD]", word_delimiter_token="|")
    processor = Wav2Vec2Processor(feature_extractor=Wav2Vec2FeatureExtractor(), tokenizer=tokenizer)
    own_call = Wav2Vec2Processor.__dict__["__call__"]
    with compatibility_shims():
        with processor.as_target_processor():
            with processor.as_target_processor():  # nested, as transformers 4 allowed
                pass
            copy = pickle.loads(pickle.dumps(processor))
            assert copy(["abc"]).input_ids == tokenizer(["abc"]).input_ids
            assert processor(["cab"]).input_ids == tokenizer(["cab"]).input_ids  # still inside the outer one
        assert processor(text=["abc"]).input_ids == tokenizer(["abc"]).input_ids  # out of target mode
    assert Wav2Vec2Processor.__dict__["__call__"] is own_call and "pad" in Wav2Vec2Processor.__dict__


def test_truncation_strategy_and_pad_to_max_length_act_as_in_transformers_4(tmp_path):
    """The DeBERTa notebook calls `tokenizer.encode(premise, hypothesis, truncation_strategy="only_first")`:
    transformers v5 raises TypeError on it, and silently ignores `pad_to_max_length=True`. transformers 4
    read them as `truncation=` and `padding="max_length"` when those were not given."""
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    premise, hypothesis = "alice lives in paris and bob works at rome", "where is alice"
    with compatibility_shims():
        truncated = tokenizer.encode(premise, hypothesis, truncation_strategy="only_first", max_length=8)
        called = tokenizer(premise, hypothesis, truncation_strategy="only_first", max_length=8)["input_ids"]
        padded = tokenizer("alice lives in paris", pad_to_max_length=True, max_length=12)["input_ids"]
        untouched = tokenizer(premise, hypothesis, truncation_strategy="do_not_truncate")["input_ids"]
    expected = tokenizer.encode(premise, hypothesis, truncation="only_first", max_length=8)
    assert truncated == called == expected and len(expected) == 8
    assert padded == tokenizer("alice lives in paris", padding="max_length", max_length=12)["input_ids"]
    assert len(padded) == 12
    assert untouched == tokenizer(premise, hypothesis)["input_ids"]


def test_as_target_processor_on_a_processor_without_a_tokenizer_says_so():
    """Target mode sends calls to the tokenizer; a processor without one gets one line naming that, not a
    silent call of its feature extractor."""
    from transformers import Wav2Vec2Processor

    bare = object.__new__(Wav2Vec2Processor)  # no tokenizer attached
    with compatibility_shims():
        with pytest.raises(LauncherError, match="this processor has none"):
            with bare.as_target_processor():
                pass
    assert "__call__" in Wav2Vec2Processor.__dict__ and "_optimum_ipu_routes_targets" not in Wav2Vec2Processor.__dict__
