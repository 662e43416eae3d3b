"""Profile a model without allocating weights: one forward on the meta device, recorded per block.

The model is copied onto the meta device (parameters become shape-only tensors, nothing is
allocated, the caller's model is untouched) and run once on one micro-batch under a
`TorchDispatchMode` that sees every aten operation and a `saved_tensors_hooks` that sees every
activation kept for backward. Forward hooks on the stage plan's block modules say which block is
running, so each operation is charged to the block (and so the IPU) that owns it. The result,
`ModelProfile` (see `profile.py`), is layout-independent data: the planner re-places its blocks on
other IPUs without tracing again.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from optimum_ipu.costmodel.profile import HOST, BlockProfile, Matmul, ModelProfile, Transfer
from optimum_ipu.pipelining.pipeline import untied_output_projection
from optimum_ipu.pipelining.spec import base_model_path, generic_spec, spec_for
from optimum_ipu.pipelining.stage_plan import StagePlan

aten = torch.ops.aten

_MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
_CONVOLUTIONS = {aten.convolution.default, aten._convolution.default}
_ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention.default,
}
# Reshapes and allocations cost nothing on an IPU: Poplar folds them into the tensor layout.
_FREE = {
    "_unsafe_view", "clone", "empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros",
    "new_ones", "new_full", "detach", "lift_fresh", "lift_fresh_copy", "alias", "_local_scalar_dense",
}  # fmt: skip


def _static_masked_select(tensor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # The selected count depends on the data; a static IPU graph holds the largest: every element.
    return torch.empty(
        torch.broadcast_shapes(tensor.shape, mask.shape).numel(), dtype=tensor.dtype, device="meta"
    )


def _static_nonzero(tensor: torch.Tensor) -> torch.Tensor:
    # As masked_select: a static graph holds the index of every element (DeBERTa's labelled rows).
    return torch.empty(tensor.numel(), tensor.dim(), dtype=torch.long, device="meta")


def _meta_ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, *_args, **_kwargs):
    # (negative log-likelihood per sample, the alpha table: time x (2 x longest target + 1) per sample);
    # flattened targets are bounded by their total length.
    frames, batch = log_probs.shape[0], log_probs.shape[1]
    longest = targets.shape[-1] if targets.dim() == 2 else targets.numel()
    return (
        torch.empty(batch, dtype=log_probs.dtype, device="meta"),
        torch.empty(batch, frames, 2 * longest + 1, dtype=log_probs.dtype, device="meta"),
    )


# Operators without a meta kernel that models use (CTC's loss and its target selection, DeBERTa's labelled
# rows): their output shapes, as a static graph would have them.
_META_SHAPES = {
    aten.masked_select.default: _static_masked_select,
    aten.nonzero.default: _static_nonzero,
    aten._ctc_loss.default: _meta_ctc_loss,
    aten._ctc_loss.Tensor: _meta_ctc_loss,
}


# -- the meta copy ------------------------------------------------------------------------------------


def _undo_serialization(model: nn.Module) -> None:
    """Swap serialized embeddings/heads back to their originals: the models apply serialization
    themselves from the config, so a parallelized and a plain model profile the same."""
    for path, module in list(model.named_modules()):
        original = getattr(module, "original", None)
        if path and isinstance(original, list) and len(original) == 1 and isinstance(original[0], nn.Module):
            parent_path, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent_path) if parent_path else model, name, original[0])


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters and buffers live on the meta device; nothing is allocated.

    Parameters already on meta are shared, not copied. Instance-level `forward` overrides (such as
    recomputation wrappers, which close over the original module) are dropped from the copy.
    """
    memo: dict[int, Any] = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) in memo:
            continue
        if tensor.device.type == "meta":
            memo[id(tensor)] = tensor
        elif isinstance(tensor, nn.Parameter):
            memo[id(tensor)] = nn.Parameter(torch.empty_like(tensor, device="meta"), tensor.requires_grad)
        else:
            memo[id(tensor)] = torch.empty_like(tensor, device="meta")
    meta = copy.deepcopy(model, memo)
    _undo_serialization(meta)
    for module in meta.modules():
        module.__dict__.pop("forward", None)
    return meta


