"""Trace the two programs of an IPU generation: the encoder alone, and one decoder step with its KV cache.

Optimum Graphcore generated with an encoder-decoder model as two Poplar programs on IPUs of their own
(`split_encoder_decoder_ipu_config`): the encoder, run once per batch, and the decoder, run once per
token. With `use_cache=True` (what its `pipeline()` sets) the decoder reads one token per call and
keeps every layer's keys and values in buffers of the maximum length, `(batch x beams, heads,
max_length, head_dim)`, allocated when the model is compiled (`IPUAttentionMixin` in
`optimum/graphcore/generation/attention_mixin.py`). Each call it

* multiplies the caches by 0 or 1 (zeroed at step 0: a static graph runs the multiply every step),
* with beam search, gathers them along the batch by the beams kept (`index_select`, then a copy back),
* writes the new key and value at the step's position as a one-hot matrix product added to the cache
  (Graphcore chose that over a dynamic update or a scatter, which placed tiles badly),
* and attends over all `max_length` positions, those not written yet masked.

`trace_decoder_step` runs transformers' own decoder on the meta device with cache layers that do
exactly those operations, so the profile counts what the IPU runs, priced by the same tracer and
models as every other estimate. The cross-attention keys and values over the encoder's output are
computed again every step (Optimum Graphcore's default, and all BART could do), or, with
`cross_cache=True` (its `use_cross_cache`, T5 and Whisper), read from a cache of the source length
filled once per batch. The encoder's output reaches the decoder through the host with every call,
as it did without `use_encoder_output_buffer`.

This module imports torch and transformers; `decoding.py` prices its results without them.
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import Cache, DynamicLayer, EncoderDecoderCache, StaticLayer
from transformers.modeling_outputs import BaseModelOutput

from optimum_ipu.costmodel.presets import ModelSource, build_meta_model
from optimum_ipu.costmodel.profile import ModelProfile
from optimum_ipu.costmodel.trace import profile_model, sample_inputs_for
from optimum_ipu.pipelining.spec import spec_for
from optimum_ipu.pipelining.stage_plan import build_stage_plan

META = "meta"


def meta_model_and_plan(source: ModelSource):
    """The model of `source` on the meta device and its stage plan over two IPUs (the profile does not
    depend on the IPU count, except for telling a head planned beside the embedding from the others)."""
    model = build_meta_model(source)
    spec = spec_for(model)
    if spec is None or spec.decoder is None:
        raise ValueError(
            f"{source.name} ({source.builder}) is not an encoder-decoder model with a cut spec: generation is "
            "priced for BART, T5, MT5 and Whisper."
        )
    return model, build_stage_plan(model, spec, [-1], 2)


def source_length(model, seq_len: int) -> int:
    """Positions the encoder's output has: `seq_len` source tokens, or Whisper's fixed 30 s window."""
    return int(getattr(model.config, "max_source_positions", 0) or seq_len)


# -- the encoder alone ---------------------------------------------------------------------------------


def _run_encoder_only(self, **inputs):
    return self.get_encoder()(**inputs)


def trace_encoder(source: ModelSource, batch: int, seq_len: int, float_bytes: int) -> ModelProfile:
    """Profile of the encoder program: one forward of the encoder over `batch` sources of `seq_len`
    tokens (Whisper: its 3000 log-mel frames), charged to the model's blocks (the decoder's get nothing).
    """
    model, plan = meta_model_and_plan(source)
    encoder = model.get_encoder()
    accepted = set(inspect.signature(encoder.forward).parameters)
    inputs = {k: v for k, v in sample_inputs_for(model, batch, seq_len).items() if k in accepted}
    # A subclass whose forward stops after the encoder: the tracer copies the model with its class, and the
    # cut spec is still found by model type (the class name is no registered one).
    model.__class__ = type("_EncoderOnly", (type(model),), {"forward": _run_encoder_only})
    return profile_model(model, plan, inputs, training=False, float_bytes=float_bytes)


# -- one decoder step ----------------------------------------------------------------------------------


class _IPUSelfAttentionLayer(StaticLayer):
    """A decoder layer's self-attention cache as Optimum Graphcore's `IPUAttentionMixin` updates it."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, step: int, beam_idx: torch.Tensor | None):
        super().__init__(max_cache_len=keys.shape[2])
        self.keys, self.values = keys, values
        self.batch_size, self.num_heads, _, self.k_head_dim = keys.shape
        self.v_head_dim = values.shape[-1]
        self.device = keys.device
        self.cumulative_length = torch.tensor(step)  # positions written so far (a host number)
        self.is_initialized = True
        self.beam_idx = beam_idx
        self.keep = torch.empty((), dtype=keys.dtype, device=keys.device)  # 0 at step 0, else 1
        self.one_hot = torch.empty(
            keys.shape[2], 1, dtype=keys.dtype, device=keys.device
        )  # this step's position

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        for cache, new in ((self.keys, key_states), (self.values, value_states)):
            cache.mul_(self.keep)
            if self.beam_idx is not None:
                cache.copy_(torch.index_select(cache, 0, self.beam_idx))
            rows, heads, length, head_dim = cache.shape
            written = torch.matmul(self.one_hot, new.reshape(rows * heads, 1, head_dim))
            cache.add_(written.view(rows, heads, length, head_dim))
        return self.keys, self.values


