"""Speed of an inference pipeline on the simulated IPU: a list of inputs in one call against one input per call.

`optimum.graphcore.pipeline(...)` runs each input's forward as one host call. In fp16 on a CPU the
converted ops read fp32 copies of the weights (`runtime.fp16_compute`); within one pipeline call the
weights do not change, so the copies are made once for the call (`held_fp32_copies`), not once per input.
This bench measures what that is worth at a real size: a text-classification pipeline on a random-weight
BERT-base (110 M parameters) over `--inputs` texts of `--words` words each (padded to 128 tokens, the
pipeline's default), fp16 and fp32, called with the whole list and with one input per call, interleaved
over `--rounds` rounds. Printed: the CPU, the median CPU time per input of each run, and the fp16 runs'
speed against fp32's (1.0 = as fast as fp32).

    OMP_NUM_THREADS=1 python bench/pipeline_speed.py [--rounds 5] [--inputs 8] [--words 100]
"""

from __future__ import annotations

import argparse
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
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead import cpu_description  # noqa: E402

from optimum.graphcore import IPUConfig, pipeline  # noqa: E402

WORDS = "the a of is in was what who where when city river name year paris rome berlin alice bob carol".split()


def word_tokenizer(directory: str) -> BertTokenizer:
    """A word-level BERT tokenizer over `WORDS` (no download)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w") as handle:
        handle.write("\n".join(vocab) + "\n")
    return BertTokenizer(path, do_lower_case=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inputs", type=int, default=8, help="texts per call of the whole list")
    parser.add_argument("--words", type=int, default=100, help="words per text (at most 126)")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    logging.getLogger("optimum_ipu").setLevel(logging.ERROR)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print(cpu_description(), f"{torch.get_num_threads()} torch threads, torch {torch.__version__}")

    tokenizer = word_tokenizer(tempfile.mkdtemp())
    random.seed(0)
    texts = [" ".join(random.choice(WORDS) for _ in range(args.words)) for _ in range(args.inputs)]
    config = IPUConfig(layers_per_ipu=[6, 6], ipus_per_replica=2)
    pipelines = {}
    for fp16 in (True, False):
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer)))
        pipelines[fp16] = pipeline(
            "text-classification", model=model, tokenizer=tokenizer, ipu_config=config, fp16=fp16
        )
        pipelines[fp16](texts[:1])  # compiles
    runs = {
        f"{'fp16' if fp16 else 'fp32'}, {how}": (pipelines[fp16], how)
        for fp16 in (True, False)
        for how in ("the list in one call", "one input per call")
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (pipe, how) in runs.items():
            start = time.process_time()
            if how == "the list in one call":
                pipe(texts)
            else:
                for text in texts:
                    pipe(text)
            times[name].append((time.process_time() - start) / len(texts))

    print(f"\nBERT-base text classification, {args.inputs} inputs of {args.words} words (128 tokens), "
          f"{args.rounds} rounds; CPU time of this process")  # fmt: skip
    fp32 = {how: statistics.median(times[f"fp32, {how}"]) for how in ("the list in one call", "one input per call")}
    print(f"{'run':<30} {'ms per input':>13} {'fp32 / run':>11}")
    for name, (_, how) in runs.items():
        median = statistics.median(times[name])
        print(f"{name:<30} {median * 1e3:13.1f} {fp32[how] / median:11.2f}")


if __name__ == "__main__":
    main()
