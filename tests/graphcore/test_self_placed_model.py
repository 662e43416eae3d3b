"""A user's own model that places itself (`class MyModel(MyBase, PipelineMixin)` with its own `parallelize()`),
trained by `IPUTrainer` as Optimum Graphcore's external_model notebook does: the trainer calls the model's
`parallelize()` and runs the blocks where its `BeginBlock`s put them (optimum_ipu/pipelining/self_placed.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import Trainer, TrainingArguments

import poptorch
from optimum.graphcore import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum.graphcore.modeling_utils import PipelineMixin, get_layer_ipu, recomputation_checkpoint

BLOCK, VOCAB = 8, 32


class TinyTransformer(nn.Module):
    """The notebook's model in small: embeddings, an `nn.TransformerEncoder`, a head tied to the word embedding."""

    def __init__(self, layers: int = 4, d_model: int = 16):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, d_model)
        self.position_embeddings = nn.Embedding(BLOCK, d_model)
        layer = nn.TransformerEncoderLayer(d_model, 2, 2 * d_model, dropout=0.0, batch_first=True)
        self.transformer_encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.lm_head = nn.Linear(d_model, VOCAB)
        self.lm_head.weight = self.word_embeddings.weight

    def forward(self, input_ids, labels=None):
        positions = torch.arange(input_ids.shape[-1]).unsqueeze(0)
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        causal = nn.Transformer.generate_square_subsequent_mask(input_ids.shape[-1], dtype=hidden.dtype)
        logits = self.lm_head(self.transformer_encoder(hidden, causal))
        if labels is None:
            return (logits,)
        labels = torch.roll(labels, -1, 1)
        labels[:, -1] = -100
        return (nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1)),)


class IPUTinyTransformer(TinyTransformer, PipelineMixin):
    """Placed as the notebook places its model: embeddings and head on IPU 0, the layers by `layers_per_ipu`."""

    def parallelize(self):
        super().parallelize()
        self.word_embeddings = poptorch.BeginBlock(self.word_embeddings, "word_embeddings", ipu_id=0)
        self.position_embeddings = poptorch.BeginBlock(self.position_embeddings, "position_embeddings", ipu_id=0)
        layer_ipu = get_layer_ipu(self.ipu_config, self.transformer_encoder.layers)
        for index, layer in enumerate(self.transformer_encoder.layers):
            if self.ipu_config.recompute_checkpoint_every_layer:
                self._hooks.append(recomputation_checkpoint(layer))
            self.transformer_encoder.layers[index] = poptorch.BeginBlock(layer, f"Encoder{index}", ipu_id=layer_ipu[index])
        self.lm_head = poptorch.BeginBlock(self.lm_head, "lm_head", ipu_id=0)
        return self


class Texts(torch.utils.data.Dataset):
    def __init__(self, rows: int = 40, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (rows, BLOCK), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def four_ipus(**values) -> IPUConfig:
    return IPUConfig.from_dict({
        "layers_per_ipu": [0, 2, 1, 1], "ipus_per_replica": 4, "gradient_accumulation_steps": 10,
        "recompute_checkpoint_every_layer": True, "inference_device_iterations": 2, **values,
    })  # fmt: skip


def _args(cls, tmp_path, **values):
    common = dict(learning_rate=1e-2, num_train_epochs=1, logging_steps=1, save_strategy="no", report_to="none",
                  seed=3, use_cpu=True, dataloader_num_workers=0, optim="sgd", per_device_eval_batch_size=2)  # fmt: skip
    return cls(output_dir=str(tmp_path / cls.__name__), **{**common, **values})


def _losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_get_layer_ipu_takes_the_layer_list_as_optimum_graphcore_did():
    """The notebooks pass the layers themselves (`self.transformer_encoder.layers`); their count is what counts."""
    layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(4))
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2)
    assert get_layer_ipu(config, layers) == [0, 0, 1, 1]
    assert get_layer_ipu(config, list(layers)) == [0, 0, 1, 1]


