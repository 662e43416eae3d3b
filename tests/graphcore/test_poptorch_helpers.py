"""Optimum Graphcore's PopTorch helpers: IPUConfig.to_options, PipelineMixin, get_poplar_executor, ...

References: Optimum Graphcore 0.7.1's `IPUConfig._to_options` (the option values below are read from
it by hand), and plain PyTorch loops for the training equivalence.
"""

import copy

import pytest
import torch
from torch import nn

import poptorch
from optimum.graphcore import IPUConfig
from optimum.graphcore.modeling_utils import PipelineMixin, recomputation_checkpoint, to_pipelined
from optimum.graphcore.pipelines import get_poplar_executor
from optimum.graphcore.trainer_utils import to_poptorch_dataloader


def test_to_options_builds_the_training_options_optimum_graphcore_0_7_built():
    config = IPUConfig(
        ipus_per_replica=2, layers_per_ipu=[1, 1], replication_factor=2, gradient_accumulation_steps=8,
        device_iterations=3, matmul_proportion=[0.1, 0.3], seed=7, output_mode="all",
        replicated_tensor_sharding=True, optimizer_state_offchip=True, executable_cache_dir="./exe_cache",
        auto_loss_scaling=True,
    )  # fmt: skip
    config.eval()
    opts = config.to_options()
    assert config.mode == "inference"  # the mode is restored
    assert isinstance(opts, poptorch.Options)
    assert (opts.replication_factor, opts.device_iterations, opts.Training.gradient_accumulation) == (2, 3, 8)
    assert opts.auto_round_num_ipus is True
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Mean
    assert opts.Training.automatic_loss_scaling is True
    assert opts.output_mode == poptorch.OutputMode.All
    assert opts.random_seed == 7
    assert type(opts.execution_strategy) is poptorch.PipelinedExecution
    assert opts.execution_strategy.auto_stage == poptorch.AutoStage.AutoIncrement
    assert opts.available_memory_proportion == {"IPU0": 0.1, "IPU1": 0.3}
    assert opts.executable_cache_dir == "./exe_cache"
    assert opts._Popart.enableStochasticRounding is True
    assert opts._Popart.partialsTypeMatMuls == "half"
    assert opts.TensorLocations.location_optimizer == {"onChip": False, "useReplicatedTensorSharding": True}
    assert opts._Popart.outlineThreshold == 10.0


def test_to_options_for_inference_reads_the_inference_values_and_shards():
    config = IPUConfig(
        ipus_per_replica=2, layers_per_ipu=[1, 1], inference_replication_factor=1, inference_device_iterations=5,
        gradient_accumulation_steps=8, matmul_proportion=0.25, replicated_tensor_sharding=True,
        enable_half_partials=False, output_mode="final", executable_cache_dir="disabled",
    )  # fmt: skip
    opts = config.to_options(for_inference=True, compile_only=True)
    assert config.mode == "training"
    assert (opts.replication_factor, opts.device_iterations, opts.Training.gradient_accumulation) == (1, 5, 1)
    assert opts.output_mode == poptorch.OutputMode.All
    assert type(opts.execution_strategy) is poptorch.ShardedExecution
    assert opts.available_memory_proportion == {"IPU0": 0.25, "IPU1": 0.25}
    assert opts._Popart.enableStochasticRounding is False
    assert not opts._Popart.exists("partialsTypeMatMuls")
    assert opts.executable_cache_dir == ""
    assert opts.ipu_version == 2  # compile_only: an offline Mk2 target
    assert opts.TensorLocations.location_optimizer == {"onChip": True, "useReplicatedTensorSharding": False}


def test_to_options_names_an_unknown_output_mode():
    config = IPUConfig()
    config.__dict__["output_mode"] = "every"  # a value the setter would refuse
    with pytest.raises(KeyError, match="every is not a valid poptorch.OutputMode"):
        config.to_options()


