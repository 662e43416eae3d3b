"""What tracing a model yields: per-block costs of one micro-batch, as plain torch-free data.

`trace.profile_model` fills a `ModelProfile`; the memory and performance models, the planner and
the reports read it. Nothing here imports torch, so a profile saved as JSON can be priced again
(`optimum-ipu plan` keeps a cache) without loading torch or transformers.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

HOST = "<host>"  # producer name of the sample inputs streamed from the host


def placement_rule() -> ModuleType:
    """`optimum_ipu.pipelining.placement`, the one owner of the `layers_per_ipu` rule, imported
    without running `optimum_ipu.pipelining`'s `__init__` (which imports torch for `to_pipelined`).

    Pricing a cached or shipped profile must not import torch (it is most of a cold `optimum-ipu
    plan`), and `placement.py` itself is pure Python. The module is registered under its own name, so
    a later `import optimum_ipu.pipelining` shares this very module object.
    """
    name = "optimum_ipu.pipelining.placement"
    module = sys.modules.get(name)
    if module is None:
        package = importlib.util.find_spec("optimum_ipu.pipelining")  # locates, does not execute
        path = Path(next(iter(package.submodule_search_locations))) / "placement.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Matmul:
    """One matrix product (or convolution, as its implicit matmul): `batch` x [m, k] @ [k, n].

    Attributes:
        word_embedding: the product reads the word embedding (a tied LM head): embedding
            serialization splits it.
        projection: the product reads an output projection not tied to the word embedding (MT5's LM
            head): projection serialization splits it.
    """

    batch: int
    m: int
    k: int
    n: int
    word_embedding: bool = False
    projection: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n


@dataclass
class BlockProfile:
    """What one block of the stage plan costs for one micro-batch, in the compute precision.

    Attributes:
        name, kind, modules: as the plan's `Block`.
        on_first_ipu: a non-layer block the plan puts on IPU 0 (embeddings, a tied head); the
            other non-layer blocks go to the last IPU.
        parameters: parameters the block owns (a tied weight counts once, where it is first owned).
        trainable_parameters: those of them that require grad (they get gradients and optimizer state).
        word_embedding_parameters: the part of `parameters` that is the word embedding table.
        forward_flops: FLOPs of the forward.
        matmuls: every matrix product, with its shape.
        other_ops: costed operations that are not matrix products (elementwise, norms, softmax...).
        other_bytes: bytes those operations read and write.
        embedding_lookups: lookups of the word embedding (serialization multiplies them).
        output_bytes: bytes of the block's output activations.
        saved_bytes: bytes of activations the forward keeps for backward. Dropout masks are not
            among them: the IPU draws a mask again from its seed in the backward (PopART's
            `DropoutGradOp` takes the gradient and the seed, no mask).
        largest_tensor_bytes: the largest activation the block produces.
        trainable_tensors: how many trainable parameter tensors the block owns (each gets its own
            gradient accumulation operation per micro-batch).
        largest_trainable_tensor: elements of the largest of them, the word embedding table and an
            untied output projection aside (serialization splits those, see `projection_parameters`).
            Optimizer state kept off chip is streamed back one tensor at a time for the update, so the
            largest bounds what must fit.
        projection_parameters: the part of `parameters` that is an output projection not tied to the
            word embedding (MT5's LM head).
    """

    name: str
    kind: str
    modules: tuple[str, ...]
    on_first_ipu: bool = False
    parameters: int = 0
    trainable_parameters: int = 0
    word_embedding_parameters: int = 0
    forward_flops: int = 0
    matmuls: list[Matmul] = field(default_factory=list)
    other_ops: int = 0
    other_bytes: int = 0
    embedding_lookups: int = 0
    output_bytes: int = 0
    saved_bytes: int = 0
    largest_tensor_bytes: int = 0
    trainable_tensors: int = 0
    largest_trainable_tensor: int = 0
    projection_parameters: int = 0


@dataclass(frozen=True)
class Transfer:
    """A tensor produced in one block (or streamed from the host) and read by another block.

    Attributes:
        floating: a floating-point tensor, so in training its gradient flows back the same way.
    """

    tensor: int
    bytes: int
    producer: str
    consumer: str
    floating: bool = True


@dataclass(frozen=True)
class Crossing:
    """Bytes one micro-batch sends from IPU `source` (None: the host) to IPU `target`."""

    source: int | None
    target: int
    bytes: int
    gradient_bytes: int


@dataclass
class ModelProfile:
    """A model's blocks (in plan order) and the tensors flowing between them, for one micro-batch."""

    blocks: list[BlockProfile]
    transfers: list[Transfer]
    micro_batch_size: int
    float_bytes: int
    input_bytes: int
    training: bool

    def block(self, name: str) -> BlockProfile:
        return next(b for b in self.blocks if b.name == name)

    @property
    def parameters(self) -> int:
        return sum(b.parameters for b in self.blocks)

    @property
    def num_layers(self) -> int:
        return sum(1 for b in self.blocks if b.kind == "layer")

    def crossings(self, ipu_of: Mapping[str, int]) -> list[Crossing]:
        """Tensors that change IPU (or come from the host) under the placement `ipu_of`.

        A tensor read by several blocks of the same IPU crosses once.
        """
        seen: set[tuple[int, int]] = set()
        out = []
        for t in self.transfers:
            target = ipu_of[t.consumer]
            source = None if t.producer == HOST else ipu_of[t.producer]
            if source != target and (t.tensor, target) not in seen:
                seen.add((t.tensor, target))
                out.append(
                    Crossing(source, target, t.bytes, t.bytes if t.floating and source is not None else 0)
                )
        return out

    def placement(self, layers_per_ipu: Sequence[int], ipus_per_replica: int) -> dict[str, int]:
        """IPU of every block for another `layers_per_ipu`: layers by `pipelining.placement` (the rule
        `build_stage_plan` applies), embeddings on IPU 0, a head tied to the word embedding beside the
        table (IPU 0, or Whisper's decoder embedding's IPU), the heads Optimum Graphcore put back on IPU
        0 there, other heads on the last; an "attached" block (a stack's final norm) with the layer
        before it, a "leading" one (Whisper's decoder embedding) with the layer after it."""
        rule = placement_rule()
        layer_ipus = iter(rule.ipu_of_each_layer(self.num_layers, layers_per_ipu, ipus_per_replica))
        last = ipus_per_replica - 1
        table = next((b.name for b in self.blocks if b.word_embedding_parameters), None)
        ipus: dict[str, int] = {}
        previous_layer, leading = None, []
        for b in self.blocks:
            if b.kind == "layer":
                ipus[b.name] = previous_layer = next(layer_ipus)
                for name in leading:
                    ipus[name] = previous_layer
                leading = []
            elif b.kind == "attached" and previous_layer is not None:
                ipus[b.name] = previous_layer
            elif b.kind == "leading":
                leading.append(b.name)
            elif table in ipus and any(m.word_embedding for m in b.matmuls):
                ipus[b.name] = ipus[table]  # a tied head runs where its weight, the table, lives
            else:
                ipus[b.name] = 0 if b.on_first_ipu else last
        ipus.update({name: last for name in leading})  # no layer after them
        return {b.name: ipus[b.name] for b in self.blocks}

    @property
    def output_bytes(self) -> int:
        """Bytes of the model's outputs per micro-batch: what blocks produce that no block reads."""
        read = {t.producer for t in self.transfers}
        return sum(b.output_bytes for b in self.blocks if b.name not in read)

    @property
    def forward_flops(self) -> int:
        return sum(b.forward_flops for b in self.blocks)

    def to_dict(self) -> dict[str, Any]:
        """Everything, as JSON-able data (`from_dict` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelProfile:
        blocks = [
            BlockProfile(
                **{**b, "modules": tuple(b["modules"]), "matmuls": [Matmul(**m) for m in b["matmuls"]]}
            )
            for b in data["blocks"]
        ]
        transfers = [Transfer(**t) for t in data["transfers"]]
        return cls(**{**data, "blocks": blocks, "transfers": transfers})
