"""Cutting models into pipeline stages: cut specs, stage plans, serialized layers, `to_pipelined`."""

from optimum_ipu.pipelining.pipeline import PipelinedModel, UnsupportedModelError, to_pipelined
from optimum_ipu.pipelining.serialized import SerializedEmbedding, SerializedLinear
from optimum_ipu.pipelining.spec import CUT_SPECS, CutSpec
from optimum_ipu.pipelining.stage_plan import Block, StagePlan, build_stage_plan

__all__ = [
    "CUT_SPECS",
    "Block",
    "CutSpec",
    "PipelinedModel",
    "SerializedEmbedding",
    "SerializedLinear",
    "StagePlan",
    "UnsupportedModelError",
    "build_stage_plan",
    "to_pipelined",
]
