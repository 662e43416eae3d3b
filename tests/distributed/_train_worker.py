"""One training run of a tiny BERT QA model, for the multi-process tests (run by torchrun or alone).

`python _train_worker.py spec.json`: the spec names the IPU layout, the optimizer, precision, steps
and where to write. Every process writes its flattened weights after every update
(`rank{k}_step{n}.pt`) and after training (`rank{k}_final.pt`), so a test can compare processes
with each other and with a one-process run. With `"report_threads": true` each process writes the
gloo threads still alive after the project's exit handler (`rank{k}_threads.json`); with
`"keep_trainer": true` the trainer stays referenced until the interpreter exits, as in a script
that builds it at module level; with `"group_in_a_cycle": true` an object the project does not know
holds the default group from a reference cycle (garbage once `main` returns).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

import torch
from transformers import BertForQuestionAnswering, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixtures import PatternQA, tiny_bert_config  # noqa: E402

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments  # noqa: E402


class SaveWeights(TrainerCallback):
    def __init__(self, folder: Path, rank: int):
        self.folder, self.rank = folder, rank

    def on_step_end(self, args, state, control, model=None, **kwargs):
        flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
        torch.save(flat, self.folder / f"rank{self.rank}_step{state.global_step}.pt")


class OverflowTrainer(IPUTrainer):
    """Makes one process's loss infinite at one step: an overflow on that process's replicas only."""

    overflow_rank: int | None = None
    overflow_step: int | None = None

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if self.args.process_index == self.overflow_rank and self.state.global_step == self.overflow_step:
            loss = loss * float("inf")
        return loss


KEPT: list = []  # trainers kept alive until exit ("keep_trainer")


def report_threads_at_exit(out: Path) -> None:
    """Registered before the trainer, so it runs after the project's handler (atexit is last in, first out)."""
    from optimum_ipu.runtime.distributed import gloo_threads

    def report():
        rank = os.environ.get("RANK", "0")
        (out / f"rank{rank}_threads.json").write_text(json.dumps(gloo_threads()))

    atexit.register(report)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    if spec.get("report_threads"):
        report_threads_at_exit(out)
    torch.manual_seed(0)
    dropout = spec.get("dropout", 0.0)
    model = BertForQuestionAnswering(
        tiny_bert_config(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    )
    ipu_config = IPUConfig(**spec["ipu_config"])
    args = IPUTrainingArguments(
        output_dir=str(out / "run"), per_device_train_batch_size=2, learning_rate=spec.get("lr", 1e-2),
        max_steps=spec["steps"], logging_steps=1,
        save_strategy=spec.get("save_strategy") or ("steps" if spec.get("save_steps") else "no"),
        save_steps=spec.get("save_steps") or 500, report_to="none", seed=7, dataloader_num_workers=0,
        eval_strategy="steps" if spec.get("eval_steps") else "no", eval_steps=spec.get("eval_steps"),
        per_device_eval_batch_size=2,
        optim=spec.get("optim", "sgd"), fp32=spec.get("fp32", True),
        loss_scaling=spec.get("loss_scaling"), lr_scheduler_type="constant",
    )  # fmt: skip
    trainer_class = OverflowTrainer
    OverflowTrainer.overflow_rank = spec.get("overflow_rank")
    OverflowTrainer.overflow_step = spec.get("overflow_step")
    trainer = trainer_class(model, ipu_config, args, train_dataset=PatternQA(spec.get("samples", 64)),
                            eval_dataset=PatternQA(16, seed=1) if spec.get("eval_steps") else None)  # fmt: skip
    trainer.add_callback(SaveWeights(out, args.process_index))
    if spec.get("keep_trainer"):
        KEPT.append(trainer)
    if spec.get("group_in_a_cycle"):
        import torch.distributed as dist

        holder: dict = {"group": dist.group.WORLD}
        holder["self"] = holder
    trainer.train(resume_from_checkpoint=spec.get("resume_from"))
    # After train() every process holds the whole model (stage processes update only their own stage
    # between saves, so their per-step files hold the other stages' weights as of the last gather).
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    torch.save(flat, out / f"rank{args.process_index}_final.pt")
    if args.process_index == 0:
        summary = {
            "skipped_updates": trainer.loss_scaler.skipped_updates,
            "world_size": args.world_size,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "eval_losses": [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h],
            "total_train_batch_size": trainer.get_total_train_batch_size(args),
        }
        (out / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(sys.argv[1])
