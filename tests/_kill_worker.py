"""Fork server for the kill -9 test in test_checkpoints.py: trains a tiny BERT in child processes.

Importing torch and transformers takes seconds; forking a process that has imported them but never
run a torch op takes milliseconds, so the test can kill 20+ training runs in well under a minute.
Protocol, one JSON object per line: the test sends `{"output_dir", "max_steps"}`; this process forks
a child that trains (resuming from the newest complete checkpoint when there is one) and answers
`{"pid": ...}`; the child prints `{"training": pid}` once its first step starts (and, when the request
has `"pause_in_save": true`, `{"saving": pid}` from inside its next checkpoint write, where it waits);
when the child has ended (finished or killed) this process answers `{"exit": status}`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from fixtures import PatternQA, tiny_bert_config  # noqa: E402
from transformers import BertForQuestionAnswering, TrainerCallback  # noqa: E402

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments  # noqa: E402
from optimum_ipu.checkpoints import CHECKPOINT_RE  # noqa: E402

_channel = sys.stdout  # the protocol's lines; anything else training prints goes to stderr


def _say(message: dict) -> None:
    _channel.write(json.dumps(message) + "\n")
    _channel.flush()


class _Started(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if not getattr(self, "said", False):
            self.said = True
            _say({"training": os.getpid()})


def _pause_inside_the_next_save() -> None:
    """Say `{"saving": pid}` from inside the next checkpoint write, then wait to be killed there.

    The pause sits in the first `torch.save` into a checkpoint (the staging folder, as long as saves are
    staged): the weights are written, the optimizer state is not, and nothing is renamed into place yet.
    """
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if "checkpoint-" in str(f):
            _say({"saving": os.getpid()})
            time.sleep(60)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save


def train(output_dir: str, max_steps: int, pause_in_save: bool = False) -> None:
    if pause_in_save:
        _pause_inside_the_next_save()
    torch.set_num_threads(1)  # no OpenMP pool in a forked child
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_bert_config(num_hidden_layers=2))
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=3)
    args = IPUTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=2, max_steps=max_steps, save_strategy="steps",
        save_steps=1, save_total_limit=3, logging_steps=1000, learning_rate=1e-3, report_to="none", seed=0,
        use_cpu=True, fp32=True, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = IPUTrainer(model, config, args, train_dataset=PatternQA(48), callbacks=[_Started()])
    has_checkpoint = os.path.isdir(output_dir) and any(CHECKPOINT_RE.match(n) for n in os.listdir(output_dir))
    trainer.train(resume_from_checkpoint=True if has_checkpoint else None)


def main() -> None:
    global _channel
    _channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                train(request["output_dir"], request["max_steps"], request.get("pause_in_save", False))
            except BaseException:
                traceback.print_exc()
                status = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        _say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _say({"exit": status})


if __name__ == "__main__":
    main()
