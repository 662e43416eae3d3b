"""Per-IPU memory: hand-computed formulas, monotonic behaviour, published layouts under load, bad ones fail."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import IDS, MATMUL, OUT, P_LAYER, P_TABLE, SAVED, synthetic, workload
from transformers import BertConfig, BertForQuestionAnswering, ViTConfig, ViTForImageClassification

from optimum_ipu.configuration import IPUConfig
from optimum_ipu.costmodel import HARDWARE, IPUOutOfMemoryError, analyse
from optimum_ipu.costmodel.hardware import MEMORY_CALIBRATION
from optimum_ipu.costmodel.memory import (
    MiB,
    estimate_memory,
    matmul_temporary_bytes,
    serialization_pieces,
)
from optimum_ipu.costmodel.profile import BlockProfile, Matmul, ModelProfile
from optimum_ipu.costmodel.report import report_for
from optimum_ipu.costmodel.workload import StateTypes
from optimum_ipu.pipelining import build_stage_plan
from optimum_ipu.pipelining.spec import spec_for

MK2 = HARDWARE["mk2"]
CAPACITY = MK2.memory_bytes


def memory(layers_per_ipu=(2, 2), **changes):
    profile = synthetic(sum(layers_per_ipu))
    w = workload(ipus_per_replica=len(layers_per_ipu), **changes)
    return estimate_memory(profile, profile.placement(list(layers_per_ipu), len(layers_per_ipu)), w, MK2)


def test_matmul_temporaries_follow_the_three_dimensional_partition():
    mm = Matmul(1, 64, 64, 64)
    expected = 3 * (64**3) ** (2 / 3) * 1472 ** (1 / 3) * 2
    assert matmul_temporary_bytes(mm, 1472, 2) == pytest.approx(expected, abs=1)
    many = Matmul(2000, 4, 4, 4)  # more products than tiles: each operand once
    assert matmul_temporary_bytes(many, 1472, 2) == 2000 * 3 * 16 * 2
    assert matmul_temporary_bytes(Matmul(1, 8, 64, 1024), 1472, 2, pieces=4) < matmul_temporary_bytes(
        Matmul(1, 8, 64, 1024), 1472, 2
    )
    assert serialization_pieces(8, 2) == 8 and serialization_pieces(2, 8) == 1


def test_memory_formulas_by_hand():
    report = memory()
    first, last = report.ipus
    need = matmul_temporary_bytes(MATMUL, MK2.tiles, 2)
    assert first.code == MEMORY_CALIBRATION.code_bytes_per_ipu
    assert first.weights == (P_TABLE + 2 * P_LAYER) * 2
    assert first.gradients == first.weights  # GA 8 > 1: one fp16 accumulator per weight
    assert (
        first.optimizer == (P_TABLE + 2 * P_LAYER) * 6
    )  # Optimum Graphcore's fp16 first, fp32 second moment
    assert first.update == 0  # optimizer state on chip: nothing streamed for the update
    assert first.stash == 3 * IDS  # 2(N-k)-1 = 3 micro-batches of the stage input
    assert first.activations == 2 * SAVED  # recomputing the whole stage for one micro-batch
    assert first.temporaries == min(need, int(0.2 * CAPACITY)) + P_TABLE * 2  # + the table's gradient
    assert last.stash == OUT  # the last IPU keeps one micro-batch
    assert last.activations == 2 * SAVED
    assert report.fits and report.capacity == 1472 * 638_976


def test_a_tied_head_deepens_every_stash_and_holds_its_own_input_once():
    """With the head tied to the embedding the pipeline has S = N + 1 stages: IPU 0's first stage stashes
    2S-1 micro-batches of its input, the last IPU is no longer last (it stashes 3 and recomputes), and
    the head's stage on IPU 0 runs forward and backward in one cycle, so its input is held once."""
    import dataclasses

    profile = synthetic(4)
    head = dataclasses.replace(profile.blocks[-1], on_first_ipu=True)
    profile = dataclasses.replace(profile, blocks=profile.blocks[:-1] + [head])
    first, last = estimate_memory(
        profile, profile.placement([2, 2], 2), workload(ipus_per_replica=2), MK2
    ).ipus
    assert first.stash == 5 * IDS + OUT  # S = 3: 2S-1 = 5 of the embedding's input, 1 of the head's
    assert last.stash == 3 * OUT  # no longer the last stage: it stashes 2(S-1)-1 = 3 and recomputes


