"""A model that places itself: the user's own `parallelize()` puts its blocks on IPUs, and IPUTrainer runs them there.

Optimum Graphcore's contract for a model it has no pipelined class for (its external_model notebook):
the user's class subclasses `PipelineMixin`, carries an `ipu_config`, and its `parallelize()` marks
layers with `poptorch.BeginBlock(layer, "name", ipu_id=k)`; `deparallelize()` removes the marks and
hooks. IPUTrainer then calls `parallelize()` itself. Here that contract is read by duck typing (a
class defining both methods), so this layer needs neither the compat mixin nor PopTorch's front end:
`SelfPlacedModel` calls the model's methods and reads the stage plan back from the block marks
(`block_marks.py`).

The plan is read in the order the model registers its modules, the order its forward runs them in a
model written as a stack (embeddings, layers, head): a marked module starts a block, and every
module holding weights after it, outside any marked module, joins that block, as PopTorch's
`BeginBlock` keeps later layers in the block until the next one starts. It is read before any batch
has run, because the IPUs' torch devices are chosen at `parallelize()`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from optimum_ipu._once import warn_once
from optimum_ipu.pipelining.block_marks import block_mark
from optimum_ipu.pipelining.pipeline import PipelinedModel, default_ipu_devices
from optimum_ipu.pipelining.stage_plan import Block, StagePlan

__all__ = ["SelfPlacedModel", "places_itself", "plan_from_block_marks"]

logger = logging.getLogger(__name__)


def places_itself(model: nn.Module) -> bool:
    """Whether `model`'s class places it (defines `parallelize()` and `deparallelize()`, Optimum Graphcore's
    `PipelineMixin` contract); transformers' models define neither."""
    return all(callable(getattr(type(model), name, None)) for name in ("parallelize", "deparallelize"))


def _holds_state(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))


def _within(path: str, roots: list[str]) -> bool:
    return any(path.startswith(root + ".") for root in roots)


def plan_from_block_marks(model: nn.Module, ipus_per_replica: int) -> StagePlan:
    """The stage plan `model`'s `BeginBlock` marks give (see the module's docstring for the order read).

    Modules holding weights before the first mark run on IPU 0 (PopTorch's rule for ops before any block).
    A block with only embedding tables before any other block is an "embedding" block, one sharing a
    weight with them (a tied head) a "head"; the others are "layer" blocks, as the cost model counts them.
    """
    entries: list[tuple[str, list[str], int]] = []
    marked: list[str] = []
    for path, module in model.named_modules():
        mark = block_mark(module) if path else None
        if mark is not None:
            user_id, ipu = mark
            ipu = (entries[-1][2] if entries else 0) if ipu is None else ipu
            if ipu >= ipus_per_replica:
                raise ValueError(
                    f"{type(model).__name__}.parallelize() put block {user_id!r} ({path}) on IPU {ipu}, but the IPU "
                    f"config has ipus_per_replica={ipus_per_replica}: raise ipus_per_replica or place the block "
                    f"on IPU 0 to {ipus_per_replica - 1}."
                )
            entries.append((user_id or f"Block {len(entries)}", [path], ipu))
            marked.append(path)
        elif path and _holds_state(module) and not _within(path, marked):
            if not entries:
                entries.append(("Before the first block", [], 0))
            entries[-1][1].append(path)
            marked.append(path)
    embedding_weights: set[int] = set()
    blocks: list[Block] = []
    for name, paths, ipu in entries:
        modules = [model.get_submodule(p) for p in paths]
        weights = {id(p) for m in modules for p in m.parameters()}
        if all(isinstance(m, nn.Embedding) for m in modules) and all(b.kind == "embedding" for b in blocks):
            kind = "embedding"
            embedding_weights |= weights
        else:
            kind = "head" if weights & embedding_weights else "layer"
        blocks.append(Block(name, tuple(paths), ipu, kind))
    return StagePlan(tuple(blocks), ipus_per_replica)


class SelfPlacedModel(PipelinedModel):
    """A `PipelinedModel` whose layout is the model's own `parallelize()`.

    `parallelize()` hands the model the IPU config (its `parallelize()` reads `self.ipu_config`, in the
    config's current mode), calls the model's `parallelize(**ipu_config.parallelize_kwargs)` as Optimum
    Graphcore's IPUTrainer did, reads the plan from the marks and moves each IPU's blocks to its torch
    device; `deparallelize()` calls the model's `deparallelize()`. The IPU config's placement settings
    (serialization factors, recomputation) are the model's to read: its `parallelize()` decides.

    Args:
        model: the user's model (see `places_itself`).
        ipu_config: the `IPUConfig` the model is run with.
    """

    def __init__(self, model: nn.Module, ipu_config):
        self.module = model
        self.ipu_config = ipu_config
        self.spec = None
        self.plan = StagePlan((), ipu_config.ipus_per_replica)  # read at each parallelize()
        self._undo = []
        self._laid_out = False

    def parallelize(self, devices: list[torch.device] | None = None) -> SelfPlacedModel:
        """Place the model by its own `parallelize()` for the IPU config's current mode."""
        if self.is_parallelized:
            self.deparallelize()
        self._take_over_module()
        self.module.ipu_config = self.ipu_config
        self.module.parallelize(**dict(self.ipu_config.parallelize_kwargs or {}))
        self._undo.append(self.module.deparallelize)
        self.plan = plan_from_block_marks(self.module, self.ipu_config.ipus_per_replica)
        if self.plan.ipus_per_replica > 1 and not any(block_mark(m) is not None for m in self.module.modules()):
            message = (
                f"{type(self.module).__name__}.parallelize() placed no block (no poptorch.BeginBlock): the whole "
                f"model runs on IPU 0 as PopTorch ran it, and the other {self.plan.ipus_per_replica - 1} IPU(s) of "
                "ipus_per_replica stay idle. Mark the layers that start each IPU's block with "
                "poptorch.BeginBlock(layer, name, ipu_id=k) in parallelize()."
            )
            warn_once(logger, message)
        logger.info("\n%s", self.plan.allocation_table())
        self._place_on_devices(devices or default_ipu_devices(self.plan.ipus_per_replica))
        self._laid_out = True
        return self
