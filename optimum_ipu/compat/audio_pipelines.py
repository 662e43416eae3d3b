"""Audio pipelines (audio classification, speech recognition) with the model on the simulated IPU.

transformers' own `AudioClassificationPipeline` and `AutomaticSpeechRecognitionPipeline`: reading and
resampling the audio, the feature extractor, chunking (`chunk_length_s`, `stride_length_s`) and the
decoding of tokens are unchanged, so the answers are those of `transformers.pipeline(task)` on the
same model (up to fp16 rounding with `fp16=True`). What moves:

- audio classification, and speech recognition with a CTC model (Wav2Vec2, HuBERT): each forward is
  one host call of the pipeline's `IPUInference` (sharded inference through the placed stages);
- speech recognition with Whisper: transformers' `generate` runs on the placed model, every step's
  forward with the IPU's fp16 arithmetic (the decoding loop itself on the host; Optimum Graphcore ran
  it on the device).
"""

from __future__ import annotations

from transformers import AudioClassificationPipeline, AutomaticSpeechRecognitionPipeline

from optimum_ipu.compat.text_pipelines import ForwardOnIPU

__all__ = ["IPUAudioClassificationPipeline", "IPUAutomaticSpeechRecognitionPipeline"]


class IPUAudioClassificationPipeline(ForwardOnIPU, AudioClassificationPipeline):
    """transformers' audio-classification pipeline, each forward one host call on the simulated IPU."""


class IPUAutomaticSpeechRecognitionPipeline(ForwardOnIPU, AutomaticSpeechRecognitionPipeline):
    """transformers' automatic-speech-recognition pipeline on the simulated IPU (CTC models and Whisper)."""

    def _forward(self, model_inputs, **kwargs):
        if self.ipu is None or self.type in ("ctc", "ctc_with_lm"):
            return super()._forward(model_inputs, **kwargs)  # the model call is one host call
        with self.ipu.generating(model_inputs):
            return AutomaticSpeechRecognitionPipeline._forward(self, model_inputs, **kwargs)
