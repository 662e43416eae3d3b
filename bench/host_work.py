"""Host-side work that three published evaluations timed and the cost model does not derive from the IPU.

`bench/calibration.py` estimates each published `IPUTrainer.evaluate()` as the IPU and its host links
would run it. Three of those runs also timed work done by the host's CPU; this script measures that
work by doing it here, so the calibration reads a measurement instead of leaving a free choice:

1. The NER notebook's metric (BERT-Base on CoNLL-2003, `compute_metrics` set): its `eval_runtime`
   includes the Trainer gathering every call's logits and labels (one `torch.cat` per call, as
   transformers 4.20's evaluation loop did without `eval_accumulation_steps`), the notebook's
   `compute_metrics` (argmax, the -100 positions dropped, ids mapped to tag names) and the `seqeval`
   metric behind `load_metric("seqeval")`, whose inputs pass through an Arrow table first. It runs on
   data of CoNLL-2003 validation's shape: 3,240 sentences evaluated (162 calls of 20), 51,362 words
   over 3,250 sentences (the data set card), every word piece labelled (`label_all_tokens = True`),
   so `--pieces-per-word` word pieces per word (the one assumption; its effect is printed).
2. The RoBERTa MLM notebook's logits: each host call returns 20 x 128 x 50,265 fp16 logits (257 MB).
   PopTorch allocates a new output tensor for every call (`PoplarExecutable::run` calls `at::empty`
   per output) and the host writes every byte of it. The script times that write into a fresh
   tensor (a page fault per 4 KiB page), into a fresh tensor backed by transparent huge pages (as on
   a host whose kernel has THP "always"; torch's `THP_MEM_ALLOC_ENABLE=1` asks for them here) and
   into a warm one (a plain copy). The calibration fits `host_copy_bandwidth` (the same copy for a
   call's inputs, into Poplar's reused stream buffers) between the slowest and the fastest, as no
   published figure gives the notebook host's rate.

3. The packed BERT notebook's data loading (BERT-Base on SST-2 packed to 256 tokens, 9 calls of 1,024
   packs): Optimum Graphcore 0.4.4's evaluation loads synchronously (`get_eval_dataloader` sets
   `DataLoaderMode.Sync`) in the main process, so each call's batch is built between calls, inside
   `eval_runtime`. The notebook's packed data set is a `datasets.Dataset` in torch format with four
   256-token fields and 12 labels a pack; datasets of that time had no `__getitems__` (added in
   huggingface/datasets PR #5512, February 2023), so the loader fetched the 1,024 rows of a batch one by
   one and `default_data_collator` stacked them. The script does the same (rows fetched one by one), for
   the 9 calls' batches and one more: inside the timer `evaluation_loop` first asks for the loader's first
   batch (`_wrap_and_compile_model_for_evaluation`, `next(iter(dataloader))`) to find the model compiled.

All are CPU work, so the figures hold for the CPU printed first, and for the Python and libraries printed
second: the calibration reads the first and third parts as `bench/host_work_env.sh` measures them, with the
notebooks' own software (Python 3.8, torch 1.10, the transformers of 2022), on the CPU `MEASURING_CPU` in
`bench/calibration.py` names.

    pip install seqeval        # the NER notebook's metric, used only here
    OMP_NUM_THREADS=1 python bench/host_work.py [--rounds 5] [--pieces-per-word 1.3] [--only ner|packed|output]
    PYTHON38=path/to/python3.8 bash bench/host_work_env.sh [ENV_DIR] --rounds 9   # the calibration's figures
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from machine import cpu_description, python_description

# CoNLL-2003's tags in the data set's order (the notebook's `label_list`).
TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
SEQ_LEN, CALLS, PER_CALL = 128, 162, 20
WORDS_PER_SENTENCE = 51_362 / 3_250  # CoNLL-2003 validation (data set card)
CHUNKS = 8_910  # tagged chunks in the notebook's printed seqeval support (LOC 2,617, MISC 1,228, ORG 2,043, PER 3,022)
MLM_OUTPUT_BYTES = PER_CALL * SEQ_LEN * 50_265 * 2  # one call's fp16 logits of roberta-base


def conll_shaped_batches(pieces_per_word: float, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits, labels) of every call: labels -100 on [CLS], [SEP] and padding, tags elsewhere;
    logits whose argmax is the label for ~95 % of tokens (the notebook's accuracy was 0.979)."""
    rng = np.random.default_rng(seed)
    per_piece = CHUNKS / (
        3_250 * WORDS_PER_SENTENCE * pieces_per_word
    )  # chunks of 1-2 pieces, 1.5 on average
    start_chunk = per_piece / (1 - 0.5 * per_piece)
    batches = []
    for _ in range(CALLS):
        labels = np.full((PER_CALL, SEQ_LEN), -100, dtype=np.int64)
        for row in labels:
            n = int(np.clip(rng.poisson(WORDS_PER_SENTENCE * pieces_per_word), 1, SEQ_LEN - 2))
            tags = []
            while len(tags) < n:
                if rng.random() < start_chunk:
                    kind = 1 + 2 * int(rng.integers(0, 4))  # B-PER, B-ORG, B-LOC or B-MISC
                    tags += [kind] + [kind + 1] * int(rng.integers(0, 2))
                else:
                    tags.append(0)
            row[1 : n + 1] = tags[:n]
        guess = np.where(
            rng.random(labels.shape) < 0.95, np.maximum(labels, 0), rng.integers(0, 9, labels.shape)
        )
        logits = rng.normal(size=(PER_CALL, SEQ_LEN, len(TAGS))).astype(np.float16)
        np.put_along_axis(logits, guess[..., None], 8.0, axis=2)
        batches.append((torch.from_numpy(logits), torch.from_numpy(labels)))
    return batches