def test_recompute_checkpoints_stash_layer_outputs_and_keep_one_layer():
    first, last = memory(recompute_checkpoint_every_layer=True).ipus
    assert first.stash == 3 * (
        IDS + OUT
    )  # stage input + checkpoint after layer 0 (layer 1 is the stage output)
    assert first.activations == SAVED and last.activations == SAVED


def test_optimizer_state_options():
    base = memory().ipus[0].optimizer
    assert memory(optimizer_state_offchip=True).ipus[0].optimizer == 0
    assert memory(replicated_tensor_sharding=True, replication_factor=4).ipus[0].optimizer == base // 4
    assert memory(replicated_tensor_sharding=True, replication_factor=1).ipus[0].optimizer == base
    assert memory(state_types=StateTypes.all_fp32()).ipus[0].optimizer == base * 8 // 6
    assert memory(optimizer="sgd").ipus[0].optimizer == 0
    assert memory(gradient_accumulation_steps=1).ipus[0].gradients == 0


def test_state_types_are_optimum_graphcores_for_the_precision():
    """Optimum Graphcore 0.7's create_optimizer: fp16 runs keep the accumulator and first moment in fp16,
    the second in fp32 (2 + 2 + 4 bytes); --fp32 keeps all three in fp32; PopTorch's defaults are fp32."""
    assert workload().state_types == StateTypes(2, 2, 4) and workload().optimizer_state_bytes == 6
    assert workload(fp32=True).state_types == StateTypes(4, 4, 4)
    fp32_accumulator = memory(state_types=StateTypes(4, 2, 4)).ipus[0]
    assert fp32_accumulator.gradients == 2 * memory().ipus[0].gradients


def _with_largest_tensor(profile, elements):
    import dataclasses

    blocks = [dataclasses.replace(b, largest_trainable_tensor=elements if b.kind == "layer" else 0)
              for b in profile.blocks]  # fmt: skip
    return dataclasses.replace(profile, blocks=blocks)


def test_off_chip_state_is_streamed_in_one_tensor_at_a_time_for_the_update():
    """The update runs after the pipeline has drained: the largest tensor's state streamed in takes turns
    with the activations and temporaries, on top of what is always live."""
    profile = _with_largest_tensor(synthetic(4), 300_000)
    w = workload(optimizer_state_offchip=True)
    first, last = estimate_memory(profile, profile.placement([2, 2], 2), w, MK2).ipus
    assert last.optimizer == 0 and last.update == 300_000 * 6  # one layer tensor's fp16 + fp32 moments
    assert first.update == P_TABLE * 6  # the table (500,000) is the largest tensor on IPU 0
    always = last.code + last.weights + last.gradients + last.stash
    assert last.total == always + max(last.activations + last.temporaries, last.update)
    huge = _with_largest_tensor(synthetic(4), 200_000_000)
    big = estimate_memory(huge, huge.placement([2, 2], 2), w, MK2).ipus[1]
    assert (
        big.update > big.activations + big.temporaries
        and big.total == big.code + big.weights + big.gradients + big.stash + big.update
    )
    shared = estimate_memory(profile, profile.placement([2, 2], 2), w.replace(replicated_tensor_sharding=True,
                             replication_factor=4), MK2).ipus[1]  # fmt: skip
    assert shared.update == last.update // 4  # each replica streams its shard
    pieces = estimate_memory(profile, profile.placement([2, 2], 2), w.replace(embedding_factor=4), MK2).ipus[
        0
    ]
    assert pieces.update == 300_000 * 6  # the table in 4 pieces of 125,000: a layer tensor is now the largest
    assert memory(optimizer_state_offchip=True, optimizer="sgd").ipus[0].update == 0


