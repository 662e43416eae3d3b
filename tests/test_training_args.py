"""IPUTrainingArguments and resolve_ipu_config: the seed 001 command line, removed v5 arguments, overrides."""

import dataclasses
import logging
import shlex
import warnings
from dataclasses import dataclass, field

import pytest
from transformers import HfArgumentParser

from optimum_ipu.configuration import IPUConfig, IPUConfigError
from optimum_ipu.training_args import IPUTrainingArguments, resolve_ipu_config

# The command line of seeds/001 (the Graphcore/bert-base-uncased-squad model card), flags verbatim.
SEED_001 = r"""python examples/question-answering/run_qa.py \
  --model_name_or_path Graphcore/bert-base-uncased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name squad \
  --do_train \
  --do_eval \
  --num_train_epochs 3 \
  --per_device_train_batch_size 2 \
  --per_device_eval_batch_size 2 \
  --gradient_accumulation_steps 16 \
  --pod_type pod16 \
  --learning_rate 9e-5 \
  --max_seq_length 384 \
  --doc_stride 128 \
  --seed 42\
  --lr_scheduler_type linear \
  --loss_scaling 64 \
  --weight_decay 0.01 \
  --warmup_ratio 0.2 \
  --logging_steps 1 \
  --save_steps 50 \
  --dataloader_num_workers 64 \
  --ipu_config_overrides "embedding_serialization_factor=2" \
  --output_dir squad_v2_bert_base \
"""


@dataclass
class _ModelArguments:  # the part of run_qa.py's arguments the seed uses
    model_name_or_path: str = field(metadata={"help": "model"})


@dataclass
class _DataArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "dataset"})
    max_seq_length: int = field(default=384, metadata={"help": "sequence length"})
    doc_stride: int = field(default=128, metadata={"help": "stride"})


def _args(**kwargs) -> IPUTrainingArguments:
    kwargs.setdefault("output_dir", "out")
    return IPUTrainingArguments(**kwargs)


@pytest.fixture(autouse=True)
def _in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)


# ----- seed 001 ----------------------------------------------------------------------------------


def test_seed_001_command_line_gives_the_published_layout(caplog):
    caplog.set_level(logging.INFO, logger="optimum_ipu")
    argv = shlex.split(SEED_001.replace("\\\n", " "))[2:]
    parser = HfArgumentParser((_ModelArguments, _DataArguments, IPUTrainingArguments))
    model_args, data_args, args, rest = parser.parse_args_into_dataclasses(
        argv, return_remaining_strings=True
    )
    assert rest == []
    assert model_args.model_name_or_path == "Graphcore/bert-base-uncased"
    assert (data_args.dataset_name, data_args.max_seq_length, data_args.doc_stride) == ("squad", 384, 128)
    assert args.warmup_steps == 0.2 and args.warmup_ratio == 0.2
    assert args.dataloader_num_workers == 64
    assert args.gradient_accumulation_steps == 1 and args.ipu_gradient_accumulation_steps == 16
    assert (args.pod_type, args.n_ipu, args.loss_scaling, args.seed) == ("pod16", 16, 64.0, 42)

    config = resolve_ipu_config(args, model_args.model_name_or_path)
    assert config.replication_factor == 4
    assert config.gradient_accumulation_steps == 16
    assert config.embedding_serialization_factor == 2
    assert config.layers_per_ipu == [0, 4, 4, 4]
    assert config.seed == 42
    assert args.per_device_train_batch_size * config.batch_size_factor() == 2 * 16 * 4 == 128
    assert "micro-batch 2 × gradient accumulation 16 × replicas 4 × device iterations 1 = 128" in caplog.text
    assert config.mode == "training"


# ----- the IPU arguments -------------------------------------------------------------------------


def test_ipu_fields_have_help_and_defaults():
    ours = {f.name: f for f in dataclasses.fields(IPUTrainingArguments)}
    names = [
        "ipu_config_name",
        "n_ipu",
        "pod_type",
        "fp32",
        "lamb",
        "lamb_no_bias_correction",
        "loss_scaling",
        "auto_loss_scaling",
        "dataloader_mode",
        "compile_only",
        "ipu_config_overrides",
        "pad_on_batch_axis",
        "gradient_accumulation_steps",
        "warmup_ratio",
        "overwrite_output_dir",
        "evaluation_strategy",
        "logging_dir",
    ]
    for name in names:
        assert ours[name].metadata.get("help"), name
    args = _args()
    assert (args.fp32, args.lamb, args.loss_scaling, args.dataloader_mode, args.compile_only) == (
        False,
        False,
        None,
        "sync",
        False,
    )


