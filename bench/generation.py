"""Generation on the simulated IPU against transformers' `generate()`, same model, inputs and tokens.

For each model shape (random weights, fp32, eval mode) and each search (greedy; beam search with
`--beams` beams), these runs are interleaved over `--rounds` rounds on the same machine:

- `generate()`: transformers' `model.generate()` on the plain model (its default dynamic KV cache);
- `ipu static`: the same model placed for inference on a 2-IPU pipeline (`to_pipelined(...)
  .parallelize()`, the IPU config's inference layout), generating in the IPU's form
  (`optimum_ipu.generation.static_generation`: a KV cache of fixed size, one decoder call per token);
  this is what `IPUSeq2SeqTrainer` runs with `--predict_with_generate --static_generation`;
- `ipu dynamic`: the placed model with transformers' default cache (what `IPUSeq2SeqTrainer` runs
  without `--static_generation`), to tell the placement's cost from the static cache's;
- `Seq2SeqTrainer.predict` and `IPUSeq2SeqTrainer.predict` (unless `--no-trainer`): what a script
  runs with `--predict_with_generate`, the evaluation loss and the generation of the same samples in
  one evaluation batch; transformers' trainer on the plain model, ours fp32 on the 2-IPU layout with
  `static_generation=True` (its inference executable computes the loss), compared with each other.

Every run generates `--batch` sources of `--source-length` tokens up to `--max-length` tokens
(`min_length` = `max_length`, so no sequence ends early and each run does the same decoder calls);
the tokens of every run are checked equal to `generate()`'s (the trainers' to each other) before
timing. One warm-up call per run (the static cache is allocated there, as an IPU compiles once),
then per round one timed call of each run. Printed: the CPU, and for each run the median seconds
per call, tokens/s and `ref / run`, the reference being `generate()` for the first three and
`Seq2SeqTrainer.predict` for the last two (1.0 = as fast as transformers; the target for `ipu
static` is >= 0.8, issue 25), in the CPU time of this process (`time.process_time`: with one torch
thread, the work done, which other processes on a shared machine disturb much less) and in
wall-clock time.

    OMP_NUM_THREADS=1 python bench/generation.py [--rounds 5] [--models t5-small,bart-base]
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import time
from collections.abc import Callable

import torch
from machine import cpu_description
from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

from optimum_ipu import IPUConfig
from optimum_ipu.generation import static_generation
from optimum_ipu.pipelining import to_pipelined

# The shapes of t5-small and facebook/bart-base (random weights: the speed does not depend on them).
MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "t5-small": lambda: T5ForConditionalGeneration(T5Config(
        vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, pad_token_id=0,
        eos_token_id=1, decoder_start_token_id=0,
    )),
    "bart-base": lambda: BartForConditionalGeneration(BartConfig(
        vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
        decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, max_position_embeddings=1024,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
    )),
}  # fmt: skip


def placed(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` placed for inference on 2 IPUs (encoder layers, then decoder layers, split evenly)."""
    copied = copy.deepcopy(model)
    to_pipelined(copied, IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2).eval()).parallelize()
    return copied