def test_verdict_band_is_the_models_error_and_the_check_decides_what_refuses():
    """Within the model's error of the limit an IPU may or may not fit; beyond it, it is out of memory.
    margin (the default) refuses only beyond the error, strict any estimate over the limit, off never."""
    import dataclasses

    report = memory()
    m = report.ipus[0]
    error = report.error
    assert error == MEMORY_CALIBRATION.error > 0

    def at(fraction):
        extra = int(fraction * CAPACITY) - m.total
        ipu = dataclasses.replace(m, stash=m.stash + extra)
        return dataclasses.replace(report, ipus=[ipu, report.ipus[1]])

    assert at(0.99 / (1 + error)).verdict(at(0.99 / (1 + error)).ipus[0]) == "fits"
    near_under, near_over = at(1.01 / (1 + error)), at(0.99 / (1 - error))
    for near in (near_under, near_over):
        assert near.may_not_fit == [0] and not near.surely_out_of_memory
        near.raise_if_out_of_memory("margin")  # goes ahead
        near.raise_if_out_of_memory("off")
    near_under.raise_if_out_of_memory("strict")  # under the limit: fits by the estimate
    with pytest.raises(IPUOutOfMemoryError, match=r"over the limit \(memory_check=strict\)"):
        near_over.raise_if_out_of_memory("strict")
    beyond = at(1.01 / (1 - error))
    assert beyond.surely_out_of_memory == [0] and beyond.verdict(beyond.ipus[0]) == "out of memory"
    with pytest.raises(IPUOutOfMemoryError, match=r"by more than the memory model's error of ±20%"):
        beyond.raise_if_out_of_memory()
    beyond.raise_if_out_of_memory("off")
    assert "MAY NOT FIT" in near_over.table() and "OUT OF MEMORY" in beyond.table()
    with pytest.raises(ValueError, match="choose one of margin, strict, off"):
        beyond.raise_if_out_of_memory("lenient")