def test_iputrainer_trains_a_model_that_places_itself_as_plain_transformers_trains_it(tmp_path):
    torch.manual_seed(0)
    model = IPUTinyTransformer()
    reference = TinyTransformer()
    reference.load_state_dict(copy.deepcopy(model.state_dict()))
    data = Texts()

    plain = Trainer(reference, _args(TrainingArguments, tmp_path, per_device_train_batch_size=10), train_dataset=data)
    plain.train()
    trainer = IPUTrainer(model=model, ipu_config=four_ipus(), train_dataset=data, eval_dataset=data,
                         args=_args(IPUTrainingArguments, tmp_path, per_device_train_batch_size=1, fp32=True))  # fmt: skip
    trainer.train()

    # The model's own placement is the one run: 4 IPUs, its block names, the tied head back on IPU 0.
    plan = trainer._pipelined.plan
    assert plan.ipus_per_replica == 4
    assert [(b.name, b.ipu) for b in plan.blocks] == [
        ("word_embeddings", 0), ("position_embeddings", 0), ("Encoder0", 1), ("Encoder1", 1), ("Encoder2", 2),
        ("Encoder3", 3), ("lm_head", 0),
    ]  # fmt: skip
    assert plan.forward_stages == 5  # the head back on IPU 0 is a fifth stage to fill (GA >= 9)
    assert trainer.state.global_step == 4  # micro-batch 1 x GA 10 = the plain Trainer's batch of 10
    torch.testing.assert_close(_losses(trainer), _losses(plain), atol=1e-5, rtol=1e-5)
    for (name, a), (_, b) in zip(reference.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)

    # Validation after training, in the inference layout (the model placed again, its blocks not doubled).
    metrics = trainer.evaluate()
    expected = Trainer(reference, _args(TrainingArguments, tmp_path), eval_dataset=data).evaluate()
    assert metrics["eval_loss"] == pytest.approx(expected["eval_loss"], rel=1e-5)
    # The saved weights load into the plain model.
    trainer.save_model(str(tmp_path / "saved"))
    saved = TinyTransformer()
    saved.load_state_dict(load_file(tmp_path / "saved" / "model.safetensors"), strict=False)
    torch.testing.assert_close(saved.lm_head.weight, model.lm_head.weight)


def test_a_model_that_places_itself_in_fp16_trains_with_loss_scaling(tmp_path):
    torch.manual_seed(0)
    trainer = IPUTrainer(model=IPUTinyTransformer(), ipu_config=four_ipus(), train_dataset=Texts(),
                         args=_args(IPUTrainingArguments, tmp_path, per_device_train_batch_size=1, loss_scaling=1024))  # fmt: skip
    result = trainer.train()
    assert result.global_step == 4 and torch.isfinite(torch.tensor(result.training_loss))
    assert next(trainer.model.parameters()).dtype == torch.float16
    assert trainer.compile_report is not None and len(trainer.compile_report.memory.ipus) == 4


def test_a_model_whose_parallelize_places_nothing_runs_on_ipu_0_and_says_so(tmp_path, caplog):
    """PopTorch's rule: what runs before any `BeginBlock` is on IPU 0; the other IPUs asked for stay idle."""

    class Unplaced(TinyTransformer, PipelineMixin):
        pass  # PipelineMixin.parallelize() alone: no BeginBlock

    with caplog.at_level("WARNING"):
        trainer = IPUTrainer(model=Unplaced(), ipu_config=four_ipus(), train_dataset=Texts(),
                             args=_args(IPUTrainingArguments, tmp_path, per_device_train_batch_size=1, fp32=True))  # fmt: skip
    assert {b.ipu for b in trainer._pipelined.plan.blocks} == {0}
    assert sum("placed no block" in r.getMessage() for r in caplog.records) == 1


def test_a_block_on_an_ipu_the_config_does_not_have_is_refused_naming_the_fix(tmp_path):
    class OnFiveIPUs(TinyTransformer, PipelineMixin):
        def parallelize(self):
            super().parallelize()
            poptorch.BeginBlock(self.transformer_encoder.layers[3], "Encoder3", ipu_id=4)
            return self

    with pytest.raises(ValueError, match=r"'Encoder3'.*on IPU 4.*ipus_per_replica=4: raise ipus_per_replica"):
        IPUTrainer(model=OnFiveIPUs(), ipu_config=four_ipus(), train_dataset=Texts(),
                   args=_args(IPUTrainingArguments, tmp_path, per_device_train_batch_size=1, fp32=True))  # fmt: skip