def ner_evaluation_host_seconds(batches) -> float:
    """Seconds of the host work the NER `evaluate()` timed besides its calls (see the module doc)."""
    from datasets import Dataset
    from seqeval.metrics import accuracy_score, classification_report

    start = time.perf_counter()
    preds = labels = None
    for logits, label in batches:  # the evaluation loop's per-call gathering
        preds = logits if preds is None else torch.cat((preds, logits), dim=0)
        labels = label if labels is None else torch.cat((labels, label), dim=0)
    predicted, reference = preds.numpy().argmax(axis=2), labels.numpy()
    true_predictions = [
        [TAGS[p] for p, t in zip(ps, ts) if t != -100] for ps, ts in zip(predicted, reference)
    ]
    true_labels = [[TAGS[t] for p, t in zip(ps, ts) if t != -100] for ps, ts in zip(predicted, reference)]
    table = Dataset.from_dict({"predictions": true_predictions, "references": true_labels})[
        :
    ]  # Arrow round trip
    report = classification_report(table["references"], table["predictions"], output_dict=True)
    accuracy_score(table["references"], table["predictions"])
    seconds = time.perf_counter() - start
    assert report["micro avg"]["support"] > 0
    return seconds


PACKS, PACK_LEN, PACK_LABELS, PACKED_CALLS, PACKS_PER_CALL = 10_024, 256, 12, 9, 1_024
PACKED_BATCHES_TIMED = PACKED_CALLS + 1  # the calls' batches and the one the loop draws to check compilation


def packed_loading_host_seconds() -> float:
    """Seconds of building the packed BERT notebook's 10 evaluation batches (see the module doc)."""
    from datasets import Dataset
    from transformers import default_data_collator

    rng = np.random.default_rng(0)
    table = Dataset.from_dict({
        "input_ids": rng.integers(0, 30_522, (PACKS, PACK_LEN)),
        "attention_mask": rng.integers(0, 13, (PACKS, PACK_LEN)),
        "token_type_ids": np.zeros((PACKS, PACK_LEN), dtype=int),
        "position_ids": rng.integers(0, PACK_LEN, (PACKS, PACK_LEN)),
        "labels": rng.integers(-100, 2, (PACKS, PACK_LABELS)),
    })  # fmt: skip
    table.set_format(type="torch", columns=table.features)

    class RowByRow(torch.utils.data.Dataset):  # the loader of the time: no batched fetch
        def __len__(self):
            return len(table)

        def __getitem__(self, index):
            return table[index]

    loader = torch.utils.data.DataLoader(
        RowByRow(), batch_size=PACKS_PER_CALL, drop_last=True, collate_fn=default_data_collator
    )
    start = time.process_time()
    next(iter(loader))  # the compile check's batch
    batches = 1 + sum(1 for _ in loader)
    seconds = time.process_time() - start
    assert batches == PACKED_BATCHES_TIMED
    return seconds