def static(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    def generate(**kwargs) -> torch.Tensor:
        with static_generation(model):
            return model.generate(**kwargs)

    return generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--models", default="t5-small,bart-base", help=f"comma-separated, of {', '.join(MODELS)}"
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--source-length", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=32, help="tokens generated, decoder start included")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--no-trainer", action="store_true", help="leave out the trainers' predict() runs")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    print(cpu_description(), f"{torch.get_num_threads()} torch threads, torch {torch.__version__}")
    print(f"fp32, batch {args.batch}, sources of {args.source_length} tokens, {args.max_length} tokens generated; "
          f"{args.rounds} interleaved rounds, one generate() call per run and round")  # fmt: skip
    print(f"{'':<45} {'CPU time of this process':^29} {'wall clock':^19}")
    print(f"{'model':<10} {'search':<7} {'run':<26} {'s/call':>9} {'tokens/s':>9} {'ref/run':>9} {'s/call':>9} "
          f"{'ref/run':>9}")  # fmt: skip
    for key in args.models.split(","):
        torch.manual_seed(0)
        model = MODELS[key]().eval()
        g = torch.Generator().manual_seed(1)
        sources = torch.randint(4, model.config.vocab_size, (args.batch, args.source_length), generator=g)
        targets = torch.randint(4, model.config.vocab_size, (args.batch, args.max_length - 1), generator=g)
        ipu_model = placed(model)
        for search, beams in (("greedy", 1), ("beam", args.beams)):
            generation = dict(max_length=args.max_length, min_length=args.max_length, num_beams=beams)
            kwargs = dict(
                input_ids=sources, attention_mask=torch.ones_like(sources), do_sample=False, **generation
            )
            groups = {
                "generate()": {"generate()": model.generate, "ipu static": static(ipu_model),
                               "ipu dynamic": ipu_model.generate},
            }  # fmt: skip
            if not args.no_trainer:
                groups["predict"] = trainer_runs(model, sources, targets, args.batch, generation)
            with torch.inference_mode():
                expected = model.generate(**kwargs)
                for name, run in groups["generate()"].items():  # warm-up, and the same tokens
                    if not torch.equal(run(**kwargs), expected):
                        raise AssertionError(f"{key} {search}: {name} generated other tokens than generate()")
            if "predict" in groups:  # warm-up (the IPU trainer compiles), and the same predictions
                plain, ipu = (run() for run in groups["predict"].values())
                if not (plain.shape == ipu.shape and (plain == ipu).all()):
                    raise AssertionError(f"{key} {search}: IPUSeq2SeqTrainer predicted other tokens")
            times = {name: [] for runs in groups.values() for name in runs}
            for _ in range(args.rounds):
                for group, runs in groups.items():
                    for name, run in runs.items():
                        wall, cpu = time.perf_counter(), time.process_time()
                        with torch.inference_mode():
                            run(**kwargs) if group == "generate()" else run()
                        times[name].append((time.process_time() - cpu, time.perf_counter() - wall))
            tokens = args.batch * (args.max_length - 1)
            for runs in groups.values():
                medians = {name: [statistics.median(column) for column in zip(*times[name])] for name in runs}
                cpu_reference, wall_reference = next(iter(medians.values()))
                for name, (cpu, wall) in medians.items():
                    print(f"{key:<10} {search:<7} {name:<26} {cpu:9.3f} {tokens / cpu:9.1f} {cpu_reference / cpu:9.2f} "
                          f"{wall:9.3f} {wall_reference / wall:9.2f}")  # fmt: skip


def trainer_runs(model, sources, targets, batch: int, generation: dict) -> dict[str, Callable[[], object]]:
    """`predict()` of transformers' Seq2SeqTrainer and of IPUSeq2SeqTrainer (fp32, 2 IPUs, static generation) on
    the same samples, in one evaluation batch: the loss and the generated tokens."""
    import tempfile

    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from optimum_ipu import IPUSeq2SeqTrainer, IPUSeq2SeqTrainingArguments

    samples = [
        {"input_ids": s, "attention_mask": torch.ones_like(s), "labels": t} for s, t in zip(sources, targets)
    ]
    common = dict(output_dir=tempfile.mkdtemp(), per_device_eval_batch_size=batch, predict_with_generate=True,
                  report_to="none", use_cpu=True)  # fmt: skip
    plain = Seq2SeqTrainer(model, Seq2SeqTrainingArguments(**common))
    ipu_args = IPUSeq2SeqTrainingArguments(fp32=True, static_generation=True, **common)
    ipu = IPUSeq2SeqTrainer(
        copy.deepcopy(model), IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2), ipu_args
    )
    return {
        "Seq2SeqTrainer.predict": lambda: plain.predict(samples, **generation).predictions,
        "IPUSeq2SeqTrainer.predict": lambda: ipu.predict(samples, **generation).predictions,
    }


if __name__ == "__main__":
    main()