def test_weights_accumulators_and_state_over_the_limit_are_out_of_memory_whatever_the_error():
    """Physics stays: those are counted exactly, so no error band can make them fit."""
    import dataclasses

    report = memory()
    m = report.ipus[0]
    exact = dataclasses.replace(m, code=0, stash=0, activations=0, temporaries=0, weights=CAPACITY // 2,
                                gradients=CAPACITY // 4, optimizer=CAPACITY // 3)  # fmt: skip
    heavy = dataclasses.replace(report, ipus=[exact, report.ipus[1]])
    assert exact.total < CAPACITY / (1 - report.error)  # within the error band by the total alone
    assert heavy.verdict(exact) == "out of memory" and heavy.surely_out_of_memory == [0]


def test_inference_holds_no_optimizer_gradients_or_stash_depth():
    first, _ = memory(training=False).ipus
    assert first.gradients == first.optimizer == 0
    assert first.stash == IDS


def test_embedding_splits_spread_the_table():
    whole = memory()
    split = memory(embedding_splits_per_ipu=(1, 1), embedding_factor=2)
    assert split.ipus[0].weights == whole.ipus[0].weights - P_TABLE  # half of the 2-byte table moved
    assert split.ipus[1].weights == whole.ipus[1].weights + P_TABLE


def test_more_layers_on_an_ipu_need_more_memory_there():
    totals = [memory((n, 6 - n)).ipus[0].total for n in range(1, 6)]
    assert totals == sorted(totals) and len(set(totals)) == len(totals)


def test_near_limit_warns():
    profile = synthetic(4)
    w = workload(ipus_per_replica=1)
    base = estimate_memory(profile, profile.placement([4], 1), w, MK2).ipus[0].total
    extra = int(0.95 * CAPACITY) - base  # brings the IPU to 95%: fits, but not with a safe margin
    heavy = ModelProfile(
        [BlockProfile(**{**vars(b), "saved_bytes": extra if b.name == "Head" else b.saved_bytes}) for b in profile.blocks],
        profile.transfers, 1, 2, IDS, True,
    )  # fmt: skip
    report = estimate_memory(heavy, heavy.placement([4], 1), w, MK2)
    assert report.fits
    assert any("IPU 0 is at 95% of its memory" in text for text in report.warnings)


def test_over_limit_raises_with_table_and_advice():
    profile = synthetic(4)
    heavy = ModelProfile(
        [BlockProfile(**{**vars(b), "saved_bytes": 200 * MiB if b.kind == "layer" else 0}) for b in profile.blocks],
        profile.transfers, 1, 2, IDS, True,
    )  # fmt: skip
    report = report_for(heavy, heavy.placement([4], 1), workload(ipus_per_replica=1), MK2).memory
    with pytest.raises(IPUOutOfMemoryError) as error:
        report.raise_if_out_of_memory("strict")
    text = str(error.value)
    assert text.startswith(
        f"Out of memory on IPU 0: {report.ipus[0].total:,} bytes used but IPUs only have {CAPACITY:,}"
    )
    assert "weights" in text and "optimizer" in text and "temporaries" in text
    assert "recompute_checkpoint_every_layer=True" in text


# -- real architectures, published configs ---------------------------------------------------------


def _bert(large: bool):
    size = (
        dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
        if large
        else {}
    )
    with torch.device("meta"):
        return BertForQuestionAnswering(BertConfig(**size))


def _analyse(model, config, micro_batch, **inputs):
    plan = build_stage_plan(model, spec_for(model), config.layers_per_ipu, config.ipus_per_replica)
    return analyse(model, plan, config, micro_batch_size=micro_batch, **inputs)


def test_published_bert_large_layout_fills_with_the_micro_batch_until_it_runs_out():
    """What a bigger micro-batch does to Graphcore's BERT-Large layout: weights, optimizer state and
    code stay, stash and activations grow in proportion, and past some size an IPU runs out."""
    from optimum_ipu.costmodel.presets import resolve_model
    from optimum_ipu.costmodel.shipped import load_shipped
    from optimum_ipu.costmodel.workload import Workload

    source = resolve_model("bert-large-uncased")
    config = IPUConfig.from_pretrained("Graphcore/bert-large-ipu").for_n_ipu(16)
    reports = {}
    for micro_batch in (1, 2, 4, 8):
        profile = load_shipped(source.config, source.builder, micro_batch=micro_batch, seq_len=384,
                               image_size=None, training=True, float_bytes=2)  # fmt: skip
        w = Workload.from_ipu_config(config, micro_batch_size=micro_batch)
        reports[micro_batch] = estimate_memory(profile, profile.placement(config.layers_per_ipu, 4), w, MK2)
    one = reports[1]
    assert one.fits  # the layout Graphcore shipped, at its micro-batch
    for micro_batch, report in reports.items():
        for k, (base, m) in enumerate(zip(one.ipus, report.ipus)):
            assert (m.weights, m.optimizer, m.code) == (base.weights, base.optimizer, base.code)
            assert m.stash == pytest.approx(micro_batch * base.stash, rel=0.01), (micro_batch, k)
            assert m.activations >= base.activations
    totals = [max(m.total for m in r.ipus) for r in reports.values()]
    assert totals == sorted(totals)
    assert reports[4].fits and not reports[8].fits and reports[8].out_of_memory


def test_vit_memory_grows_with_the_image_not_the_weights():
    with torch.device("meta"):
        model = ViTForImageClassification(ViTConfig(num_labels=15))
    config = IPUConfig.from_pretrained("Graphcore/vit-base-ipu")
    small, large = (_analyse(model, config, 1, image_size=size).memory for size in (224, 384))
    assert small.fits
    for a, b in zip(small.ipus, large.ipus):
        assert a.weights == b.weights and a.optimizer == b.optimizer
        assert b.activations > a.activations and b.stash > a.stash


def test_bert_large_on_one_ipu_is_out_of_memory_with_advice():
    config = IPUConfig.from_pretrained(
        "Graphcore/bert-large-ipu", layers_per_ipu=[24], ipus_per_replica=1, matmul_proportion=0.2,
        inference_layers_per_ipu=[24], inference_ipus_per_replica=1,
    )  # fmt: skip
    report = _analyse(_bert(True), config, 2, seq_len=384)
    with pytest.raises(
        IPUOutOfMemoryError, match=r"Out of memory on IPU 0: [\d,]+ bytes used but IPUs only have"
    ):
        report.memory.raise_if_out_of_memory()
    assert isinstance(IPUOutOfMemoryError("x"), MemoryError)
    assert report.memory.ipus[0].weights > 600 * MiB  # 334 M fp16 weights
    assert any("ipus_per_replica=2" in a for a in report.memory.advice)


def test_rts_and_offchip_free_optimizer_memory_on_bert_large():
    model = _bert(True)
    base = IPUConfig.from_pretrained(
        "Graphcore/bert-large-ipu", optimizer_state_offchip=False, replicated_tensor_sharding=False
    ).for_n_ipu(16)
    on_chip = _analyse(model, base, 2, seq_len=384).memory
    rts = _analyse(model, base.copy().update(replicated_tensor_sharding=True), 2, seq_len=384).memory
    off = _analyse(model, base.copy().update(optimizer_state_offchip=True), 2, seq_len=384).memory
    for k in range(4):
        assert math.isclose(rts.ipus[k].optimizer, on_chip.ipus[k].optimizer / 4, rel_tol=1e-6)
        assert off.ipus[k].optimizer == 0 < on_chip.ipus[k].optimizer