def output_write_seconds(nbytes: int, fresh: bool, source: torch.Tensor, warm: torch.Tensor) -> float:
    """Seconds to write `nbytes` of call outputs on the host: into a new tensor, as PopTorch allocates
    one per call, or into `warm`, already-touched memory."""
    start = time.perf_counter()
    out = torch.empty(nbytes // 2, dtype=torch.float16) if fresh else warm
    out.copy_(source)
    seconds = time.perf_counter() - start
    del out
    return seconds


def output_write_rate(fresh: bool, rounds: int) -> float:
    """Bytes/s of writing one MLM call's logits (median over `rounds`)."""
    source = torch.empty(MLM_OUTPUT_BYTES // 2, dtype=torch.float16).normal_()
    warm = torch.empty_like(source).copy_(source)
    seconds = statistics.median(
        output_write_seconds(MLM_OUTPUT_BYTES, fresh, source, warm) for _ in range(rounds)
    )
    return MLM_OUTPUT_BYTES / seconds


def huge_page_write_rate(rounds: int) -> float:
    """`output_write_rate(fresh=True)` in a process whose large tensors get transparent huge pages
    (torch reads `THP_MEM_ALLOC_ENABLE` when it starts)."""
    code = f"import host_work; print(host_work.output_write_rate(True, {rounds}))"
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1"}
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=here, capture_output=True, text=True, check=True
    )
    return float(out.stdout.split()[-1])


PARTS = ("ner", "packed", "output")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="repetitions; medians over them")
    parser.add_argument(
        "--pieces-per-word", type=float, default=1.3, help="bert-base-uncased pieces per word"
    )
    parser.add_argument(
        "--only", choices=PARTS, action="append", help="measure only this part (repeatable); default all"
    )
    args = parser.parse_args()
    parts = args.only or PARTS
    if "ner" in parts:
        try:
            import seqeval  # noqa: F401
        except ImportError:
            raise SystemExit("bench/host_work.py needs the NER notebook's metric: pip install seqeval") from None
    print(cpu_description())
    print(python_description("numpy", "torch", "pyarrow", "datasets", "transformers", "seqeval"))
    print(f"{torch.get_num_threads()} torch threads, {args.rounds} rounds (medians)\n")

    if "ner" in parts:
        for ratio in sorted({args.pieces_per_word, 1.15, 1.45}):
            batches = conll_shaped_batches(ratio)
            pieces = sum(int((label != -100).sum()) for _, label in batches)
            seconds = statistics.median(ner_evaluation_host_seconds(batches) for _ in range(args.rounds))
            chosen = "  <- calibration" if ratio == args.pieces_per_word else ""
            print(
                f"NER evaluation host work, {ratio:.2f} pieces/word ({pieces:,} labelled): {seconds:.3f} s{chosen}"
            )

    if "packed" in parts:
        seconds = statistics.median(packed_loading_host_seconds() for _ in range(args.rounds))
        print(f"Packed BERT evaluation data loading, {PACKED_BATCHES_TIMED} batches of {PACKS_PER_CALL:,} packs: "
              f"{seconds:.3f} s ({seconds / PACKED_BATCHES_TIMED:.3f} s a batch)  <- calibration")  # fmt: skip

    if "output" in parts:
        rates = {
            "fresh tensor, 4 KiB pages": output_write_rate(True, args.rounds),
            "fresh tensor, transparent huge pages": huge_page_write_rate(args.rounds),
            "warm tensor (a plain copy)": output_write_rate(False, args.rounds),
        }
        print(f"\nWriting one RoBERTa MLM call's logits ({MLM_OUTPUT_BYTES / 1e6:.0f} MB) on the host:")
        for name, rate in rates.items():
            print(f"  {name:<38} {1e3 * MLM_OUTPUT_BYTES / rate:6.1f} ms  {rate / 1e9:5.2f} GB/s")
        print(
            f"host_copy_bandwidth range for the fit: {min(rates.values()) / 1e9:.2f}-{max(rates.values()) / 1e9:.2f} GB/s"
        )


if __name__ == "__main__":
    main()
