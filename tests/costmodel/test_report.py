"""`CompileReport`: the text for logs, the JSON, and the files `compile_only` writes."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from fixtures import tiny_bert_config, tiny_vit_config
from transformers import BertForQuestionAnswering, ViTForImageClassification

from optimum_ipu.configuration import IPUConfig
from optimum_ipu.costmodel import CompileReport, analyse
from optimum_ipu.costmodel.report import REPORT_JSON, REPORT_PNG
from optimum_ipu.pipelining import build_stage_plan
from optimum_ipu.pipelining.spec import spec_for


@pytest.fixture(scope="module")
def report() -> CompileReport:
    with torch.device("meta"):
        model = BertForQuestionAnswering(tiny_bert_config())
    config = IPUConfig(
        layers_per_ipu=[1, 3], ipus_per_replica=2, gradient_accumulation_steps=8, replication_factor=2
    )
    plan = build_stage_plan(model, spec_for(model), config.layers_per_ipu, 2)
    return analyse(model, plan, config, micro_batch_size=2, seq_len=16, optimizer="lamb")


def test_summary_has_the_memory_table_throughput_and_bottleneck(report):
    text = report.summary()
    assert "IPU compile report" in text and "2 IPUs per replica x 2 replicas = 4 IPUs" in text
    assert "micro-batch 2 x GA 8 x replicas 2 x device iterations 1 = 32 samples per call" in text
    assert text.count(" MiB (") == 2  # one row per IPU against the limit
    assert "Estimated throughput:" in text and "<- bottleneck" in text
    assert "GA/(GA+2S-2) = 80.0%" in text


def test_summary_of_a_tied_head_shows_its_stages_and_the_shared_ipu_in_all():
    """A masked LM's head tied to the embedding is a fifth stage on IPU 0: the summary lists every
    stage, what IPU 0 does in all, and marks the bottleneck once, on a row with its IPU's whole work."""
    from transformers import BertForMaskedLM

    with torch.device("meta"):
        model = BertForMaskedLM(tiny_bert_config())
    config = IPUConfig(layers_per_ipu=[0, 2, 1, 1], ipus_per_replica=4, gradient_accumulation_steps=16)
    plan = build_stage_plan(model, spec_for(model), config.layers_per_ipu, 4)
    tied = analyse(model, plan, config, micro_batch_size=2, seq_len=16)
    text = tied.summary()
    assert [s.ipu for s in tied.performance.stages] == [0, 1, 2, 3, 0]
    assert "stage 4, IPU 0:" in text and "IPU 0 (stages 0, 4):" in text
    assert "5 pipeline stages on 4 IPUs" in text and "(GA 16 + 2x5 - 2)" in text
    assert text.count("<- bottleneck") == 1
    marked = next(line for line in text.splitlines() if "<- bottleneck" in line)
    assert f"IPU {tied.performance.bottleneck_ipu}" in marked and "stage 0, IPU 0" not in marked


def test_estimated_throughput_is_the_combined_batch_over_the_call_time_by_hand(report):
    p = report.performance
    # micro-batch 2 x GA 8 x 2 replicas x 1 device iteration, and GA + 2N - 2 = 10 cycles per update.
    assert p.samples_per_call == 32 and len(p.cycles) == 10
    call = sum(p.cycles) + p.allreduce_time + p.optimizer_time + p.host_time
    assert report.estimated_samples_per_second == pytest.approx(32 / call)
    assert report.layers_per_ipu == [1, 3]


def test_to_dict_is_json(report):
    data = json.loads(json.dumps(report.to_dict()))
    assert {"estimated_samples_per_second", "pipeline_efficiency", "bottleneck_ipu", "memory", "performance",
            "layers_per_ipu", "allocation", "hardware"} <= set(data)  # fmt: skip
    assert len(data["memory"]["ipus"]) == 2 and data["memory"]["fits"] is True
    assert {"weights", "optimizer", "stash", "temporaries", "total"} <= set(data["memory"]["ipus"][0])
    assert len(data["performance"]["stages"]) == 2 and data["performance"]["cycle_count"] == 10


def test_save_writes_json_and_png(report, tmp_path):
    json_path, png_path = report.save(tmp_path / "compiled")
    assert json_path.name == REPORT_JSON and png_path.name == REPORT_PNG
    assert (
        json.loads(json_path.read_text())["estimated_samples_per_second"]
        == report.estimated_samples_per_second
    )
    assert png_path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_png_without_matplotlib_names_the_extra_to_install(report, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without it looks like
    with pytest.raises(ImportError, match=r"pip install 'optimum-ipu\[plots\]'"):
        report.plot(tmp_path / "report.png")
    assert not (tmp_path / "report.png").exists()


def test_inference_report():
    model = BertForQuestionAnswering(tiny_bert_config())
    config = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2, inference_device_iterations=4).eval()
    plan = build_stage_plan(model, spec_for(model), config.layers_per_ipu, 2)
    sample = {
        "input_ids": torch.zeros(3, 16, dtype=torch.long),
        "attention_mask": torch.ones(3, 16, dtype=torch.long),
    }
    report = analyse(model, plan, config, micro_batch_size=3, sample_inputs=sample, training=False)
    assert report.workload.device_iterations == 4 and report.performance.samples_per_call == 12
    # Sharded, as Optimum Graphcore runs inference: each micro-batch visits IPU 0 then IPU 1, and the
    # next one starts only when it is done (no two segments overlap).
    segments = sorted(report.performance.timeline(), key=lambda s: s["start"])
    assert [(s["micro_batch"], s["ipu"]) for s in segments] == [(m, k) for m in range(4) for k in range(2)]
    for a, b in zip(segments, segments[1:]):
        assert b["start"] >= a["start"] + a["duration"] - 1e-12


def test_a_host_bound_call_is_told_what_bounds_it_the_fixed_cost_or_the_streams():
    """More samples per call amortise the host's fixed cost per call, not the streams, which grow with the
    samples: a tiny model fed 224 px images is bound by its streams (the inputs over the host links and
    the host's copies of them), a tiny text model at one sample a call by the fixed cost."""
    with torch.device("meta"):
        vit = ViTForImageClassification(tiny_vit_config(image_size=224, patch_size=32))
        bert = BertForQuestionAnswering(tiny_bert_config())
    images = IPUConfig(layers_per_ipu=[4], ipus_per_replica=1, inference_device_iterations=64).eval()
    text = IPUConfig(layers_per_ipu=[4], ipus_per_replica=1, inference_device_iterations=1).eval()
    by_streams = analyse(vit, build_stage_plan(vit, spec_for(vit), [4], 1), images, micro_batch_size=16,
                         image_size=224, training=False)  # fmt: skip
    by_overhead = analyse(bert, build_stage_plan(bert, spec_for(bert), [4], 1), text, micro_batch_size=1,
                          seq_len=16, training=False)  # fmt: skip
    p = by_streams.performance
    assert p.regime == "host-bound" and p.stream_time > p.host_time - p.stream_time
    assert "the streams bound it" in by_streams.summary() and "amortise the host" not in by_streams.summary()
    q = by_overhead.performance
    assert q.regime == "host-bound" and q.stream_time < q.host_time - q.stream_time
    assert "amortise the host's fixed cost per call" in by_overhead.summary()