def word_embedding_path(model: nn.Module) -> str | None:
    """Dotted path of the model's word embedding (the table embedding serialization splits)."""
    spec = spec_for(model)
    if spec is None:
        try:
            spec = generic_spec(model)
        except ValueError:
            return None
    if spec.word_embedding is None:
        return None
    return ".".join(p for p in (base_model_path(model), spec.word_embedding) if p)


# -- sample inputs -------------------------------------------------------------------------------------


def sample_inputs_for(
    model: nn.Module, micro_batch_size: int, seq_len: int | None = None, image_size: int | None = None
) -> dict[str, torch.Tensor]:
    """One micro-batch of meta tensors shaped like the model's real inputs, with labels for its task.

    Text models get `input_ids` / `attention_mask` (/ `token_type_ids`) of length `seq_len` (default
    the smaller of 384 and the model's maximum); vision models get `pixel_values` of `image_size`
    (default the config's); speech models (Wav2Vec2, HuBERT) get `input_values`, a waveform just long
    enough for their feature encoder to make `seq_len` frames (default 384, 7.7 s at 16 kHz), and CTC
    transcripts of a quarter as many tokens (12.5 a second; read speech runs at about 15 characters).
    Whisper gets the log-mel `input_features` of the one window its encoder accepts (30 s: twice
    `max_source_positions` frames, which its stride-2 convolution halves) and transcripts (`labels`) of
    `seq_len` tokens (default 384). The base model of an encoder-decoder that cannot make its decoder
    inputs (T5Model, WhisperModel: no labels to shift) gets `decoder_input_ids` of the labels' shape.
    """
    config = model.config
    accepted = set(inspect.signature(model.forward).parameters)
    b, meta = micro_batch_size, "meta"
    long = dict(dtype=torch.long, device=meta)
    inputs: dict[str, torch.Tensor] = {}
    if "pixel_values" in accepted:
        size = int(image_size or getattr(config, "image_size", 224))
        channels = int(getattr(config, "num_channels", 3))
        inputs["pixel_values"] = torch.empty(b, channels, size, size, device=meta)
        if "interpolate_pos_encoding" in accepted and size != getattr(config, "image_size", size):
            inputs["interpolate_pos_encoding"] = True
        token_shape: tuple[int, ...] = (b,)
    elif "input_features" in accepted:
        window = 2 * int(config.max_source_positions)
        inputs["input_features"] = torch.empty(b, int(config.num_mel_bins), window, device=meta)
        token_shape = (b, int(seq_len or 384))
    elif "input_values" in accepted:
        frames = int(seq_len or 384)
        inputs["input_values"] = torch.empty(b, _waveform_length(config, frames), device=meta)
        token_shape = (b,) if _is_classifier(model) else (b, max(1, frames // 4))
    else:
        max_len = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 512)
        length = int(seq_len or min(384, max_len))
        token_shape = (b, length)
        inputs["input_ids"] = torch.empty(token_shape, **long)
        if "attention_mask" in accepted:
            inputs["attention_mask"] = torch.empty(token_shape, **long)
        if "token_type_ids" in accepted and getattr(config, "type_vocab_size", 0):
            inputs["token_type_ids"] = torch.empty(token_shape, **long)
    if "start_positions" in accepted:
        inputs["start_positions"] = torch.empty(b, **long)
        inputs["end_positions"] = torch.empty(b, **long)
    elif "next_sentence_label" in accepted:
        inputs["labels"] = torch.empty(token_shape, **long)
        inputs["next_sentence_label"] = torch.empty(b, **long)
    elif "labels" in accepted:
        if _is_classifier(model):
            if getattr(config, "problem_type", None) == "multi_label_classification":
                inputs["labels"] = torch.empty(b, config.num_labels, device=meta)
            else:
                inputs["labels"] = torch.empty(b, **long)
        elif len(token_shape) == 2:
            inputs["labels"] = torch.empty(token_shape, **long)
    if _needs_decoder_inputs(config, accepted, inputs) and len(token_shape) == 2:
        inputs["decoder_input_ids"] = torch.empty(token_shape, **long)
    return inputs


# Encoder-decoders whose models make their decoder inputs from `input_ids` when given none (shifted right):
# on the IPU that happens on the device, so the trace gives them none to stream.
_DECODER_INPUTS_FROM_INPUT_IDS = frozenset({"bart", "mbart", "plbart"})


def _needs_decoder_inputs(config, accepted: set[str], inputs: dict[str, torch.Tensor]) -> bool:
    """Whether the traced model needs `decoder_input_ids` given: an encoder-decoder's base model (T5Model,
    MT5Model, WhisperModel), which has no labels to shift and, outside BART's family, makes none itself.
    A head with labels or answer positions (`T5ForQuestionAnswering`) derives them as it runs."""
    return (
        getattr(config, "is_encoder_decoder", False)
        and "decoder_input_ids" in accepted
        and not {"labels", "start_positions"} & inputs.keys()
        and getattr(config, "model_type", None) not in _DECODER_INPUTS_FROM_INPUT_IDS
    )


def _is_classifier(model: nn.Module) -> bool:
    return type(model).__name__.endswith(("SequenceClassification", "ImageClassification"))


def _waveform_length(config, frames: int) -> int:
    """The fewest samples from which the convolutional feature encoder makes `frames` frames."""
    length = frames
    for kernel, stride in reversed(list(zip(config.conv_kernel, config.conv_stride))):
        length = (length - 1) * stride + kernel
    return length


# -- the recorder ------------------------------------------------------------------------------------


def _to_meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) and not value.is_meta else value


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _Recorder(TorchDispatchMode):
    """Charges every aten operation to the block running it; tracks who produced each tensor."""

    def __init__(self, profile: ModelProfile, float_bytes: int, word_embedding_key: int | None,
                 projection_key: int | None = None):  # fmt: skip
        super().__init__()
        self.profile = profile
        self.float_bytes = float_bytes
        self.word_embedding_key = word_embedding_key
        self.projection_key = projection_key
        self.stack: list[int] = []
        self.last = 0
        self.producer: dict[int, str] = {}
        self.masks: set[int] = set()  # storages of dropout masks: their scaling folds into the dropout
        self.transfers: dict[tuple[int, str], Transfer] = {}
        self.keep: list[torch.Tensor] = []  # keeps storages alive so their ids stay unique

    @property
    def block(self) -> BlockProfile:
        return self.profile.blocks[self.stack[-1] if self.stack else self.last]

    def nbytes(self, t: torch.Tensor) -> int:
        size = self.float_bytes if t.is_floating_point() else min(t.element_size(), 4)  # ids are int32
        return t.numel() * size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        scalar = args[0] if func is aten._local_scalar_dense.default else None
        if scalar is not None and (scalar.is_meta or scalar.dtype == torch.bool or scalar.is_floating_point()):
            # Data-dependent Python branches (`mask.all()`, LayerDrop's `torch.rand([]) < p`) take the general
            # path, as a static IPU graph does. A host integer is a size computed from shapes (DeBERTa's
            # attention span, a `torch.tensor(min(length, span))`): it is read.
            return False if scalar.dtype == torch.bool else 1
        if func is aten._to_copy.default and kwargs.get("device") is not None:
            kwargs = {**kwargs, "device": torch.device("meta")}  # device moves of a parallelized model
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(t.is_meta for t in tensors) and any(not t.is_meta and t.dim() for t in tensors):
            # A tensor the forward made on the host (`torch.arange(n)` without `device=`) meets the model's:
            # on the IPU both are in the one graph, so the host's joins the trace.
            args, kwargs = tree_map(_to_meta, (args, kwargs))
        if func in _META_SHAPES and any(isinstance(t, torch.Tensor) and t.is_meta for t in tree_leaves(args)):
            out = _META_SHAPES[func](*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func, args, kwargs, out) -> None:
        block = self.block
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        name = func._schema.name.split("::")[-1]
        aliasing = func.is_view or name == "_unsafe_view"
        for t in inputs:
            producer = self.producer.get(_key(t))
            if producer is not None and producer != block.name and not aliasing:
                key = (_key(t), block.name)
                size = self.nbytes(t)
                if key not in self.transfers or self.transfers[key].bytes < size:
                    self.transfers[key] = Transfer(_key(t), size, producer, block.name, t.is_floating_point())
        for t in outputs:
            if aliasing and inputs:
                source = self.producer.get(_key(inputs[0]))
                if source is not None:
                    self.producer[_key(t)] = source
            elif _key(t) not in self.producer:
                self.producer[_key(t)] = block.name
            self.keep.append(t)
        if aliasing or name in _FREE or not inputs:
            return  # views, allocations and constants
        reads_table = self.word_embedding_key is not None and any(
            _key(t) == self.word_embedding_key for t in inputs
        )
        for t in outputs:
            block.largest_tensor_bytes = max(block.largest_tensor_bytes, self.nbytes(t))
        matmuls = self._matmuls(func, args, outputs, reads_table)
        if self.projection_key is not None and any(_key(t) == self.projection_key for t in inputs):
            matmuls = [dataclasses.replace(m, projection=True) for m in matmuls]
        if matmuls:
            block.matmuls.extend(matmuls)
            block.forward_flops += sum(m.flops for m in matmuls)
            return
        if name.startswith("bernoulli"):
            self.masks.add(_key(inputs[0]))
        elif any(_key(t) in self.masks for t in inputs) and name in ("div_", "div", "mul", "mul_"):
            return  # scaling by / applying the dropout mask: part of the one dropout operation
        if name == "embedding" and reads_table:
            block.embedding_lookups += 1
        block.other_ops += 1
        moved = sum(self.nbytes(t) for t in inputs if t.numel() > 1) + sum(self.nbytes(t) for t in outputs)
        block.other_bytes += moved
        block.forward_flops += sum(t.numel() for t in outputs)

    @staticmethod
    def _matmuls(func, args, outputs, reads_table: bool) -> list[Matmul]:
        if func in _MATMULS:
            a, b = (
                (args[1], args[2])
                if func in (aten.addmm.default, aten.baddbmm.default)
                else (args[0], args[1])
            )
            batch = a.shape[0] if a.dim() == 3 else 1
            return [Matmul(batch, a.shape[-2], a.shape[-1], b.shape[-1], reads_table)]
        if func in _CONVOLUTIONS:
            weight, out = args[1], outputs[0]
            groups = int(args[8]) if len(args) > 8 else 1
            m = out.shape[0] * math.prod(out.shape[2:])
            return [Matmul(groups, m, weight[0].numel(), weight.shape[0] // groups, reads_table)]
        if func in _ATTENTION:
            q, k, v = args[0], args[1], args[2]
            batch = q.shape[0] * q.shape[1]
            return [
                Matmul(batch, q.shape[-2], q.shape[-1], k.shape[-2]),
                Matmul(batch, q.shape[-2], k.shape[-2], v.shape[-1]),
            ]
        return []


# -- profiling ---------------------------------------------------------------------------------------


def _block_of_path(plan: StagePlan) -> dict[str, int]:
    return {path: i for i, block in enumerate(plan.blocks) for path in block.modules}


def _count_parameters(model: nn.Module, profile: ModelProfile, plan: StagePlan, table: str | None,
                      projection: str | None = None) -> None:  # fmt: skip
    # Ownership is the plan's own rule (`StagePlan.ipu_of_module`: the longest owned prefix), asked of a
    # copy of the plan whose "IPU" of each block is the block's index.
    indexed = StagePlan(
        tuple(dataclasses.replace(b, ipu=i) for i, b in enumerate(plan.blocks)), plan.ipus_per_replica
    )
    for name, param in model.named_parameters():  # tied weights are listed once
        module_path = name.rpartition(".")[0]
        index = indexed.ipu_of_module(module_path)
        block = profile.blocks[index if index is not None else 0]
        block.parameters += param.numel()
        is_table = table is not None and module_path == table
        is_projection = projection is not None and module_path == projection
        if param.requires_grad:
            block.trainable_parameters += param.numel()
            block.trainable_tensors += 1
            if not is_table and not is_projection:
                block.largest_trainable_tensor = max(block.largest_trainable_tensor, param.numel())
        if is_table:
            block.word_embedding_parameters += param.numel()
        if is_projection:
            block.projection_parameters += param.numel()


def profile_model(
    model: nn.Module,
    plan: StagePlan,
    sample_inputs: Mapping[str, Any],
    *,
    training: bool = True,
    float_bytes: int = 2,
) -> ModelProfile:
    """Trace one forward of `model` on a meta copy and charge its cost to the blocks of `plan`.

    Args:
        model: the model (real or on meta; it is neither changed nor run).
        plan: its stage plan; only block names and module paths are used, not the IPUs.
        sample_inputs: one micro-batch (tensors of any device; only shapes and dtypes matter). Tensors
            nested in a value (a `ModelOutput`, a tuple) count as inputs from the host as well; other
            objects (a KV cache) are the device's own state.
        training: trace in training mode (dropout on, activations saved for backward).
        float_bytes: bytes of a floating-point element on the IPU (2 in fp16, 4 in fp32).
    """
    meta = meta_copy(model)
    meta.train(training)
    micro_batch = next(
        (v.shape[0] for v in sample_inputs.values() if isinstance(v, torch.Tensor) and v.dim()), 1
    )
    profile = ModelProfile(
        blocks=[BlockProfile(b.name, b.kind, b.modules) for b in plan.blocks],
        transfers=[], micro_batch_size=int(micro_batch), float_bytes=float_bytes, input_bytes=0, training=training,
    )  # fmt: skip
    owners = _block_of_path(plan)
    table_path = word_embedding_path(meta)
    table = meta.get_submodule(table_path).weight if table_path else None
    projection_path = untied_output_projection(meta)
    projection = meta.get_submodule(projection_path).weight if projection_path else None
    recorder = _Recorder(profile, float_bytes, _key(table) if table is not None else None,
                         _key(projection) if projection is not None else None)  # fmt: skip

    inputs = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in sample_inputs.items()}
    # Tensors inside a structured input (an encoder's output handed to the decoder) stream from the host too.
    for value in tree_leaves(inputs):
        if isinstance(value, torch.Tensor):
            recorder.producer[_key(value)] = HOST
            profile.input_bytes += recorder.nbytes(value)

    def enter(index):
        def hook(_module, _args):
            recorder.stack.append(index)

        return hook

    def leave(index):
        def hook(_module, _args, output):
            if recorder.stack:
                recorder.stack.pop()
            recorder.last = index
            profile.blocks[index].output_bytes += sum(
                recorder.nbytes(t) for t in tree_leaves(output) if isinstance(t, torch.Tensor)
            )

        return hook

    handles = []
    for path, index in owners.items():
        module = meta.get_submodule(path)
        handles.append(module.register_forward_pre_hook(enter(index)))
        handles.append(module.register_forward_hook(leave(index), always_call=True))

    parameter_keys = {_key(p) for p in meta.parameters()}
    saved: set[int] = set()

    def pack(t: torch.Tensor):
        key = _key(t)
        # A dropout mask is drawn again from the seed in the IPU's backward (PopART's DropoutGradOp).
        if key not in parameter_keys and key not in saved and key not in recorder.masks:
            saved.add(key)
            nbytes = t.untyped_storage().nbytes()
            if t.is_floating_point():
                nbytes = nbytes * float_bytes // t.element_size()
            recorder.block.saved_bytes += nbytes
        return t

    try:
        with torch.set_grad_enabled(training), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with recorder:
                output = meta(**inputs)
        del output
    finally:
        for handle in handles:
            handle.remove()
    profile.transfers = list(recorder.transfers.values())
    for block, planned in zip(profile.blocks, plan.blocks):
        # With one IPU the plan cannot tell a tied head from the others: reading the table tells.
        tied = any(m.word_embedding for m in block.matmuls)
        block.on_first_ipu = block.kind == "embedding" or (
            block.kind == "head" and (tied or (planned.ipu == 0 and plan.ipus_per_replica > 1))
        )
    _count_parameters(meta, profile, plan, table_path, projection_path)
    return profile
