"""Pipeline stages as processes (`runtime.stages`) equal the single-process run.

Each test launches two stage processes (`stage_worker.py`, gloo on CPU) and compares what they
computed with the same GA micro-batches run one after another in this process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from optimum_ipu import IPUConfig
from optimum_ipu.pipelining import to_pipelined
from optimum_ipu.runtime.stages import PipelineStages

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)


def _load_worker():
    spec = importlib.util.spec_from_file_location("stage_worker", HERE / "stage_worker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


worker = _load_worker()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, directory: Path, world_size: int = 2, timeout: float = 120) -> list[dict]:
    """Run `stage_worker.py scenario` in `world_size` processes; return what each rank saved."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world_size))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    procs, logs = [], []
    for rank in range(world_size):
        log = open(directory / f"rank{rank}.log", "w+")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "stage_worker.py"), scenario, str(directory)],
                env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    output = []
    for rank, log in enumerate(logs):
        log.seek(0)
        output.append(f"--- rank {rank} ---\n{log.read()[-4000:]}")
        log.close()
    assert codes == [0] * world_size, f"stage processes ended with {codes}:\n" + "\n".join(output)
    return [torch.load(directory / f"rank{rank}.pt") for rank in range(world_size)]


@contextlib.contextmanager
def single_thread():
    """The reference on one thread, as each stage process runs: the same summation order in BLAS."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference(model, micro_batches, **kwargs):
    worker.pipelined(model)
    with single_thread():
        return worker.one_process(model, micro_batches, **kwargs)


def gathered(ranks: list[dict], key: str) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Each rank's losses, and the gradients of all stages together (each parameter from one stage only)."""
    grads: dict[str, torch.Tensor] = {}
    for r in ranks:
        losses, stage_grads = r[key]
        assert not set(grads) & set(stage_grads), "a parameter got gradients on two stages"
        grads.update(stage_grads)
    return [r[key][0] for r in ranks], grads


def assert_same_run(ranks, key, ref_losses, ref_grads, atol: float, rtol: float = 0.0, scale: float = 1.0):
    losses, grads = gathered(ranks, key)
    for rank_losses in losses:  # every rank of the stage group gets the losses
        assert rank_losses.dtype == torch.float32 and rank_losses.shape == (worker.GA,)
        torch.testing.assert_close(rank_losses, ref_losses, atol=atol, rtol=rtol)
    assert set(grads) == set(ref_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad / scale, ref_grads[name] / scale, atol=atol, rtol=rtol, msg=name)


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    return launch("bert", tmp_path_factory.mktemp("bert"))


def test_two_stage_processes_equal_one_process_bert_qa(bert_run):
    ref_losses, ref_grads = reference(worker.bert(), worker.bert_micro_batches())
    # The plan's split: embeddings and layers 0-1 on stage 0, layers 2-3 and the QA head on stage 1.
    owned = [set(r["owned"]) for r in bert_run]
    assert "bert.embeddings.word_embeddings.weight" in owned[0]
    assert "bert.encoder.layer.1.output.dense.weight" in owned[0]
    assert "bert.encoder.layer.2.output.dense.weight" in owned[1]
    assert "qa_outputs.weight" in owned[1]
    for key in ("gpipe", "1f1b"):
        assert_same_run(bert_run, key, ref_losses, ref_grads, atol=1e-6, scale=worker.LOSS_SCALE)


def test_new_shapes_rebuild_the_stages(bert_run):
    data = worker.bert_micro_batches(worker.SHORT_SEQ)
    ref_losses, ref_grads = reference(worker.bert(), data)
    assert_same_run(bert_run, "short", ref_losses, ref_grads, atol=1e-6, scale=worker.LOSS_SCALE)


def test_dropout_runs_in_each_stage_process(bert_run):
    ref_losses, _ = reference(worker.bert(), worker.bert_micro_batches())
    losses, grads = gathered(bert_run, "dropout")
    torch.testing.assert_close(losses[0], losses[1])
    assert torch.isfinite(losses[0]).all() and not torch.allclose(losses[0], ref_losses)
    assert grads and all(torch.isfinite(g).all() for g in grads.values())


def test_broadcast_weights_gives_every_rank_the_whole_model(bert_run):
    before = worker.bert().state_dict()
    first, second = (r["weights"] for r in bert_run)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    # Each stage's own change arrived everywhere: +1 from stage 0, +2 from stage 1.
    assert torch.equal(
        first["bert.embeddings.word_embeddings.weight"], before["bert.embeddings.word_embeddings.weight"] + 1
    )
    assert torch.equal(first["qa_outputs.bias"], before["qa_outputs.bias"] + 2)


def test_broadcast_optimizer_state_gives_every_rank_every_stage_moments(bert_run):
    _, grads = gathered(bert_run, "1f1b")
    first, second = (r["optimizer_state"] for r in bert_run)
    assert set(first) == set(second) == set(grads)  # every parameter's state, from the stage that owns it
    for name, state in first.items():
        assert list(state) == list(second[name]) == ["step", "exp_avg", "exp_avg_sq"], name
        for key, value in state.items():
            assert torch.equal(value, second[name][key]), (name, key)
        torch.testing.assert_close(state["exp_avg"], 0.1 * grads[name], rtol=1e-6, atol=0, msg=name)
        assert float(state["step"]) == 1.0


