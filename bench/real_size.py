"""Real sizes: each bundled config's published layout compiled at its real size, and GPT-2 checked there.

    python bench/real_size.py                # compile times and verdicts, then GPT-2's checks
    python bench/real_size.py --compile-only # the compile part only (about a minute)
    python bench/real_size.py --gpt2 medium  # compile times, then GPT-2-medium's checks only

1. **Compile.** The cases of `tests/test_real_sizes.py` (a command Graphcore published for every
   bundled config, the real architecture with uninitialised weights): IPUTrainer's compile time with
   `compile_only`, taken from the trainer (the model's construction apart), the peak IPU against the
   limit and the memory model's verdict. Target: every case under 10 s on this CPU.
2. **GPT-2 and GPT-2-medium** with `Graphcore/gpt2-small-ipu` and `gpt2-medium-ipu` (embedding
   serialization 4 and 5, which the vocabulary of 50,257 divides by neither), real architecture, random
   weights, fp32 and SGD so that results compare to rounding, short sequences (32 tokens) to keep a step
   within minutes on a CPU:
   * one training step of IPUTrainer (the config's layout, gradient accumulation and device
     iterations; gpt2-medium at the published GA 256, as its GA 16 is below its pipeline's 2S-1 = 17)
     against transformers' Trainer on the same samples: the largest weight difference;
   * evaluation: the logits (of the original vocabulary size) and the loss against the plain model's;
   * generation: `optimum.graphcore.pipeline("text-generation")` against `transformers.pipeline`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _cases_module():
    spec = importlib.util.spec_from_file_location("real_size_cases", ROOT / "tests" / "test_real_sizes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_times() -> list[tuple[str, float, float, str]]:
    cases = _cases_module()
    rows = []
    for name in sorted(cases.CASES):
        with tempfile.TemporaryDirectory() as folder:
            trainer, settings = cases.compile_at_real_size(name, folder)
        memory = trainer.compile_report.memory
        peak = memory.peak
        seconds = trainer.compile_seconds
        rows.append((name, seconds, peak.total / memory.capacity, memory.verdict(peak)))
        print(f"{name:<36} {settings['id']:<58} compile {seconds:5.2f} s   peak {100 * peak.total / memory.capacity:4.0f}%"
              f" ({memory.verdict(peak)})", flush=True)  # fmt: skip
    return rows


def _gpt2(medium: bool, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    size = dict(n_embd=1024, n_layer=24, n_head=16) if medium else {}
    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **size)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


class _Blocks(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int = 32, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 50257, (n, length), generator=g)
        self.labels = self.ids.clone()
        self.labels[:, 0] = -100  # keeps transformers' Trainer exact (see tests/test_model_families.py)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def gpt2_checks(medium: bool) -> None:
    from transformers import Trainer, TrainingArguments

    from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

    name = "Graphcore/gpt2-medium-ipu" if medium else "Graphcore/gpt2-small-ipu"
    overrides = dict(gradient_accumulation_steps=256, device_iterations=1) if medium else {}
    config = IPUConfig.from_pretrained(name, **overrides)
    per_call = config.gradient_accumulation_steps * config.device_iterations
    updates = config.device_iterations
    data = _Blocks(per_call)
    label = "gpt2-medium" if medium else "gpt2"
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        ipu_model = _gpt2(medium)
        args = IPUTrainingArguments(output_dir=folder + "/ipu", per_device_train_batch_size=1, fp32=True, optim="sgd",
                                    learning_rate=0.01, max_steps=1, lr_scheduler_type="constant", report_to="none",
                                    save_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=7)  # fmt: skip
        ipu = IPUTrainer(ipu_model, config, args, train_dataset=data)
        ipu.train()
        ipu_seconds = time.perf_counter() - start
        start = time.perf_counter()
        plain_model = _gpt2(medium)
        # The same micro-batch (1 block) accumulated to the same update: the ratio of the two times is what
        # the simulated IPU adds (recomputation included). One batch of 256 blocks would need 24 GB here.
        plain_args = TrainingArguments(output_dir=folder + "/plain", per_device_train_batch_size=1,
                                       gradient_accumulation_steps=per_call // updates, learning_rate=0.01,
                                       max_steps=updates, lr_scheduler_type="constant", optim="sgd", report_to="none",
                                       save_strategy="no", use_cpu=True, seed=7)  # fmt: skip
        Trainer(plain_model, plain_args, train_dataset=data).train()
        plain_seconds = time.perf_counter() - start
    worst = max((a - b).abs().max().item() for a, b in zip(ipu_model.parameters(), plain_model.parameters()))
    print(f"{label}: one IPUTrainer step ({per_call} micro-batches of 32 tokens, {updates} update(s), "
          f"{ipu_seconds:.0f} s; transformers' Trainer at the same micro-batch {plain_seconds:.0f} s, ratio "
          f"{ipu_seconds / plain_seconds:.2f}): largest weight difference {worst:.2e}")  # fmt: skip

    # Evaluation: logits and loss of the placed model against the plain one, on the same weights.
    output = ipu.predict(_Blocks(8, seed=2))
    plain_model.load_state_dict(ipu_model.state_dict())
    plain_model.eval()
    batch = _Blocks(8, seed=2)
    with torch.no_grad():
        expected = plain_model(input_ids=batch.ids, labels=batch.labels)
    logits = torch.as_tensor(output.predictions)
    print(f"{label}: evaluation logits {tuple(logits.shape)}, largest difference "
          f"{(logits - expected.logits).abs().max().item():.2e}; loss {output.metrics['test_loss']:.6f} vs "
          f"{expected.loss.item():.6f}")  # fmt: skip

    # Generation: greedy tokens through both pipelines.
    import transformers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from optimum.graphcore import pipeline

    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = 50256
    tokenizer = transformers.GPT2TokenizerFast(vocab=vocab, merges=[])
    generator = pipeline(
        "text-generation", model=ipu_model.eval(), tokenizer=tokenizer, ipu_config=name, fp16=False
    )
    plain = transformers.pipeline("text-generation", model=plain_model, tokenizer=tokenizer, device="cpu")
    prompt = "The IPU"
    got = generator(prompt, max_new_tokens=8, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    want = plain(prompt, max_new_tokens=8, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    print(
        f"{label}: generated {len(got) - len(prompt)} tokens, the same as transformers: {list(got) == list(want)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true", help="the compile times only")
    parser.add_argument("--gpt2", choices=["small", "medium", "both"], default="both", help="which GPT-2 to check")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    rows = compile_times()
    slow = [r for r in rows if r[1] >= 10]
    print(
        f"slowest compile {max(r[1] for r in rows):.2f} s; over 10 s: {', '.join(r[0] for r in slow) or 'none'}"
    )
    if not args.compile_only:
        for medium in {"small": (False,), "medium": (True,), "both": (False, True)}[args.gpt2]:
            gpt2_checks(medium)
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
