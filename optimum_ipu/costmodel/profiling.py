"""The profile of a model `optimum-ipu plan` is asked about: cached, shipped with the package, or traced.

Tracing builds the model from its config on the meta device (no weights are allocated or
downloaded) and runs one micro-batch through `trace.profile_model`. The command, the shipped-profile
generator (`tools/trace_shipped_profiles.py`) and the tests all come here for a profile, so the
cost model never imports the CLI.
"""

from __future__ import annotations

from optimum_ipu.costmodel.presets import ModelSource, build_meta_model


def trace_source(source: ModelSource, micro_batch: int, seq_len: int | None, image_size: int | None,
                 training: bool, float_bytes: int):  # fmt: skip
    """Trace `source` on the meta device (imports torch and transformers).

    The profile does not depend on the number of IPUs, except for telling a head planned beside the
    embedding from the others, which only a plan over more than one IPU shows: trace over two.
    """
    from optimum_ipu.costmodel.trace import profile_model, sample_inputs_for
    from optimum_ipu.pipelining.spec import generic_spec, spec_for
    from optimum_ipu.pipelining.stage_plan import build_stage_plan

    model = build_meta_model(source)
    spec = spec_for(model) or generic_spec(model)
    try:
        plan = build_stage_plan(model, spec, [-1], 2)
    except ValueError:  # a single layer
        plan = build_stage_plan(model, spec, [-1], 1)
    inputs = sample_inputs_for(model, micro_batch, seq_len, image_size)
    return profile_model(model, plan, inputs, training=training, float_bytes=float_bytes)


def model_profile(
    source: ModelSource, workload, seq_len: int | None, image_size: int | None, use_cache: bool = True
):
    """The profile of `source` for `workload`'s micro-batch: from the cache, else shipped with the
    package (`optimum_ipu.costmodel.shipped`), else traced (and cached). `use_cache=False` traces."""
    from optimum_ipu.costmodel.cache import load_profile, profile_key, save_profile
    from optimum_ipu.costmodel.shipped import load_shipped

    config = source.config
    max_len = config.get("max_position_embeddings") or config.get("n_positions")
    max_len = max_len or config.get("max_target_positions")  # Whisper's transcripts
    if source.is_vision:
        seq_len = None
        image_size = image_size or source.config.get("image_size")
    else:
        image_size = None
        if max_len and seq_len > max_len:
            raise ValueError(f"--seq-len {seq_len} is longer than the model's {max_len} positions.")
    shape = dict(micro_batch=workload.micro_batch_size, seq_len=seq_len, image_size=image_size,
                 training=workload.training, float_bytes=workload.float_bytes)  # fmt: skip
    if not use_cache:
        return trace_source(source, **shape)
    key = profile_key(config=source.config, builder=source.builder, **shape)
    profile = load_profile(key) or load_shipped(source.config, source.builder, **shape)
    if profile is None:
        profile = trace_source(source, **shape)
        save_profile(key, profile)
    return profile


def generation_profiles(source: ModelSource, batch: int, seq_len: int, settings, float_bytes: int,
                        use_cache: bool = True):  # fmt: skip
    """The traced programs of a generation (`decoding.GenerationProfiles`): the encoder on `batch`
    sources of `seq_len` tokens, one decoder call on batch x beams rows with a KV cache of
    `settings.max_length`. Traced on first use (imports torch), then cached like the profiles.

    Raises:
        ValueError: not an encoder-decoder model, or a length beyond its position tables.
    """
    import hashlib
    from dataclasses import asdict
    from pathlib import Path

    from optimum_ipu.costmodel.cache import load_entry, profile_key, save_entry
    from optimum_ipu.costmodel.decoding import GenerationProfiles

    config = source.config
    targets = config.get("max_target_positions") or config.get("max_position_embeddings")
    if targets and settings.max_length > targets:
        raise ValueError(
            f"--generation_max_length {settings.max_length} is longer than the {targets} positions of {source.name}'s "
            f"decoder; give at most {targets}."
        )
    if not config.get("max_source_positions") and config.get("max_position_embeddings", seq_len) < seq_len:
        positions = config["max_position_embeddings"]
        raise ValueError(f"--seq-len {seq_len} is longer than the model's {positions} positions.")
    tracer = hashlib.sha256((Path(__file__).parent / "decoding_trace.py").read_bytes()).hexdigest()
    key = profile_key(config=config, builder=source.builder, program="generation", batch=batch, seq_len=seq_len,
                      float_bytes=float_bytes, generation=asdict(settings), generation_tracer=tracer)  # fmt: skip
    if use_cache:
        cached = load_entry(key, GenerationProfiles.from_dict)
        if cached is not None:
            return cached
    from optimum_ipu.costmodel.decoding_trace import trace_decoder_step, trace_encoder

    encoder = trace_encoder(source, batch, seq_len, float_bytes)
    on_device = settings.on_device_steps > 0
    step, kv_cache = trace_decoder_step(source, batch, seq_len, settings.max_length, settings.num_beams,
                                        settings.cross_cache, float_bytes, on_device)  # fmt: skip
    # On the device the call returns the chosen tokens (int32, one per row, or 2 x beams per source), not logits.
    returned = 4 * batch * (1 if settings.num_beams == 1 else 2 * settings.num_beams)
    profiles = GenerationProfiles(encoder, step, kv_cache, returned if on_device else None)
    save_entry(key, profiles.to_dict())
    return profiles