def test_two_stage_processes_equal_one_process_vit_multilabel(tmp_path):
    ranks = launch("vit", tmp_path)
    ref_losses, ref_grads = reference(worker.vit(), worker.vit_micro_batches())
    for key in ("gpipe", "1f1b"):
        assert_same_run(ranks, key, ref_losses, ref_grads, atol=1e-6, scale=worker.LOSS_SCALE)
    first, second = (r["weights"] for r in ranks)
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_fp16_stages_close_to_one_process_fp16(tmp_path):
    ranks = launch("bert_fp16", tmp_path)
    ref_losses, ref_grads = reference(worker.bert(torch.float16), worker.bert_micro_batches())
    # fp16 activations cross between the stages; the fp32 gradient sums come from the hooks.
    _, grads = gathered(ranks, "gpipe")
    assert [r["hidden_dtype"] for r in ranks] == [torch.float16, torch.float16]
    assert all(g.dtype == torch.float32 for g in grads.values())
    assert_same_run(ranks, "gpipe", ref_losses, ref_grads, atol=1e-3, rtol=1e-2, scale=worker.LOSS_SCALE)


def _ipu_config():
    return IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2, gradient_accumulation_steps=4)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: BertForMaskedLM(worker.bert().config), "tied to the word embedding"),
        (
            lambda: GPT2LMHeadModel(
                GPT2Config(vocab_size=100, n_embd=32, n_layer=4, n_head=2, n_positions=32)
            ),
            "not GPT2LMHeadModel",
        ),
    ],
)
def test_unsupported_model_is_a_clear_error(build, message):
    handle = to_pipelined(build(), _ipu_config())
    with pytest.raises(ValueError, match=message) as error:
        PipelineStages(handle, stage=0, num_stages=2, group=None, n_microbatches=4)
    assert "one process" in str(error.value)


def test_a_middle_stage_without_layers_is_a_clear_error():
    config = IPUConfig(layers_per_ipu=[2, 0, 2], ipus_per_replica=3, gradient_accumulation_steps=4)
    handle = to_pipelined(worker.bert(), config)
    with pytest.raises(ValueError, match="IPU 1 of the pipeline without a layer"):
        PipelineStages(handle, stage=0, num_stages=3, group=None, n_microbatches=4)


def _chained_loss(model, micro_batch, layers_per_ipu, recompute=False):
    """The stage modules of `model` called one after another in this process, hidden state passed on."""
    from optimum_ipu.runtime.stages import _StageModule, check_supported, model_loss

    config = IPUConfig(
        layers_per_ipu=layers_per_ipu,
        ipus_per_replica=len(layers_per_ipu),
        recompute_checkpoint_every_layer=recompute,
    )
    handle = to_pipelined(model, config).parallelize()
    check_supported(handle)
    hidden = None
    for stage in range(len(layers_per_ipu)):
        module = _StageModule(handle, stage, model_loss)
        module.hidden_dtype = torch.float32
        hidden = module(*(() if hidden is None else (hidden,)), **micro_batch)
    return hidden


def _text_batch(**labels):
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    return {"input_ids": torch.randint(2, 100, (2, 10), generator=g), "attention_mask": mask, **labels}


@pytest.mark.parametrize(
    ("name", "layers_per_ipu", "recompute"),
    [
        ("distilbert_classification", [1, 2, 1], False),
        ("roberta_qa", [2, 2], True),
        ("bert_tokens", [0, 4], False),
    ],
)
def test_stage_modules_chain_to_the_whole_model(name, layers_per_ipu, recompute):
    """Each family's stages (3 stages, a first stage without layers, recomputation) give the model's loss."""
    from transformers import (
        BertForTokenClassification,
        DistilBertConfig,
        DistilBertForSequenceClassification,
        RobertaConfig,
        RobertaForQuestionAnswering,
    )

    torch.manual_seed(0)
    common = dict(
        vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64
    )
    off = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if name == "distilbert_classification":
        config = DistilBertConfig(vocab_size=100, dim=32, n_layers=4, n_heads=2, hidden_dim=64, dropout=0.0,
                                  attention_dropout=0.0, seq_classif_dropout=0.0)  # fmt: skip
        model, batch = DistilBertForSequenceClassification(config), _text_batch(labels=torch.tensor([0, 1]))
    elif name == "roberta_qa":
        model = RobertaForQuestionAnswering(RobertaConfig(**common, **off, pad_token_id=1))
        batch = _text_batch(start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 4]))
    else:
        model = BertForTokenClassification(worker.bert().config)
        batch = _text_batch(labels=torch.randint(0, 2, (2, 10)))
    model.eval()
    chained = _chained_loss(model, batch, layers_per_ipu, recompute)
    assert chained.shape == (1,) and chained.dtype == torch.float32
    # The model is whole again after each stage call, and gives the same loss.
    torch.testing.assert_close(chained[0], model(**batch).loss, atol=1e-6, rtol=0)


def test_shape_probe_leaves_the_random_stream_alone():
    """Building a stage runs the embeddings once for the hidden state's shape: dropout there draws nothing."""
    from optimum_ipu.runtime.stages import _StageModule, model_loss

    handle = worker.pipelined(worker.bert(dropout=0.5))
    handle.module.train()
    module = _StageModule(handle, 1, model_loss)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    hidden = module.hidden_like(worker.bert_micro_batches()[0])
    assert torch.equal(torch.rand(3), expected)
    assert hidden.shape == (worker.MICRO, worker.SEQ, 32) and hidden.dtype == torch.float32
