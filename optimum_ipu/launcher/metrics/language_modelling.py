"""`perplexity` and `rouge`, as `evaluate.load(...)` returns them.

`perplexity` scores texts with a causal language model that `compute(model_id=...)` loads with
`AutoModelForCausalLM.from_pretrained(model_id)`: a local folder works offline, a Hub id needs the
Hub (or its cache). Per text: exp of the mean token cross-entropy of each next token given the
previous ones (with a BOS token prepended when `add_start_token=True`), over the text's own tokens
(padding masked out); `mean_perplexity` is the plain mean over texts.

`rouge` needs Google's `rouge_score` package (`pip install rouge-score`), which computes the scores:
the F-measure of `rouge1`, `rouge2`, `rougeL` and `rougeLsum`, aggregated by its bootstrap (the
median of resampled means) or one list per type with `use_aggregator=False`.
"""

from __future__ import annotations

import datasets
import evaluate
import numpy as np

from optimum_ipu.launcher._report import LauncherError
from optimum_ipu.launcher.metrics._info import metric_info

__all__ = ["Perplexity", "Rouge"]


def _load_causal_lm(model_id: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        return AutoModelForCausalLM.from_pretrained(model_id), AutoTokenizer.from_pretrained(model_id)
    except OSError as error:
        raise LauncherError(
            f"perplexity: could not load model_id={model_id!r} ({str(error).splitlines()[0]}). The metric runs that "
            "causal language model itself: give a local folder saved with save_pretrained (model and tokenizer), or "
            "a Hub id that is in the local cache, or run with the Hub reachable."
        ) from None


class Perplexity(evaluate.Metric):
    """`perplexity`: how well the causal LM `model_id` predicts each text (lower is better)."""

    def _info(self):
        return metric_info(
            self, datasets.Features({"predictions": datasets.Value("string")}),
            "predictions (texts), model_id; batch_size=16, add_start_token=True, device=None, max_length=None",
            "{'perplexities': [float per text], 'mean_perplexity': float}", module_type="metric",
        )  # fmt: skip

    def _compute(self, predictions, model_id, batch_size: int = 16, add_start_token: bool = True, device=None,
                 max_length=None):  # fmt: skip
        import torch

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device not in ("gpu", "cpu", "cuda"):
            raise ValueError(f"perplexity: device must be 'cpu', 'gpu' or 'cuda', got {device!r}.")
        device = "cuda" if device == "gpu" else device
        model, tokenizer = _load_causal_lm(model_id)
        model = model.to(device).eval()
        if tokenizer.pad_token is None and batch_size > 1:
            special = list(tokenizer.special_tokens_map_extended.values())
            if not special:
                raise ValueError(
                    "perplexity: with batch_size > 1 the tokenizer needs a special token to pad with."
                )
            tokenizer.add_special_tokens({"pad_token": special[0]})
        if add_start_token and max_length and tokenizer.bos_token is None:
            raise ValueError("perplexity: add_start_token=True needs a tokenizer with a BOS token.")
        budget = max_length - 1 if add_start_token and max_length else max_length
        encoded = tokenizer(predictions, add_special_tokens=False, padding=True, truncation=bool(budget),
                            max_length=budget, return_tensors="pt", return_attention_mask=True).to(device)  # fmt: skip
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        shortest = 1 if add_start_token else 2
        if not bool(torch.all(mask.sum(1) >= shortest)):
            raise ValueError(f"perplexity: every text must be at least {shortest} token(s) long.")
        loss = torch.nn.CrossEntropyLoss(reduction="none")
        perplexities: list[float] = []
        for start in range(0, len(ids), batch_size):
            batch, batch_mask = ids[start : start + batch_size], mask[start : start + batch_size]
            if add_start_token and tokenizer.bos_token_id is not None:
                bos = torch.full((len(batch), 1), tokenizer.bos_token_id, dtype=batch.dtype, device=device)
                batch = torch.cat([bos, batch], dim=1)
                batch_mask = torch.cat([torch.ones_like(bos, dtype=torch.int64), batch_mask], dim=1)
            with torch.no_grad():
                logits = model(batch, attention_mask=batch_mask).logits
            # each position predicts the next token; padding is masked out of the mean
            token_loss = loss(logits[:, :-1].transpose(1, 2), batch[:, 1:])
            weights = batch_mask[:, 1:]
            perplexities += torch.exp((token_loss * weights).sum(1) / weights.sum(1)).tolist()
        return {"perplexities": perplexities, "mean_perplexity": np.mean(perplexities)}


class _CallableTokenizer:
    """rouge_score wants an object with `tokenize(text)`; users pass a function."""

    def __init__(self, function):
        self.function = function

    def tokenize(self, text):
        return self.function(text)


def rouge_features() -> list[datasets.Features]:
    """The Hub rouge's inputs: one reference per prediction, or a list of them."""
    text = datasets.Value("string", id="sequence")
    return [datasets.Features({"predictions": text, "references": datasets.Sequence(text)}),
            datasets.Features({"predictions": text, "references": text})]  # fmt: skip


def rouge_scores(predictions, references, rouge_types=None, use_stemmer=False, tokenizer=None) -> list[dict]:
    """rouge-score's `Score`s (precision, recall, F-measure) of each prediction, by rouge type; a list of references
    per prediction is scored against the best of them (`score_multi`)."""
    from rouge_score import rouge_scorer

    rouge_types = rouge_types or ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    scorer = rouge_scorer.RougeScorer(rouge_types=rouge_types, use_stemmer=use_stemmer,
                                      tokenizer=_CallableTokenizer(tokenizer) if tokenizer else None)  # fmt: skip
    several = isinstance(references[0], list)
    return [scorer.score_multi(r, p) if several else scorer.score(r, p) for r, p in zip(references, predictions)]


def rouge_aggregate(scores: list[dict]) -> dict:
    """rouge-score's bootstrap `AggregateScore` (low, mid, high) of each rouge type over `scores`."""
    from rouge_score import scoring

    aggregator = scoring.BootstrapAggregator()
    for score in scores:
        aggregator.add_scores(score)
    return aggregator.aggregate()


class Rouge(evaluate.Metric):
    """`rouge`: ROUGE F-measures of predictions against one or several references (needs rouge-score)."""

    def _info(self):
        return metric_info(
            self, rouge_features(),
            "predictions, references; rouge_types=None, use_aggregator=True, use_stemmer=False, tokenizer=None",
            "{'rouge1', 'rouge2', 'rougeL', 'rougeLsum'}: float each (lists with use_aggregator=False)",
        )  # fmt: skip

    def _compute(self, predictions, references, rouge_types=None, use_aggregator=True, use_stemmer=False,
                 tokenizer=None):  # fmt: skip
        scores = rouge_scores(predictions, references, rouge_types, use_stemmer, tokenizer)
        if not use_aggregator:
            return {key: [score[key].fmeasure for score in scores] for key in scores[0]}
        return {key: value.mid.fmeasure for key, value in rouge_aggregate(scores).items()}
