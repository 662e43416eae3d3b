"""The layout search: checked against exhaustive search, fixes layouts that do not fit."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import P_LAYER, synthetic, tiny_bert_config, workload
from transformers import BertConfig, BertForQuestionAnswering, ViTConfig, ViTForImageClassification

from optimum_ipu.configuration import IPUConfig
from optimum_ipu.costmodel import HARDWARE
from optimum_ipu.costmodel.analysis import plan_layout
from optimum_ipu.costmodel.hardware import CALIBRATION
from optimum_ipu.costmodel.layout_search import propose_layout
from optimum_ipu.costmodel.profile import BlockProfile, ModelProfile
from optimum_ipu.pipelining import build_stage_plan
from optimum_ipu.pipelining.spec import spec_for

BERT_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)


def _meta(cls, config):
    with torch.device("meta"):
        return cls(config)


@pytest.mark.parametrize(
    "name,build,inputs,micro_batch",
    [
        ("bert-base-ipu", lambda: _meta(BertForQuestionAnswering, BertConfig()), dict(seq_len=384), 2),
        (
            "bert-large-ipu",
            lambda: _meta(BertForQuestionAnswering, BertConfig(**BERT_LARGE)),
            dict(seq_len=384),
            2,
        ),
        (
            "vit-base-ipu",
            lambda: _meta(ViTForImageClassification, ViTConfig(num_labels=15)),
            dict(image_size=224),
            1,
        ),
    ],
)
def test_layout_search_proposes_a_fitting_override_of_the_published_config(name, build, inputs, micro_batch):
    config = IPUConfig.from_pretrained(f"Graphcore/{name}")
    proposal = plan_layout(build(), config, micro_batch_size=micro_batch, **inputs)
    assert proposal.given.layers_per_ipu == config.layers_per_ipu
    assert proposal.proposed.memory.fits and not proposal.proposed.memory.warnings
    assert sum(proposal.layers_per_ipu) == sum(config.layers_per_ipu)
    # The proposal is a valid override of the same config.
    updated = config.copy().update_from_string(proposal.overrides())
    assert updated.layers_per_ipu == proposal.layers_per_ipu
    assert updated.matmul_proportion == pytest.approx(proposal.matmul_proportion)


def _heavy(layers: int) -> ModelProfile:
    """Layers of 20 M parameters (240 MB with accumulators and Adam state): 3 of them fill an IPU."""
    profile = synthetic(layers)
    blocks = [
        BlockProfile(**{**vars(b), "parameters": 20 * P_LAYER, "trainable_parameters": 20 * P_LAYER})
        if b.kind == "layer" else b
        for b in profile.blocks
    ]  # fmt: skip
    return ModelProfile(blocks, profile.transfers, 1, 2, profile.input_bytes, True)


def test_layout_search_repairs_a_layout_that_does_not_fit():
    profile = _heavy(8)
    w = workload(ipus_per_replica=4, gradient_accumulation_steps=16)
    given = profile.placement([5, 1, 1, 1], 4)
    proposal = propose_layout(profile, given, w, HARDWARE["mk2"])
    assert not proposal.given.memory.fits
    assert proposal.proposed.memory.fits
    assert math.isinf(proposal.speedup)
    assert max(proposal.layers_per_ipu) - min(proposal.layers_per_ipu) <= 1


def test_layout_search_reports_no_layout_when_nothing_fits():
    profile = _heavy(8)
    w = workload(ipus_per_replica=1, matmul_proportion=(0.2,))
    proposal = propose_layout(profile, profile.placement([8], 1), w, HARDWARE["mk2"])
    assert proposal.proposed is proposal.given and not proposal.proposed.memory.fits
    assert proposal.layouts_timed == 0


def test_proposed_placement_is_the_one_build_stage_plan_makes():
    model = BertForQuestionAnswering(tiny_bert_config())
    config = IPUConfig(layers_per_ipu=[3, 1], ipus_per_replica=2, gradient_accumulation_steps=8)
    proposal = plan_layout(model, config, micro_batch_size=2, seq_len=16)
    plan = build_stage_plan(model, spec_for(model), proposal.layers_per_ipu, 2)
    assert dict(proposal.proposed.allocation) == {b.name: b.ipu for b in plan.blocks}
    text = proposal.summary()
    assert "given" in text and "proposed" in text and "--ipu_config_overrides" in text
    assert set(proposal.to_dict()) >= {"layers_per_ipu", "matmul_proportion", "speedup", "given", "proposed"}


def test_layout_search_handles_inference_and_another_pipeline_length():
    model = BertForQuestionAnswering(tiny_bert_config())
    config = IPUConfig(layers_per_ipu=[3, 1], ipus_per_replica=2).eval()
    proposal = plan_layout(model, config, micro_batch_size=2, seq_len=16, training=False, ipus_per_replica=4)
    assert len(proposal.layers_per_ipu) == 4 and sum(proposal.layers_per_ipu) == 4
    assert not proposal.proposed.workload.training


@pytest.mark.parametrize("tied_head", [False, True])
def test_layout_search_finds_the_best_layout_an_exhaustive_search_finds(tied_head):
    """A second implementation: price every split of 8 layers over 4 IPUs with every matmul proportion
    the layout search may choose, and check the layout search's proposal is as fast as the best of them; also with
    a head tied to the embedding, whose last pipeline stage comes back to IPU 0 with work of its own."""
    import dataclasses
    from itertools import product

    from optimum_ipu.costmodel.memory import estimate_memory
    from optimum_ipu.costmodel.profile import Matmul
    from optimum_ipu.costmodel.report import report_for

    profile = _heavy(8)
    if tied_head:
        head = dataclasses.replace(
            profile.blocks[-1], on_first_ipu=True, matmuls=[Matmul(1, 512, 1024, 4096)]
        )
        profile = dataclasses.replace(profile, blocks=profile.blocks[:-1] + [head])
    w = workload(ipus_per_replica=4, gradient_accumulation_steps=16)
    mk2 = HARDWARE["mk2"]
    proposal = propose_layout(profile, profile.placement([2, 2, 2, 2], 4), w, mk2)
    best = 0.0
    for counts in product(range(9), repeat=4):
        if sum(counts) != 8:
            continue
        placement = profile.placement(list(counts), 4)
        for proportion in (0.05, 0.1, 0.2):
            trial = w.with_matmul_proportion(proportion)
            if estimate_memory(profile, placement, trial, mk2).fits:
                best = max(best, report_for(profile, placement, trial, mk2).estimated_samples_per_second)
    assert proposal.proposed.estimated_samples_per_second >= best * (1 - 0.03)


def test_a_proposal_says_that_the_memory_model_not_a_measurement_makes_it_fit():
    profile = _heavy(8)
    w = workload(ipus_per_replica=4, gradient_accumulation_steps=16)
    repaired = propose_layout(profile, profile.placement([5, 1, 1, 1], 4), w, HARDWARE["mk2"])
    note = repaired.fit_note
    assert note and "memory model, not by a measurement" in note and "Compile it" in note
    assert note in repaired.summary() and repaired.to_dict()["fit_note"] == note
    # Nothing to say when the given layout stays (here: nothing fits at all).
    stuck = propose_layout(profile, profile.placement([8], 1), workload(ipus_per_replica=1), HARDWARE["mk2"])
    assert stuck.proposed is stuck.given and stuck.fit_note is None


def test_on_bert_large_a_higher_matmul_proportion_is_never_slower_and_the_layout_search_uses_it():
    from optimum_ipu.costmodel.memory import estimate_memory
    from optimum_ipu.costmodel.performance import estimate_performance
    from optimum_ipu.costmodel.presets import resolve_model
    from optimum_ipu.costmodel.shipped import load_shipped

    source = resolve_model("bert-large-uncased")
    profile = load_shipped(source.config, source.builder, micro_batch=8, seq_len=384, image_size=None,
                           training=True, float_bytes=2)  # fmt: skip
    placement = profile.placement([3, 7, 7, 7], 4)
    base = workload(micro_batch_size=8, ipus_per_replica=4, gradient_accumulation_steps=16)
    speeds, temporaries = [], []
    for proportion in (0.02, 0.05, 0.1, 0.2, 0.4, 0.8):
        w = base.with_matmul_proportion(proportion)
        speeds.append(estimate_performance(profile, placement, w, HARDWARE["mk2"]).samples_per_second)
        temporaries.append(estimate_memory(profile, placement, w, HARDWARE["mk2"]).ipus[1].temporaries)
    assert speeds == sorted(speeds) and speeds[-1] > 1.05 * speeds[0]
    assert temporaries == sorted(temporaries) and temporaries[-1] > temporaries[0]
    # At micro-batch 4 the layout search gives the IPUs more than the 0.05 floor, each as much as its
    # memory leaves, and is faster for it than the same layout at 0.05.
    profile = load_shipped(source.config, source.builder, micro_batch=4, seq_len=384, image_size=None,
                           training=True, float_bytes=2)  # fmt: skip
    from optimum_ipu.costmodel.workload import Workload

    published = IPUConfig.from_pretrained("Graphcore/bert-large-ipu").for_n_ipu(16)
    floor = Workload.from_ipu_config(published, micro_batch_size=4).with_matmul_proportion(0.05)
    proposal = propose_layout(profile, profile.placement([3, 7, 7, 7], 4), floor, HARDWARE["mk2"])
    assert proposal.proposed.memory.fits
    assert min(proposal.matmul_proportion) > 0.05 and len(set(proposal.matmul_proportion)) > 1
    at_floor = estimate_performance(
        profile, profile.placement(proposal.layers_per_ipu, 4), floor, HARDWARE["mk2"]
    )
    assert proposal.proposed.estimated_samples_per_second > at_floor.samples_per_second


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("counts", [[2, 2, 2, 2], [1, 3, 3, 1], [3, 2, 3, 0], [8, 0, 0, 0]])
def test_the_layout_search_prices_a_layout_as_the_performance_model_does_with_a_tied_head(training, counts):
    """The layout search times candidate layouts from per-IPU options; with a head tied to the embedding
    (one stage more than IPUs, the last IPU recomputing, unless every layer is on IPU 0 so the
    forward never leaves it) that must equal the full estimate."""
    import dataclasses

    from optimum_ipu.costmodel.layout_search import _Pricer
    from optimum_ipu.costmodel.memory import table_shares
    from optimum_ipu.costmodel.performance import estimate_performance
    from optimum_ipu.costmodel.profile import Matmul

    profile = synthetic(8)
    head = dataclasses.replace(profile.blocks[-1], on_first_ipu=True, matmuls=[Matmul(1, 512, 1024, 4096)])
    profile = dataclasses.replace(profile, blocks=profile.blocks[:-1] + [head])
    w = workload(ipus_per_replica=4, gradient_accumulation_steps=16, training=training, device_iterations=8,
                 pipelined_inference=True)  # fmt: skip
    mk2 = HARDWARE["mk2"]
    placement = profile.placement(counts, 4)
    pricer = _Pricer(profile, w, mk2, CALIBRATION, table_shares(profile, placement, w))
    bounds = [sum(counts[:k]) for k in range(5)]
    ranges = list(zip(bounds, bounds[1:]))
    returns = pricer.returns(ranges)
    options = [pricer.option(k, a, b, returns) for k, (a, b) in enumerate(ranges)]
    chosen = w.with_matmul_proportion([o.proportion for o in options])
    report = estimate_performance(profile, placement, chosen, mk2)
    assert len(report.stages) == (4 if counts[0] == 8 else 5)
    expected = report.update_time if training else sum(report.cycles)
    assert pricer.seconds(ranges) == pytest.approx(expected, rel=1e-12)