class TwoLayerNet(PipelineMixin, nn.Module):
    """A user's own pipelined model, written the way Optimum Graphcore users wrote them."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(2)])
        self.head = nn.Linear(6, 3)

    def parallelize(self):
        super().parallelize()
        poptorch.BeginBlock(self.embed, "Embedding", ipu_id=0)
        for i, layer in enumerate(self.layers):
            poptorch.BeginBlock(layer, f"Layer {i}", ipu_id=i)
            if self.ipu_config.recompute_checkpoint_every_layer:
                self._hooks.append(recomputation_checkpoint(layer))
        poptorch.BeginBlock(self.head, "Head", ipu_id=1)
        return self

    def forward(self, x, labels=None):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        logits = self.head(h)
        if labels is None:
            return logits
        return logits, nn.functional.cross_entropy(logits, labels)


def _config(**kwargs):
    return IPUConfig(ipus_per_replica=2, layers_per_ipu=[1, 1], **kwargs)


def test_a_pipeline_mixin_model_trains_via_get_poplar_executor_as_plain_pytorch_does():
    torch.manual_seed(0)
    model = TwoLayerNet()
    reference = copy.deepcopy(model)
    di, ga, mb = 2, 4, 3  # GA 4 >= 2 x 2 - 1 stages: PopTorch's pipelined training check
    config = _config(gradient_accumulation_steps=ga, device_iterations=di)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = get_poplar_executor(
        "text-classification", model, config, fp16=False, training=True, optimizer=optimizer
    )
    assert isinstance(trainer, poptorch.PoplarExecutor) and trainer.training

    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        x, labels = (
            torch.randn(di * ga * mb, 4, generator=g),
            torch.randint(0, 3, (di * ga * mb,), generator=g),
        )
        _, loss = trainer(x, labels)
        for d in range(di):  # plain PyTorch: mean of GA micro-batch gradients, one step per device iteration
            ref_optimizer.zero_grad()
            for k in range(ga):
                rows = slice((d * ga + k) * mb, (d * ga + k + 1) * mb)
                ref_loss = reference(x[rows], labels[rows])[1]
                (ref_loss / ga).backward()
            ref_optimizer.step()
        torch.testing.assert_close(
            loss, ref_loss.detach(), atol=1e-6, rtol=0
        )  # output mode "final": the last
    assert trainer.num_stages == 2  # the blocks the model's own parallelize() placed
    for p, q in zip(model.parameters(), reference.parameters()):  # trained in place, as the user holds it
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


def test_get_poplar_executor_for_inference_places_a_copy_and_shards_it():
    torch.manual_seed(0)
    model = TwoLayerNet().eval()
    config = _config(inference_device_iterations=4)
    inference = get_poplar_executor("text-classification", model, config, fp16=False)
    assert not inference.training
    assert type(inference.options.execution_strategy) is poptorch.ShardedExecution
    assert inference.options.device_iterations == 1  # the original forced one iteration and one replica
    assert inference.model is not model  # a copy, as Optimum Graphcore's to_pipelined made
    x = torch.randn(5, 4)
    torch.testing.assert_close(inference(x), model(x))


def test_pipeline_mixin_carries_an_ipu_config_and_deparallelize_undoes_parallelize():
    model = TwoLayerNet()
    with pytest.raises(AttributeError, match="No IPUConfig was found"):
        model.parallelize()
    with pytest.raises(TypeError, match="ipu_config must be an instance of IPUConfig"):
        model.ipu_config = {"ipus_per_replica": 2}
    model.ipu_config = _config(recompute_checkpoint_every_layer=True)
    assert model.get_ipu_config() is model.ipu_config
    model.parallelize()
    assert len(model._hooks) == 2 and all(hasattr(m, "_poptorch_block") for m in model.layers)
    model.deparallelize()
    assert model._hooks == [] and not any(hasattr(m, "_poptorch_block") for m in model.modules())
    assert not any(layer._forward_hooks for layer in model.layers)
    model.parallelize()  # placing again works once the blocks are gone
    copied = to_pipelined(model, _config(gradient_accumulation_steps=3))
    assert copied is not model and copied.ipu_config.gradient_accumulation_steps == 3
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())


def test_to_poptorch_dataloader_turns_the_torch_loader_a_method_builds_into_a_poptorch_one():
    class Args:
        dataloader_drop_last, dataloader_mode, seed = False, poptorch.DataLoaderMode.Sync, 0

    class Trainer:
        args = Args()
        opts = poptorch.Options().deviceIterations(2)
        eval_opts = poptorch.Options().deviceIterations(5)

        @to_poptorch_dataloader(for_training=True)
        def get_train_dataloader(self, dataset):
            return torch.utils.data.DataLoader(dataset, batch_size=3)

        @to_poptorch_dataloader()
        def get_eval_dataloader(self, dataset):
            return torch.utils.data.DataLoader(dataset, batch_size=2)

    dataset = torch.utils.data.TensorDataset(torch.arange(31.0))
    train = Trainer().get_train_dataloader(dataset)
    assert isinstance(train, poptorch.DataLoader) and train.options is Trainer.opts
    assert train.combinedBatchSize == 6 and train.drop_last and len(train) == 5
    evaluation = Trainer().get_eval_dataloader(dataset)
    assert evaluation.combinedBatchSize == 10 and not evaluation.drop_last and len(evaluation) == 4
    assert torch.utils.data.DataLoader is torch.utils.data.dataloader.DataLoader  # restored after the call


def test_recomputation_checkpoint_keeps_the_module_outputs():
    layer = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    expected = layer(x)
    handle = recomputation_checkpoint(layer)
    torch.testing.assert_close(layer(x), expected)
    handle.remove()
    assert not layer._forward_hooks


def test_bert_pipeline_mixin_places_a_users_bert_as_optimum_graphcore_did():
    """The packed-BERT notebooks' pattern: a transformers BERT class plus `BertPipelineMixin`, whose
    `parallelize()` places the embeddings and encoder layers; the subclass adds its head's block."""
    from fixtures import seeded, tiny_bert_config
    from transformers import BertForSequenceClassification

    from optimum.graphcore.models.bert.modeling_bert import BertPipelineMixin

    class PackedStyleBert(BertForSequenceClassification, BertPipelineMixin):
        def parallelize(self):
            super().parallelize()
            self.classifier = poptorch.BeginBlock(self.classifier, "Classifier", ipu_id=1)
            return self

    seeded(0)
    model = PackedStyleBert(tiny_bert_config(num_labels=2)).eval()
    reference = copy.deepcopy(model)
    model.ipu_config = IPUConfig(layers_per_ipu=[1, 3], ipus_per_replica=2, recompute_checkpoint_every_layer=True)
    model.parallelize()
    blocks = [m._poptorch_block for m in (model.bert.embeddings, *model.bert.encoder.layer, model.classifier)]
    assert [ipu for _, ipu in blocks] == [0, 0, 1, 1, 1, 1]
    assert len(model._hooks) == 3  # every layer's output but the last is checkpointed
    ids = torch.randint(5, 128, (6, 10), generator=torch.Generator().manual_seed(1))
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(3))
    with torch.no_grad():
        torch.testing.assert_close(inference(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert inference.num_ipus == 2
    model.deparallelize()
    assert not any(hasattr(m, "_poptorch_block") for m in model.modules()) and model._hooks == []
