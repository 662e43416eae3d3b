"""`optimum.graphcore.modeling_utils`: `to_pipelined`, `get_layer_ipu`, `Pipelined*` (optimum_ipu/compat/modeling.py)."""

import pytest
import torch
from fixtures import seeded, tiny_bert_config
from transformers import BertForQuestionAnswering

from optimum.graphcore import (
    IPUConfig,
    PipelinedBertForQuestionAnswering,
    PipelinedConvNextForImageClassification,
)
from optimum.graphcore.ipu_configuration import IncompatibleIPUConfigError
from optimum.graphcore.modeling_utils import get_layer_ipu, to_pipelined
from optimum_ipu.compat import NoEquivalentError


def tiny_qa_model() -> BertForQuestionAnswering:
    seeded(0)
    return BertForQuestionAnswering(tiny_bert_config()).eval()


def inputs():
    ids = torch.randint(5, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_to_pipelined_keeps_the_notebook_call_pattern_and_the_math():
    model = tiny_qa_model()
    expected = model(**inputs()).start_logits
    config = IPUConfig(layers_per_ipu=[1, 3], ipus_per_replica=2, embedding_serialization_factor=2)

    pipelined = to_pipelined(model, config).parallelize()  # Optimum Graphcore's chain
    assert pipelined.config is model.config and pipelined.ipu_config is config
    assert [b.ipu for b in pipelined.pipelined.plan.layer_blocks] == [0, 1, 1, 1]
    with torch.no_grad():
        torch.testing.assert_close(pipelined(**inputs()).start_logits, expected)
    assert pipelined.eval() is pipelined  # model methods pass through; those returning the model chain
    assert not model.training

    pipelined.deparallelize()
    assert type(model.bert.embeddings.word_embeddings) is torch.nn.Embedding


def test_module_methods_chain_on_the_view_before_and_after_parallelize(caplog):
    """Notebooks write `to_pipelined(model, config).half().parallelize()` (mt5_xnli) and
    `.parallelize().half()` (whisper): each step keeps the view, so parallelize is still there."""
    model = tiny_qa_model()
    config = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2)
    pipelined = to_pipelined(model, config).half().parallelize().train().eval()
    assert pipelined.pipelined.is_parallelized and not model.training
    assert next(model.parameters()).dtype == torch.float16
    assert pipelined.float().deparallelize() is pipelined
    assert pipelined.num_parameters() == model.num_parameters()  # other results are the module's


def test_detach_from_device_on_a_view_says_once_that_it_frees_nothing(caplog):
    pipelined = to_pipelined(tiny_qa_model(), IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2)).parallelize()
    with caplog.at_level("WARNING"):
        pipelined.detachFromDevice()
        pipelined.detachFromDevice()
    assert caplog.text.count("frees nothing") <= 1  # once per process (an earlier test may have said it)
    with torch.no_grad():
        assert pipelined(**inputs()).start_logits.shape == (2, 12)


def test_parallelize_options_of_the_original_models_are_ignored_with_a_warning(caplog):
    pipelined = to_pipelined(tiny_qa_model(), IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2))
    with caplog.at_level("WARNING"):
        pipelined.parallelize(use_cache=True)
    assert "use_cache" in caplog.text and "no effect" in caplog.text


def test_force_places_an_architecture_without_a_cut_spec():
    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(4))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2)
    with pytest.raises(ValueError, match="force_to_pipelined=True"):
        to_pipelined(Stack(), config)
    view = to_pipelined(Stack(), config, force=True).parallelize()
    assert [b.ipu for b in view.pipelined.plan.layer_blocks] == [0, 0, 1, 1]


def test_get_layer_ipu_follows_the_layers_per_ipu_rule():
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2), 6) == [0, 0, 0, 1, 1, 1]
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[-1, 2, -1, 2], ipus_per_replica=4), 7) == [
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[0, 2, 2], ipus_per_replica=3)) == [1, 1, 2, 2]
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[1, 1], ipus_per_replica=2), [1, 1]) == [0, 1]
    with pytest.raises(ValueError, match="target_number_of_layers"):
        get_layer_ipu(IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2))


def test_get_layer_ipu_reads_the_layers_of_the_config_mode():
    config = IPUConfig(layers_per_ipu=[2, 2], inference_layers_per_ipu=[4])
    assert get_layer_ipu(config, 4) == [0, 0, 1, 1]
    assert get_layer_ipu(config.eval(), 4) == [0, 0, 0, 0]


def test_layers_that_do_not_fit_the_model_raise_incompatible_ipu_config_error():
    # Optimum Graphcore raised its IncompatibleIPUConfigError here; `except` clauses for it must still catch.
    for count in (2, 4):
        with pytest.raises(IncompatibleIPUConfigError, match=r"layers_per_ipu=\[1, 2\] places 3 layers"):
            get_layer_ipu(IPUConfig(layers_per_ipu=[1, 2]), count)


def test_pipelined_classes_build_from_transformers_models(tmp_path):
    config = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2)
    model = tiny_qa_model()
    view = PipelinedBertForQuestionAnswering.from_transformers(model, config).parallelize()
    assert view.pipelined.module is model

    model.save_pretrained(tmp_path)
    loaded = PipelinedBertForQuestionAnswering.from_pretrained_transformers(str(tmp_path), config)
    assert type(loaded.pipelined.module) is BertForQuestionAnswering

    with pytest.raises(NoEquivalentError, match=r"transformers.BertForQuestionAnswering\(config\)"):
        PipelinedBertForQuestionAnswering(model.config)
    with pytest.raises(NoEquivalentError, match=r"force=True"):
        PipelinedConvNextForImageClassification.from_transformers(model, config)


@pytest.mark.parametrize("chain", ["parallelize", "eval_half_parallelize"])
def test_poptorch_wraps_a_pipelined_view_as_optimum_graphcores_inference_notebooks_do(chain):
    """`poptorch.inferenceModel(to_pipelined(model, ipu_config).parallelize(), opts)` (the DeBERTa and
    wav2vec2 inference notebooks, run_inference_ctc.py): the view's module runs on the config's IPUs and
    computes what plain transformers computes."""
    import poptorch

    model = tiny_qa_model()
    ids = torch.randint(5, 128, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=torch.ones_like(ids)).start_logits
    config = IPUConfig(layers_per_ipu=[1, 3], ipus_per_replica=2, inference_device_iterations=2).eval()
    view = to_pipelined(model, config)
    view = view.parallelize() if chain == "parallelize" else view.eval().half().parallelize()
    wrapped = poptorch.inferenceModel(view, config.to_options(for_inference=True))
    out = wrapped(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert wrapped.num_ipus == 2
    tolerance = {} if chain == "parallelize" else {"atol": 1e-2, "rtol": 1e-2}
    torch.testing.assert_close(out.start_logits.float(), expected, **tolerance)
    view.deparallelize()
    assert "BeginBlock" not in poptorch.module_repr(model)
