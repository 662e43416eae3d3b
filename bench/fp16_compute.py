"""Cost of emulated fp16 compute on a CPU, per block of micro-batches through BERT encoder layers.

An IPU-style device iteration runs GA micro-batches' forwards and backwards on unchanged weights.
These runs of the same layers and micro-batches are interleaved over several rounds:

- `fp32`: the layers in fp32, no mode (the speed emulation aims at);
- `per-op`: fp16 layers under `FP32Partials()` with no weights declared: every forward of every
  micro-batch copies its fp16 weights to fp32 again (its backward reads that copy);
- `per-block`: the same under `FP32Partials(weights)`, as the trainer runs it: each weight of
  `CACHED_WEIGHT_ELEMENTS` or more is copied once for the block.

Small micro-batches with wide layers (the IPU configs' micro-batch 1 at BERT-base or -large width)
are where the weights outweigh the activations, so where the per-block copy matters. The CPU's name
comes first: a timing holds only for its CPU.

    python bench/fp16_compute.py [--hidden 768] [--micro-batch 1] [--seq-len 128] [--ga 8] [--rounds 5]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python bench/fp16_compute.py   # a common AVX2 CPU
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from machine import cpu_description
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertLayer

from optimum_ipu.runtime.fp16_compute import FP32Partials


def block_seconds(layers: torch.nn.ModuleList, inputs: list[torch.Tensor], mode) -> float:
    """Seconds of every micro-batch's forward and backward through `layers` inside `mode`."""
    start = time.perf_counter()
    with mode:
        for x in inputs:
            hidden = x
            for layer in layers:
                out = layer(hidden)
                hidden = out[0] if isinstance(out, tuple) else out
            hidden.float().sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--hidden", type=int, default=768, help="layer width (768 BERT-base, 1024 BERT-large)"
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--ga", type=int, default=8, help="micro-batches per block (gradient accumulation)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians over them")
    args = parser.parse_args()
    print(cpu_description())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.layers} BERT layers of width "
          f"{args.hidden}, micro-batch {args.micro_batch} x seq {args.seq_len}, {args.ga} micro-batches per block, "
          f"{args.rounds} interleaved rounds (dropout off)")  # fmt: skip
    torch.manual_seed(0)
    config = BertConfig(hidden_size=args.hidden, num_attention_heads=args.hidden // 64,
                        intermediate_size=4 * args.hidden, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    config._attn_implementation = "sdpa"  # as in a whole model (torch's attention kernel)
    fp32 = torch.nn.ModuleList(BertLayer(config) for _ in range(args.layers))
    fp16 = torch.nn.ModuleList(BertLayer(config) for _ in range(args.layers))
    fp16.load_state_dict(fp32.state_dict())
    fp16.half()
    shape = (args.micro_batch, args.seq_len, args.hidden)
    inputs32 = [torch.randn(shape).requires_grad_() for _ in range(args.ga)]
    inputs16 = [x.detach().half().requires_grad_() for x in inputs32]
    runs = {
        "fp32": (fp32, inputs32, contextlib.nullcontext),
        "per-op": (fp16, inputs16, FP32Partials),
        "per-block": (fp16, inputs16, lambda: FP32Partials(fp16.parameters())),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds + 1):  # the first round warms up and is not counted
        for name, (layers, inputs, mode) in runs.items():
            times[name].append(block_seconds(layers, inputs, mode()))
    medians = {name: statistics.median(t[1:]) for name, t in times.items()}
    print(f"{'run':<10} {'s/block':>8} {'vs fp32':>8} {'vs per-op':>10}")
    for name, seconds in medians.items():
        print(
            f"{name:<10} {seconds:>8.3f} {medians['fp32'] / seconds:>8.2f} {medians['per-op'] / seconds:>10.2f}"
        )


if __name__ == "__main__":
    main()
