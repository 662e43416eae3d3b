"""One pipeline-stage process of the tests in `test_stages.py`, and the models and data they share.

Run as `python stage_worker.py SCENARIO OUT_DIR` with the torch.distributed environment (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT); it writes what it computed to OUT_DIR/rank{RANK}.pt. The test
process imports the same builders to compute the single-process reference.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForQuestionAnswering, ViTConfig, ViTForImageClassification

from optimum_ipu import IPUConfig
from optimum_ipu.pipelining import to_pipelined
from optimum_ipu.runtime.fp16_compute import fp16_compute_context
from optimum_ipu.runtime.gradients import GradientAccumulator
from optimum_ipu.runtime.stages import PipelineStages, model_loss

GA = 4  # micro-batches per run: the gradient accumulation steps
MICRO = 2  # samples per micro-batch
SEQ = 12
SHORT_SEQ = 8
LOSS_SCALE = 64.0


def bert(dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> BertForQuestionAnswering:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    return BertForQuestionAnswering(config).to(dtype)


def bert_micro_batches(seq: int = SEQ) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seq)
    batches = []
    for _ in range(GA):
        mask = torch.ones(MICRO, seq, dtype=torch.long)
        mask[0, seq - 3 :] = 0  # padding: the mask must reach every stage
        batches.append(
            {
                "input_ids": torch.randint(1, 100, (MICRO, seq), generator=g),
                "attention_mask": mask,
                "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(MICRO, seq).clone(),
                "start_positions": torch.randint(0, seq - 3, (MICRO,), generator=g),
                "end_positions": torch.randint(0, seq - 3, (MICRO,), generator=g),
            }
        )
    return batches


def vit(dtype: torch.dtype = torch.float32) -> ViTForImageClassification:
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3,
        problem_type="multi_label_classification",
    )  # fmt: skip
    return ViTForImageClassification(config).to(dtype)


def vit_micro_batches(dtype: torch.dtype = torch.float32) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [
        {
            "pixel_values": torch.randn(MICRO, 3, 16, 16, generator=g).to(dtype),
            "labels": torch.randint(0, 2, (MICRO, 3), generator=g).to(dtype),
        }
        for _ in range(GA)
    ]


def pipelined(model):
    config = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2, gradient_accumulation_steps=GA)
    return to_pipelined(model, config).parallelize()


def one_process(model, micro_batches, loss_scale: float = LOSS_SCALE, fp16_compute: str = "emulated"):
    """The reference: micro-batches one after another, loss x S backpropagated, gradients summed in fp32."""
    model.train()
    gradients = GradientAccumulator([p for p in model.parameters() if p.requires_grad])
    losses = []
    with gradients.collecting(len(micro_batches)), fp16_compute_context(fp16_compute):
        for mb in micro_batches:
            loss = model_loss(model, mb)
            (loss.float() * loss_scale).backward()
            losses.append(loss.detach().float())
    names = {id(p): n for n, p in model.named_parameters()}
    return torch.stack(losses), {names[id(p)]: g.clone() for p, g in gradients.gradients()}


def stage_run(stages: PipelineStages, micro_batches, loss_scale: float = LOSS_SCALE):
    """One `run` as the executor will call it: fp16 gradients caught in fp32 buffers by the hooks."""
    gradients = GradientAccumulator(stages.owned_parameters())
    with gradients.collecting(len(micro_batches)), fp16_compute_context("emulated"):
        losses = stages.run(micro_batches, loss_scale)
    names = {id(p): n for n, p in stages.pipelined.module.named_parameters()}
    result = {names[id(p)]: g.clone() for p, g in gradients.gradients()}
    gradients.clear()
    return losses, result


def main(scenario: str, out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    out: dict = {}
    if scenario in ("bert", "bert_fp16"):
        dtype = torch.float16 if scenario == "bert_fp16" else torch.float32
        model, data = bert(dtype), bert_micro_batches()
    elif scenario == "vit":
        model, data = vit(), vit_micro_batches()
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    handle = pipelined(model)

    stages = PipelineStages(handle, stage=rank, num_stages=2, group=None, n_microbatches=GA)
    out["owned"] = sorted(n for n, p in model.named_parameters() if stages.owns(p))
    out["gpipe"] = stage_run(stages, data)
    out["hidden_dtype"] = stages.module.hidden_dtype
    if scenario == "bert":
        # Other shapes (a batch padded to another length): the stages are rebuilt for them.
        out["short"] = stage_run(stages, bert_micro_batches(SHORT_SEQ))
        # Dropout on: each stage process draws from its own random stream.
        dropout = PipelineStages(
            pipelined(bert(dropout=0.5)), stage=rank, num_stages=2, group=None, n_microbatches=GA
        )
        out["dropout"] = stage_run(dropout, data)
    if scenario in ("bert", "vit"):
        one_f_one_b = PipelineStages(
            handle, stage=rank, num_stages=2, group=None, n_microbatches=GA, schedule="1f1b"
        )
        out["1f1b"] = stage_run(one_f_one_b, data)
        # Each stage changes its own weights; after the broadcast every rank holds all of them.
        with torch.no_grad():
            for p in stages.owned_parameters():
                p.add_(rank + 1.0)
        stages.broadcast_weights()
        out["weights"] = {k: v.clone() for k, v in model.state_dict().items()}
        # Each stage's AdamW keeps moments for its own parameters; after the broadcast every rank has all.
        _, grads = out["1f1b"]
        names = dict(model.named_parameters())
        for name, grad in grads.items():
            names[name].grad = grad.clone()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        optimizer.step()
        one_f_one_b.broadcast_optimizer_state(optimizer)
        out["optimizer_state"] = {
            n: dict(optimizer.state[p]) for n, p in names.items() if p in optimizer.state
        }
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
