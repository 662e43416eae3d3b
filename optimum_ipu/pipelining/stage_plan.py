"""The stage plan: which block of a model runs on which IPU of a replica's pipeline.

A `StagePlan` is plain data (block names, module paths, IPU indices), so the simulator's memory
and performance models can read it without importing transformers, and the layout search can build
plans for layouts that were never applied to a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from optimum_ipu.pipelining.placement import PlacementError, ipu_of_each_layer, stage_of_each_block
from optimum_ipu.pipelining.spec import CutSpec, base_model_path

_ACRONYMS = {"qa": "QA", "cls": "CLS", "lm": "LM", "mlm": "MLM", "nsp": "NSP"}


@dataclass(frozen=True)
class Block:
    """One named piece of the model placed on one IPU.

    Attributes:
        name: the name in the Device Allocation table ("Embedding", "Encoder 3", "QA Outputs").
        modules: dotted paths (from the model's root) of the modules the block owns.
        ipu: index of the IPU inside the replica's pipeline.
        kind: "embedding", "layer", "head", "attached" (runs on the IPU of the layer before it: a stack's
            final layer norm) or "leading" (on the IPU of the layer after it: Whisper's decoder embedding).
    """

    name: str
    modules: tuple[str, ...]
    ipu: int
    kind: str


@dataclass(frozen=True)
class StagePlan:
    """Blocks in execution order, each on one IPU of a pipeline of `ipus_per_replica` IPUs."""

    blocks: tuple[Block, ...]
    ipus_per_replica: int

    @property
    def layer_blocks(self) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.kind == "layer")

    @property
    def forward_stages(self) -> int:
        """Pipeline stages a micro-batch's forward passes through (`placement.stage_of_each_block`): one
        per IPU, and one more for each run of blocks after the forward went back to an IPU it had left
        (a head tied to the word embedding, back on IPU 0)."""
        numbers = stage_of_each_block([b.ipu for b in self.blocks], self.ipus_per_replica)
        return max([self.ipus_per_replica - 1, *numbers]) + 1

    def blocks_on(self, ipu: int) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.ipu == ipu)

    def layers_per_ipu(self) -> list[int]:
        """Resolved number of layers on each IPU (wildcards expanded)."""
        counts = [0] * self.ipus_per_replica
        for block in self.layer_blocks:
            counts[block.ipu] += 1
        return counts

    def ipu_of_module(self, path: str) -> int | None:
        """IPU of the block owning `path` (or one of its ancestors); None if no block owns it."""
        best: tuple[int, int] | None = None
        for block in self.blocks:
            for owned in block.modules:
                if path == owned or path.startswith(owned + "."):
                    if best is None or len(owned) > best[0]:
                        best = (len(owned), block.ipu)
        return None if best is None else best[1]

    def allocation_table(self) -> str:
        """The "Device Allocation" table Optimum Graphcore logs: one `Name --> IPU k` line a block."""
        width = max((len(b.name) for b in self.blocks), default=0)
        lines = ["-" * 20 + " Device Allocation " + "-" * 20]
        lines += [f"{b.name:<{width}} --> IPU {b.ipu}" for b in self.blocks]
        lines.append("-" * (40 + len(" Device Allocation ")))
        return "\n".join(lines)


def display_name(path: str) -> str:
    """`qa_outputs` -> "QA Outputs", `pre_classifier` -> "Pre Classifier"."""
    words = path.rsplit(".", 1)[-1].split("_")
    return " ".join(_ACRONYMS.get(w.lower(), w.capitalize()) for w in words)


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=True))


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _expand(model: nn.Module, root: str, units: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """`(name, path)` units with every `list.*` path widened to one numbered unit per list item."""
    out = []
    for name, path in units:
        if path.endswith(".*"):
            list_path = _join(root, path[:-2])
            out += [(f"{name} {i}", f"{list_path}.{i}") for i in range(len(model.get_submodule(list_path)))]
        else:
            out.append((name, _join(root, path)))
    return out


def _add_riders(
    model: nn.Module, blocks: list[Block], base: str, riders: Sequence[tuple[str, str]]
) -> set[str]:
    """Put each rider module into the (last) block owning its host path; return the riders' paths."""
    placed = set()
    for rider, host in riders:
        rider_path, host_path = _join(base, rider), _join(base, host)
        owners = [
            i
            for i, b in enumerate(blocks)
            for m in b.modules
            if m == host_path or m.startswith(host_path + ".")
        ]
        if not owners:
            raise ValueError(f"cut spec: no block owns {host_path!r}, which {rider_path!r} should join.")
        block = blocks[owners[-1]]
        blocks[owners[-1]] = Block(block.name, (*block.modules, rider_path), block.ipu, block.kind)
        placed.add(rider_path)
    return placed


def _layer_units(model: nn.Module, base: str, spec: CutSpec) -> list[tuple[str, str]]:
    """`(name, path)` of every unit `layers_per_ipu` counts before the heads: the spec's counted units,
    the layers, and for an encoder-decoder model the decoder's layers after the encoder's."""
    units = _expand(model, base, spec.counted_before)
    stacks = [(spec.layer_name, spec.layers)]
    if spec.decoder is not None:
        stacks.append((spec.decoder.layer_name, spec.decoder.layers))
    for name, list_path in stacks:
        path = _join(base, list_path)
        layer_list = model.get_submodule(path)
        if not isinstance(layer_list, nn.ModuleList):
            raise TypeError(
                f"{path} of {type(model).__name__} is {type(layer_list).__name__}, not nn.ModuleList."
            )
        units += [(f"{name} {i}", f"{path}.{i}") for i in range(len(layer_list))]
    return units


def _placement_error(error: PlacementError, model: nn.Module, spec: CutSpec, units, after) -> PlacementError:
    """`error`, saying what `layers_per_ipu` counted for a model whose count is not just its layers."""
    if spec.decoder is not None:
        counts = {
            name: sum(1 for n, _ in units if n.startswith(name + " "))
            for name in (spec.layer_name, spec.decoder.layer_name)
        }
        return PlacementError(
            f"{error} For {type(model).__name__} (an encoder-decoder model, as in Optimum Graphcore) layers_per_ipu "
            f"counts the encoder's {counts[spec.layer_name]} layers, then the decoder's "
            f"{counts[spec.decoder.layer_name]}."
        )
    before = [n for n, _ in units if not n.startswith(spec.layer_name + " ")]
    layers = len(units) - len(before)
    return PlacementError(
        f"{error} For {type(model).__name__} (as in Optimum Graphcore) layers_per_ipu counts "
        f"{len(units) + len(after)} units: {', '.join(before)}, {layers} "
        f"{spec.layer_name.lower()} layers and {', '.join(n for n, _ in after) or 'no head'}."
    )


def build_stage_plan(
    model: nn.Module,
    spec: CutSpec,
    layers_per_ipu: Sequence[int],
    ipus_per_replica: int,
) -> StagePlan:
    """Cut `model` by `spec` and place it on `ipus_per_replica` IPUs following `layers_per_ipu`.

    Embeddings go to IPU 0, layers (and the spec's counted units around them) where
    `layers_per_ipu` says, a head tied to the word embedding (or one the spec names) beside it (IPU 0
    but for Whisper), and every other module with parameters (pooler, final norm, task heads) to the
    last IPU. An encoder-decoder model's decoder layers are counted after the encoder's; its decoder
    embedding block and its stacks' final norms go where the spec says (see `DecoderStack`).
    """
    base = base_model_path(model)
    last = ipus_per_replica - 1
    units = _layer_units(model, base, spec)
    after = _expand(model, "", spec.counted_after)
    try:
        ipus = ipu_of_each_layer(len(units) + len(after), layers_per_ipu, ipus_per_replica)
    except PlacementError as error:
        if not (spec.counted_before or after or spec.decoder):
            raise
        raise _placement_error(error, model, spec, units, after) from None

    embeddings = tuple(_join(base, p) for p in spec.embeddings)
    blocks = [Block("Embedding", embeddings, 0, "embedding")] if embeddings else []
    layer_blocks = [Block(name, (path,), ipu, "layer") for (name, path), ipu in zip(units, ipus)]
    encoder_path = _join(base, spec.layers)
    decoder_path = _join(base, spec.decoder.layers) if spec.decoder is not None else None
    encoder = [b for b in layer_blocks if not (decoder_path and b.modules[0].startswith(decoder_path + "."))]
    decoder = layer_blocks[len(encoder) :]
    blocks += encoder
    # A stack's final blocks ran on the IPU of its last layer ("attached": the cost model keeps them there).
    encoder_ipu = encoder[-1].ipu if encoder else 0
    blocks += [Block(name, (_join(base, path),), encoder_ipu, "attached") for name, path in spec.final]
    if spec.decoder is not None:
        stack = spec.decoder
        if stack.embeddings:
            paths = tuple(_join(base, p) for p in stack.embeddings)
            if stack.embeddings_on_first_ipu:
                blocks.append(Block("Decoder Embedding", paths, 0, "embedding"))
            else:
                blocks.append(
                    Block("Decoder Embedding", paths, decoder[0].ipu if decoder else last, "leading")
                )
        blocks += decoder
        decoder_ipu = decoder[-1].ipu if decoder else encoder_ipu
        blocks += [Block(name, (_join(base, path),), decoder_ipu, "attached") for name, path in stack.final]
    after_blocks = [
        Block(name, (path,), ipu, "layer") for (name, path), ipu in zip(after, ipus[len(units) :])
    ]
    riders = _add_riders(model, blocks, base, spec.riders)

    # A head tied to the word embedding goes beside it, on the IPU of the block that owns the table.
    tied, tied_ipu = set(), 0
    if spec.word_embedding is not None:
        word_path = _join(base, spec.word_embedding)
        tied = {id(model.get_submodule(word_path).weight)}
        tied_ipu = next((b.ipu for b in blocks if word_path in b.modules), 0)
    first_ipu = {_join(base, p) for p in spec.first_ipu_heads}

    owned = {m for b in blocks + after_blocks for m in b.modules} | {encoder_path}
    if decoder_path:
        owned.add(decoder_path)
    heads: list[Block] = []
    # Siblings along the paths root -> base -> layer list that are not owned yet: pooler, final norm,
    # task heads. Walk from the layer list up so inner modules (pooler) come before outer ones (head).
    for layer_path in (encoder_path, decoder_path):
        if layer_path is None:
            continue
        ancestors = layer_path.split(".")
        for depth in range(len(ancestors) - 1, -1, -1):
            parent_path = ".".join(ancestors[:depth])
            parent = model.get_submodule(parent_path) if parent_path else model
            for child_name, child in parent.named_children():
                path = _join(parent_path, child_name)
                if any(path == o or path.startswith(o + ".") or o.startswith(path + ".") for o in owned):
                    continue
                if path in owned or path in riders or not _has_parameters(child):
                    continue
                is_tied = any(id(p) in tied for p in child.parameters())
                ipu = tied_ipu if is_tied else 0 if path in first_ipu else last
                heads.append(Block(display_name(path), (path,), ipu, "head"))
                owned.add(path)
    return StagePlan(tuple(blocks + heads + after_blocks), ipus_per_replica)
