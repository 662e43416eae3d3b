"""`sacrebleu`, as `evaluate.load("sacrebleu")` returns it, computed by the sacrebleu package.

Corpus BLEU (0-100) of the predictions against one or several references per prediction, with
sacrebleu's defaults (13a tokenization, exponential smoothing), and the numbers behind it: matched
and total n-grams of orders 1 to 4, their precisions, the brevity penalty and the two lengths.
Every prediction needs the same number of references, as sacrebleu reads them as parallel streams
(the first reference of every prediction, then the second, ...).
"""

from __future__ import annotations

import datasets
import evaluate

from optimum_ipu.launcher.metrics._info import metric_info

__all__ = ["Sacrebleu"]


class Sacrebleu(evaluate.Metric):
    """`sacrebleu`: corpus BLEU of predictions against their references (needs the sacrebleu package)."""

    def _info(self):
        text = datasets.Value("string", id="sequence")
        return metric_info(
            self,
            [datasets.Features({"predictions": text, "references": datasets.Sequence(text, id="references")}),
             datasets.Features({"predictions": text, "references": text})],
            "predictions, references (one string or a list of strings per prediction); smooth_method='exp', "
            "smooth_value=None, force=False, lowercase=False, tokenize=None, use_effective_order=False",
            "{'score': BLEU 0-100, 'counts', 'totals', 'precisions' (n-gram orders 1-4), 'bp', 'sys_len', 'ref_len'}",
        )  # fmt: skip

    def _compute(self, predictions, references, smooth_method="exp", smooth_value=None, force=False,
                 lowercase=False, tokenize=None, use_effective_order=False):  # fmt: skip
        import sacrebleu

        per_prediction = [[r] if isinstance(r, str) else list(r) for r in references]
        width = len(per_prediction[0]) if per_prediction else 0
        uneven = sorted({len(r) for r in per_prediction} - {width})
        if uneven:
            raise ValueError(
                f"sacrebleu: every prediction needs the same number of references; the first has {width}, others "
                f"have {uneven}. Give each prediction {width} reference(s)."
            )
        streams = [[refs[i] for refs in per_prediction] for i in range(width)]
        options = {"tokenize": tokenize} if tokenize else {}
        bleu = sacrebleu.corpus_bleu(
            predictions, streams, smooth_method=smooth_method, smooth_value=smooth_value, force=force,
            lowercase=lowercase, use_effective_order=use_effective_order, **options,
        )  # fmt: skip
        return {
            "score": bleu.score,
            "counts": bleu.counts,
            "totals": bleu.totals,
            "precisions": bleu.precisions,
            "bp": bleu.bp,
            "sys_len": bleu.sys_len,
            "ref_len": bleu.ref_len,
        }