def test_dataloader_mode_choices():
    parser = HfArgumentParser(IPUTrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(
        ["--output_dir", "o", "--dataloader_mode", "async_rebatched"]
    )
    assert args.dataloader_mode == "async_rebatched"
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--output_dir", "o", "--dataloader_mode", "fast"])


def test_gradient_accumulation_is_kept_for_the_ipu():
    args = _args()
    assert args.ipu_gradient_accumulation_steps is None and args.gradient_accumulation_steps == 1
    given = _args(gradient_accumulation_steps=8)
    assert given.ipu_gradient_accumulation_steps == 8 and given.gradient_accumulation_steps == 1
    assert dataclasses.replace(given).ipu_gradient_accumulation_steps == 8
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an integer >= 1"):
        _args(gradient_accumulation_steps=0)


@pytest.mark.parametrize("pod_type", ["pod3", "pod0", "podX", "16"])
def test_pod_type_must_be_pod_n_with_n_a_power_of_two(pod_type):
    with pytest.raises(ValueError, match=f"pod_type '{pod_type}' is not a pod"):
        _args(pod_type=pod_type)


def test_pod_type_and_n_ipu_must_agree():
    assert _args(pod_type="pod16", n_ipu=16).n_ipu == 16
    assert _args(pod_type="pod64").n_ipu == 64
    with pytest.raises(ValueError, match="--pod_type pod16 means 16 IPUs but --n_ipu is 8"):
        _args(pod_type="pod16", n_ipu=8)
    with pytest.raises(ValueError, match="n_ipu must be an integer >= 1"):
        _args(n_ipu=0)


def test_fp16_is_the_ipu_default_and_never_autocast():
    args = _args(fp16=True)
    assert args.fp16 is False and args.bf16 is False
    with pytest.raises(ValueError, match="--bf16 is not supported"):
        _args(bf16=True)
    with pytest.raises(ValueError, match="--fp16 and --fp32"):
        _args(fp16=True, fp32=True)


def test_full_eval_precisions_are_refused_or_say_they_change_nothing(caplog):
    """transformers' evaluation loop would cast the model in place (bf16: no IPU type; fp16 under --fp32:
    the training after it in fp16); Optimum Graphcore never read either flag."""
    from optimum_ipu import _once

    _once.forget()
    with pytest.raises(ValueError, match="--bf16_full_eval is not supported.*Drop --bf16_full_eval"):
        _args(bf16_full_eval=True)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        args = _args(fp16_full_eval=True, fp32=True)
    assert args.fp16_full_eval is False
    assert sum("--fp16_full_eval has no effect" in r.getMessage() for r in caplog.records) == 1


def test_lamb_no_bias_correction_alone_means_lamb_as_in_optimum_graphcore():
    args = _args(lamb_no_bias_correction=True)
    assert args.lamb and args.lamb_no_bias_correction


@pytest.mark.parametrize("given", [{"torch_compile": True}, {"torch_compile_backend": "inductor"},
                                   {"torch_compile_mode": "max-autotune"}])  # fmt: skip
def test_torch_compile_says_it_changes_nothing_and_is_turned_off(caplog, monkeypatch, given):
    """transformers turns torch_compile on when only a backend or a mode is given, and has accelerate compile
    the model from its environment variables: every spelling is said once and turned off."""
    from optimum_ipu import _once

    _once.forget()
    for name in ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE"):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        args = _args(**given)
    assert args.torch_compile is False and args.torch_compile_backend is None and args.torch_compile_mode is None
    assert "ACCELERATE_DYNAMO_BACKEND" not in __import__("os").environ
    said = [r.getMessage() for r in caplog.records if "torch.compile is turned off" in r.getMessage()]
    assert len(said) == 1 and f"--{next(iter(given))}" in said[0]


def test_the_ipu_configs_own_seed_gives_way_to_the_runs_seed_and_says_so(caplog):
    from optimum_ipu import _once

    _once.forget()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        config = resolve_ipu_config(_args(seed=42), ipu_config=IPUConfig(seed=123))
    assert config.seed == 42
    assert sum("seed=123 is replaced by the run's --seed 42" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        resolve_ipu_config(_args(seed=42), ipu_config=IPUConfig())
    assert not [r for r in caplog.records if "seed" in r.getMessage()]


# ----- arguments transformers v5 removed ---------------------------------------------------------


def test_warmup_ratio_becomes_warmup_steps():
    assert _args(warmup_ratio=0.1).warmup_steps == 0.1
    with pytest.raises(ValueError, match="warmup_ratio must be in"):
        _args(warmup_ratio=1.5)
    with pytest.raises(ValueError, match="--warmup_ratio 0.1 and --warmup_steps 100 both set"):
        _args(warmup_ratio=0.1, warmup_steps=100)


def test_evaluation_strategy_becomes_eval_strategy():
    args = _args(evaluation_strategy="steps", eval_steps=5)
    assert args.eval_strategy == "steps" and args.do_eval
    with pytest.raises(ValueError, match="disagree"):
        _args(evaluation_strategy="steps", eval_strategy="epoch")


def test_overwrite_output_dir_and_logging_dir_are_accepted(monkeypatch):
    import os

    parser = HfArgumentParser(IPUTrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(
        ["--output_dir", "o", "--overwrite_output_dir", "--logging_dir", "tb"]
    )
    assert args.overwrite_output_dir is True
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == "tb"


# ----- resolve_ipu_config ------------------------------------------------------------------------


def test_the_ipu_config_value_holds_when_the_command_line_gives_none():
    config = resolve_ipu_config(_args(), "Graphcore/bert-base-ipu")
    assert config.gradient_accumulation_steps == 16 and config.replication_factor == 1


def test_a_given_config_is_copied_and_put_in_training_mode():
    given = IPUConfig(layers_per_ipu=[0, 4, 4, 4], gradient_accumulation_steps=4).eval()
    config = resolve_ipu_config(_args(gradient_accumulation_steps=8, n_ipu=8), ipu_config=given)
    assert (
        config.mode == "training"
        and config.gradient_accumulation_steps == 8
        and config.replication_factor == 2
    )
    assert given.gradient_accumulation_steps == 4 and given.mode == "inference"


def test_gradient_checkpointing_means_recompute_every_layer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # v5 renamed it activation_checkpointing
        args = _args(gradient_checkpointing=True)
    assert resolve_ipu_config(args, ipu_config=IPUConfig()).recompute_checkpoint_every_layer is True
    assert resolve_ipu_config(_args(), ipu_config=IPUConfig()).recompute_checkpoint_every_layer is False


def test_overrides_come_last_and_n_ipu_uses_the_final_layout():
    args = _args(
        gradient_accumulation_steps=8,
        n_ipu=8,
        seed=5,
        auto_loss_scaling=True,
        ipu_config_overrides="gradient_accumulation_steps=2,layers_per_ipu=[6 6],ipus_per_replica=2,seed=7",
    )
    config = resolve_ipu_config(args, "Graphcore/bert-base-ipu")
    assert config.gradient_accumulation_steps == 2
    assert config.ipus_per_replica == 2 and config.replication_factor == 4
    assert config.seed == 5 and config.auto_loss_scaling is True  # the run's --seed: nothing reads the config's


def test_an_override_of_the_replication_factor_wins_over_n_ipu(caplog):
    args = _args(n_ipu=16, ipu_config_overrides="replication_factor=2")
    assert resolve_ipu_config(args, "Graphcore/bert-base-ipu").replication_factor == 2
    assert "n_ipu=16 does not change it" in caplog.text


def test_n_ipu_not_a_multiple_of_ipus_per_replica_is_an_error():
    with pytest.raises(IPUConfigError, match="n_ipu=6 is not a multiple of ipus_per_replica=4"):
        resolve_ipu_config(_args(n_ipu=6), "Graphcore/bert-base-ipu")


def test_pod_type_picks_the_entry_of_a_pod_keyed_file(tmp_path):
    (tmp_path / "ipu_config.json").write_text(
        '{"layers_per_ipu": [-1], "gradient_accumulation_steps": {"pod16": 64, "default": 8}}'
    )
    assert resolve_ipu_config(_args(pod_type="pod16"), str(tmp_path)).gradient_accumulation_steps == 64
    assert resolve_ipu_config(_args(), str(tmp_path)).gradient_accumulation_steps == 8


def test_replicated_tensor_sharding_with_one_replica_warns(caplog):
    resolve_ipu_config(_args(), "Graphcore/bert-base-ipu")
    assert "replicated_tensor_sharding has no effect with replication_factor=1" in caplog.text


def test_no_config_name_is_an_error():
    with pytest.raises(ValueError, match="pass --ipu_config_name"):
        resolve_ipu_config(_args())
