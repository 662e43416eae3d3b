"""An `IPUTrainer` for extractive QA: evaluation scores answers, not logits.

A QA model predicts start/end logits per *feature* (context window), but SQuAD is scored per
*example* on answer text. So `evaluate` and `predict` here run the ordinary prediction loop of the
IPU trainer (sharded inference on the simulated IPUs) without metrics, turn the logits into answers
with a post-processing function, and only then apply ``compute_metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from transformers.trainer_utils import EvalPrediction, PredictionOutput

from optimum_ipu import IPUTrainer

# Columns of evaluation features that post-processing needs but the model must not receive.
POSTPROCESSING_COLUMNS = ("example_id", "offset_mapping", "cls_index")


class QuestionAnsweringIPUTrainer(IPUTrainer):
    """`IPUTrainer` whose evaluate/predict post-process features into answers before scoring.

    Args:
        eval_examples: the raw evaluation examples (``id``, ``context``, ``answers``) that
            ``eval_dataset`` (their features) was made from.
        post_process_function: ``(examples, features, (start_logits, end_logits), stage) ->
            EvalPrediction`` whose ``predictions`` / ``label_ids`` are what ``compute_metrics`` takes.
        *args, **kwargs: as for `IPUTrainer` (model, ipu_config, args, ..., compute_metrics).
    """

    def __init__(self, *args, eval_examples=None,
                 post_process_function: Callable[..., EvalPrediction] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_process_function = post_process_function

    def _predict_logits(self, features, ignore_keys, metric_key_prefix: str) -> PredictionOutput:
        """Run the IPU prediction loop on the model's columns only, with metrics switched off."""
        model_inputs = features.remove_columns([c for c in POSTPROCESSING_COLUMNS if c in features.column_names])
        compute_metrics, self.compute_metrics = self.compute_metrics, None
        try:
            return super().predict(model_inputs, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        finally:
            self.compute_metrics = compute_metrics

    def _score(self, examples, features, output: PredictionOutput, stage: str,
               metric_key_prefix: str) -> tuple[EvalPrediction | None, dict[str, float]]:
        metrics = dict(output.metrics or {})
        if self.post_process_function is None:
            return None, metrics
        started = time.time()
        answers = self.post_process_function(examples, features, output.predictions, stage)
        if self.compute_metrics is not None and answers.label_ids is not None:
            for key, value in self.compute_metrics(answers).items():
                name = key if key.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{key}"
                metrics[name] = value
        metrics[f"{metric_key_prefix}_postprocessing_seconds"] = round(time.time() - started, 3)
        return answers, metrics

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Predict on the evaluation features, post-process into answers, score, log and return metrics."""
        features = self.eval_dataset if eval_dataset is None else eval_dataset
        examples = self.eval_examples if eval_examples is None else eval_examples
        if features is None or examples is None:
            raise ValueError("QA evaluation needs both the evaluation features and the examples they came from "
                             "(pass eval_dataset= and eval_examples=).")
        output = self._predict_logits(features, ignore_keys, metric_key_prefix)
        _, metrics = self._score(examples, features, output, metric_key_prefix, metric_key_prefix)
        if self.state.epoch is not None:
            metrics["epoch"] = self.state.epoch
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, predict_dataset, predict_examples=None, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """Predict answers for ``predict_examples`` from their features; score them if they have answers.

        Without ``predict_examples`` this is the plain IPU prediction loop (logits, no post-processing).
        """
        if predict_examples is None:
            return super().predict(predict_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        output = self._predict_logits(predict_dataset, ignore_keys, metric_key_prefix)
        answers, metrics = self._score(predict_examples, predict_dataset, output, "predict", metric_key_prefix)
        if answers is None:
            return output
        return PredictionOutput(predictions=answers.predictions, label_ids=answers.label_ids, metrics=metrics)
