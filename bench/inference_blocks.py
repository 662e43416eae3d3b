"""Emulated fp16 inference over a block of host calls: the weights' fp32 copies made once for the block, or per call.

An evaluation loop and a pipeline call on a list run many host calls on weights that nothing changes between
them. In fp16 on a CPU the converted ops read fp32 copies of the weights (`runtime.fp16_compute`); within such
a block they are made once (`held_fp32_copies`), not once per call. This bench measures what that is worth at
BERT-base's size (random weights, 110 M parameters), CPU time, interleaved rounds, medians:

- `pipeline`: a text-classification pipeline over `--inputs` texts of `--words` words (padded to 128 tokens,
  the pipeline's default), fp16 and fp32, called with the whole list and with one input per call (how a
  list ran before); the fp16 runs' speed against fp32's (1.0 = as fast as fp32);
- `evaluate`: `IPUTrainer.evaluate()` of BERT-base question answering on 16 samples of `--seq-len` tokens,
  one sample per host call (micro-batch 1, one device iteration), with the copies made once for the loop
  and, as before, once per call (the trainer's block switched off).

    OMP_NUM_THREADS=1 python bench/inference_blocks.py [--rounds 5] [--inputs 8] [--words 100] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer, PrinterCallback  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_description  # noqa: E402
from overhead import RandomData, minilm_qa  # noqa: E402

from optimum.graphcore import IPUConfig, pipeline  # noqa: E402
from optimum_ipu import IPUTrainer, IPUTrainingArguments  # noqa: E402
from optimum_ipu import trainer as trainer_module  # noqa: E402

WORDS = (
    "the a of is in was what who where when city river name year paris rome berlin alice bob carol".split()
)


def word_tokenizer(directory: str) -> BertTokenizer:
    """A word-level BERT tokenizer over `WORDS` (no download)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w") as handle:
        handle.write("\n".join(vocab) + "\n")
    return BertTokenizer(path, do_lower_case=True)


def pipelines(args) -> None:
    tokenizer = word_tokenizer(tempfile.mkdtemp())
    random.seed(0)
    texts = [" ".join(random.choice(WORDS) for _ in range(args.words)) for _ in range(args.inputs)]
    config = IPUConfig(layers_per_ipu=[6, 6], ipus_per_replica=2)
    built = {}
    for fp16 in (True, False):
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer)))
        built[fp16] = pipeline(
            "text-classification", model=model, tokenizer=tokenizer, ipu_config=config, fp16=fp16
        )
        built[fp16](texts[:1])  # compiles
    hows = ("the list in one call", "one input per call")
    runs = {
        f"{'fp16' if fp16 else 'fp32'}, {how}": (built[fp16], how) for fp16 in (True, False) for how in hows
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (pipe, how) in runs.items():
            start = time.process_time()
            if how == hows[0]:
                pipe(texts)
            else:
                for text in texts:
                    pipe(text)
            times[name].append((time.process_time() - start) / len(texts))
    print(f"\npipeline: BERT-base text classification, {args.inputs} inputs of {args.words} words (128 tokens), "
          f"{args.rounds} rounds")  # fmt: skip
    fp32 = {how: statistics.median(times[f"fp32, {how}"]) for how in hows}
    print(f"{'run':<30} {'ms per input':>13} {'fp32 / run':>11}")
    for name, (_, how) in runs.items():
        median = statistics.median(times[name])
        print(f"{name:<30} {median * 1e3:13.1f} {fp32[how] / median:11.2f}")


def evaluation(args) -> None:
    name, make_model, item = minilm_qa(args.seq_len, base=True)
    data = RandomData(item, 16)
    torch.manual_seed(0)
    training_args = IPUTrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_eval_batch_size=1, report_to="none", use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, inference_device_iterations=1)
    trainer = IPUTrainer(make_model(), config, training_args, eval_dataset=data)
    trainer.remove_callback(PrinterCallback)  # no metrics line per evaluation
    trainer.evaluate()  # compiles
    held = trainer_module.held_fp32_copies
    per_call = lambda mode, weights: contextlib.nullcontext(lambda: None)  # noqa: E731  (the trainer before)
    runs = {"copies once for the loop": held, "copies once per call": per_call}
    times: dict[str, list[float]] = {run: [] for run in runs}
    try:
        for _ in range(args.rounds):
            for run, block in runs.items():
                trainer_module.held_fp32_copies = block
                start = time.process_time()
                trainer.evaluate()
                times[run].append((time.process_time() - start) / len(data))
    finally:
        trainer_module.held_fp32_copies = held
    print(
        f"\nevaluate: {name}, fp16, 16 samples of {args.seq_len} tokens, one per host call, {args.rounds} rounds"
    )
    per_loop = statistics.median(times["copies once for the loop"])
    print(f"{'run':<30} {'ms per sample':>13} {'speed-up':>9}")
    for run in runs:
        median = statistics.median(times[run])
        print(f"{run:<30} {median * 1e3:13.1f} {median / per_loop:9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inputs", type=int, default=8, help="pipeline: texts per call of the whole list")
    parser.add_argument("--words", type=int, default=100, help="pipeline: words per text (at most 126)")
    parser.add_argument("--seq-len", type=int, default=128, help="evaluate: tokens per sample")
    parser.add_argument("--only", choices=("pipeline", "evaluate"))
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    logging.getLogger("optimum_ipu").setLevel(logging.ERROR)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print(cpu_description(), f"{torch.get_num_threads()} torch threads, torch {torch.__version__}")
    if args.only != "evaluate":
        pipelines(args)
    if args.only != "pipeline":
        evaluation(args)


if __name__ == "__main__":
    main()