class _FilledCrossAttentionLayer(StaticLayer):
    """Cross-attention keys and values computed once per batch (`use_cross_cache`): read every step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__(max_cache_len=keys.shape[2])
        self.keys, self.values = keys, values
        self.device = keys.device
        self.cumulative_length = torch.tensor(keys.shape[2])
        self.is_initialized = True


class _RecomputedCrossAttentionLayer(DynamicLayer):
    """No cross-attention cache: the keys and values over the encoder's output are projected every step."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0


def _attention_shape(model) -> tuple[int, int, int]:
    """(decoder layers, heads, head dimension) of the decoder's attention, read from its config."""
    config = model.config
    layers = getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None)
    layers = layers or config.num_layers
    heads = getattr(config, "decoder_attention_heads", None) or config.num_heads
    head_dim = getattr(config, "d_kv", None) or config.d_model // heads
    return int(layers), int(heads), int(head_dim)


def _choosing_next_tokens(base: type, batch: int, num_beams: int) -> type:
    """`base` whose forward also picks the next tokens on the device, as Optimum Graphcore's
    `on_device_generation_steps` wrapper does: log-softmax of the last logits, then the best token of
    each row (greedy) or the best 2 x beams of each source's beams x vocabulary (beam search)."""

    def forward(self, **inputs):
        logits = base.forward(self, **inputs).logits[:, -1]
        scores = torch.log_softmax(logits, dim=-1)
        if num_beams == 1:
            return torch.argmax(scores, dim=-1)
        return torch.topk(scores.reshape(batch, -1), 2 * num_beams, dim=-1).indices

    return type("_OnDeviceGeneration", (base,), {"forward": forward})


def trace_decoder_step(
    source: ModelSource,
    batch: int,
    seq_len: int,
    max_length: int,
    num_beams: int,
    cross_cache: bool,
    float_bytes: int,
    on_device: bool = False,
) -> tuple[ModelProfile, list[int]]:
    """Profile of one decoder call of a generation, and the bytes of KV cache each decoder layer keeps.

    The call reads one token for each of `batch x num_beams` rows, the encoder's output for each row
    (`seq_len` source positions; Whisper's 1500 frames) and attends over a self-attention cache of
    `max_length` positions (see the module's docstring for what it does with the cache). Every call of
    a generation has these same shapes, so one trace prices them all. `on_device`: the next tokens are
    chosen on the IPUs too (`on_device_generation_steps`), charged to the last block.
    """
    model, plan = meta_model_and_plan(source)
    accepted = set(inspect.signature(model.forward).parameters)
    layers, heads, head_dim = _attention_shape(model)
    rows, source_positions = batch * num_beams, source_length(model, seq_len)
    beam_idx = torch.empty(rows, dtype=torch.int32, device=META) if num_beams > 1 else None

    def buffer(length: int) -> torch.Tensor:
        # In the model's dtype on the meta device; the tracer counts `float_bytes` per element.
        return torch.empty(rows, heads, length, head_dim, device=META)

    self_layers = [
        _IPUSelfAttentionLayer(buffer(max_length), buffer(max_length), 1, beam_idx) for _ in range(layers)
    ]
    if cross_cache:
        cross_layers = [
            _FilledCrossAttentionLayer(buffer(source_positions), buffer(source_positions))
            for _ in range(layers)
        ]
    else:
        cross_layers = [_RecomputedCrossAttentionLayer() for _ in range(layers)]
    cache = EncoderDecoderCache(Cache(layers=self_layers), Cache(layers=cross_layers))
    per_layer = (
        2 * rows * heads * head_dim * (max_length + (source_positions if cross_cache else 0)) * float_bytes
    )

    d_model = int(model.config.d_model)
    inputs = {
        "decoder_input_ids": torch.empty(rows, 1, dtype=torch.long, device=META),
        "encoder_outputs": BaseModelOutput(
            last_hidden_state=torch.empty(rows, source_positions, d_model, device=META)
        ),
    }
    if "input_ids" in accepted:  # a text encoder's padding mask, for the cross-attention
        inputs["attention_mask"] = torch.empty(rows, source_positions, dtype=torch.long, device=META)
    inputs["cache" if "cache" in accepted else "past_key_values"] = cache
    inputs["use_cache"] = True
    if on_device:
        model.__class__ = _choosing_next_tokens(type(model), batch, num_beams)
    profile = profile_model(model, plan, inputs, training=False, float_bytes=float_bytes)
    return profile, [per_layer] * layers
