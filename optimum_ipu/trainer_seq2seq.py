"""`IPUSeq2SeqTrainer`: transformers' Seq2SeqTrainer on the simulated IPU.

Both parents are reused, not copied: `IPUSeq2SeqTrainer(IPUTrainer, Seq2SeqTrainer)` trains exactly as
`IPUTrainer` does (combined batches, the pipelined model, the runtime's executables, the same
checkpoints), and evaluates as transformers' `Seq2SeqTrainer` does. With `predict_with_generate`,
its documented `prediction_step` hook generates with `model.generate()` (greedy or beam search, up to
`generation_max_length` / `generation_num_beams`, or the model's generation config), pads the tokens
as transformers does, and hands them to `compute_metrics`; the loss beside them is computed by the
IPU's inference executable, as `IPUTrainer` computes every evaluation loss.

`generate()` runs on the placed model, laid out for inference (the IPU config's `inference_*`
values), under the same fp16 compute as the rest of the evaluation. It is transformers' own decoding
loop, so the tokens are transformers' tokens; see `optimum_ipu.generation` for the IPU's fixed-length
form (a static KV cache, one decoder call per token).
"""

from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass, field
from typing import Any

from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from optimum_ipu.runtime.fp16_compute import fp16_compute_context
from optimum_ipu.trainer import IPUTrainer
from optimum_ipu.training_args import IPUTrainingArguments

__all__ = ["IPUSeq2SeqTrainer", "IPUSeq2SeqTrainingArguments"]


@dataclass
class IPUSeq2SeqTrainingArguments(IPUTrainingArguments, Seq2SeqTrainingArguments):
    """`IPUTrainingArguments` plus transformers' sequence-to-sequence fields, each also a `--flag`:
    `predict_with_generate`, `generation_max_length`, `generation_num_beams`, `generation_config`
    (and `sortish_sampler`, accepted as transformers accepts it). It is a `Seq2SeqTrainingArguments` too.
    """

    static_generation: bool = field(
        default=False,
        metadata={
            "help": "With --predict_with_generate, generate as the IPU does: a fixed number of decoder calls "
            "(generation_max_length) with a fixed-size KV cache; the tokens equal transformers' generate()."
        },
    )

    def __post_init__(self) -> None:
        """transformers' checks, and `--generation_num_beams` an integer >= 1 (beam search divides by it)."""
        if self.generation_num_beams is not None and not _is_beam_count(self.generation_num_beams):
            raise ValueError(
                "--generation_num_beams must be an integer >= 1 (1 is greedy decoding, more is beam search), got "
                f"{self.generation_num_beams!r}; leave it out to use the model's generation config."
            )
        super().__post_init__()


def _is_beam_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _check_num_beams(gen_kwargs: dict[str, Any], call: str) -> None:
    """Refuse a `num_beams` keyword that is not an integer >= 1 before any sample is evaluated.

    transformers' `generate()` divides by it deep in beam search (`num_beams=0` is a bare
    ZeroDivisionError there), or fails on a tensor shape for a negative or fractional one.
    """
    beams = gen_kwargs.get("num_beams")
    if beams is not None and not _is_beam_count(beams):
        raise ValueError(
            f"{call}(num_beams={beams!r}): the number of beams of generation must be an integer >= 1 (1 is greedy "
            "decoding, more is beam search); pass num_beams=1 or more, or leave it out to use "
            "--generation_num_beams or the model's generation config."
        )


class IPUSeq2SeqTrainer(IPUTrainer, Seq2SeqTrainer):
    """A transformers `Seq2SeqTrainer` whose training and evaluation run on a simulated IPU system.

    Takes `IPUTrainer`'s arguments (`model`, `ipu_config`, `args`, `tokenizer=`, every `Trainer`
    keyword) with `IPUSeq2SeqTrainingArguments`. `evaluate()` and `predict()` accept transformers'
    generation keywords (`max_length`, `num_beams`, any `generate()` keyword) as `Seq2SeqTrainer`'s do.
    """

    def __init__(self, model=None, ipu_config=None, args: IPUSeq2SeqTrainingArguments | None = None, *positional,
                 **kwargs):  # fmt: skip
        if args is None:
            args = IPUSeq2SeqTrainingArguments(output_dir="tmp_trainer")
        if not isinstance(args, IPUSeq2SeqTrainingArguments):
            raise TypeError(
                f"IPUSeq2SeqTrainer needs IPUSeq2SeqTrainingArguments, got {type(args).__name__}: build "
                "`IPUSeq2SeqTrainingArguments(...)` with the same fields (it accepts every IPUTrainingArguments "
                "and Seq2SeqTrainingArguments field)."
            )
        super().__init__(model, ipu_config, args, *positional, **kwargs)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", **gen_kwargs):
        """`Seq2SeqTrainer.evaluate`, with the generation keywords checked first (see `_check_num_beams`)."""
        _check_num_beams(gen_kwargs, "evaluate")
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
                                **gen_kwargs)  # fmt: skip

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test", **gen_kwargs):
        """`Seq2SeqTrainer.predict`, with the generation keywords checked first (see `_check_num_beams`)."""
        _check_num_beams(gen_kwargs, "predict")
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
                               **gen_kwargs)  # fmt: skip

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """`IPUTrainer`'s sharded evaluation step; with `predict_with_generate`, the generated tokens
        (padded to the generation's maximum length) are the predictions, as in `Seq2SeqTrainer`."""
        if gen_kwargs:
            self._gen_kwargs = {**getattr(self, "_gen_kwargs", {}), **gen_kwargs}
        generating = self.args.predict_with_generate and not prediction_loss_only
        with self._generation_context() if generating else contextlib.nullcontext():
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    @contextlib.contextmanager
    def _generation_context(self):
        """`generate()` runs in the evaluation's fp16 compute (the executable computing the loss enters
        it again: a no-op inside), and in the IPU's static form when asked."""
        with contextlib.ExitStack() as stack:
            if self.fp16_compute is not None:
                stack.enter_context(fp16_compute_context(self.fp16_compute, self.model.parameters()))
            if self.args.static_generation:
                from optimum_ipu.generation import static_generation

                stack.enter_context(static_generation(self.model))
            yield
