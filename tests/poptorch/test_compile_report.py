"""The compile report of a PopTorch model prices the blocks as the user placed them.

References: parameter counts per IPU worked out by hand from the model below, and the options' own
batch arithmetic; the out-of-memory case is a model on the meta device far above 900 MB.
"""

import logging

import pytest
import torch
from torch import nn

import poptorch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(4)])
        self.head = nn.Linear(16, 5)
        poptorch.BeginBlock(self.layers[2], "Second half", ipu_id=1)

    def forward(self, tokens, labels):
        h = self.embed(tokens).mean(1)
        for layer in self.layers:
            h = torch.relu(layer(h))
        logits = self.head(h)
        return logits, nn.functional.cross_entropy(logits, labels)


def _inputs(n=8):
    return torch.randint(0, 100, (n, 7)), torch.randint(0, 5, (n,))


def test_compile_reports_memory_per_ipu_of_the_blocks_as_placed(caplog):
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(4)
    opts.setAvailableMemoryProportion({"IPU1": 0.3})
    net = Net()
    model = poptorch.trainingModel(net, opts, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    with caplog.at_level(logging.INFO, logger="optimum_ipu.compiling"):
        model.compile(*_inputs(16))
    assert "IPU compile report" in caplog.text and "Estimated throughput" in caplog.text
    report = model.compile_result.report
    assert report.model_name.startswith("Net")
    workload = report.workload
    assert (workload.micro_batch_size, workload.gradient_accumulation_steps, workload.device_iterations) == (
        2,
        4,
        2,
    )
    assert workload.ipus_per_replica == 2 and workload.matmul_proportion == (
        0.6,
        0.3,
    )  # PopTorch's default 0.6
    ipu0 = 100 * 16 + 2 * (16 * 16 + 16)  # the embedding and layers 0-1 (before the block)
    ipu1 = 2 * (16 * 16 + 16) + 16 * 5 + 5  # layers 2-3 and the head
    assert [m.weights for m in report.memory.ipus] == [4 * ipu0, 4 * ipu1]  # fp32 weights


def test_the_first_call_reports_and_inference_is_priced_without_backward(caplog):
    net = Net().eval()
    inference = poptorch.inferenceModel(net, poptorch.Options().deviceIterations(2))
    with caplog.at_level(logging.INFO, logger="optimum_ipu.compiling"):
        inference(*_inputs(4))
    assert "IPU compile report" in caplog.text
    report = inference.compile_result.report
    assert not report.workload.training
    assert all(m.gradients == 0 and m.optimizer == 0 for m in report.memory.ipus)


def test_a_half_model_is_priced_in_fp16():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    model = poptorch.trainingModel(Net().half(), opts)
    model.compile(*_inputs(3))
    assert model.compile_result.report.workload.fp32 is False
    assert model.compile_result.report.memory.ipus[1].weights == 2 * (2 * (16 * 16 + 16) + 16 * 5 + 5)


class Huge(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(16)])  # 268M weights: over 900 MB

    def forward(self, x):
        return poptorch.identity_loss(self.layers(x).square().mean(), reduction="none")


def test_an_over_full_ipu_fails_the_compile_with_poplars_out_of_memory_error():
    with torch.device("meta"):  # nothing is allocated: the cost model traces on meta anyway
        huge = Huge()
    model = poptorch.trainingModel(huge, poptorch.Options())
    with pytest.raises(
        poptorch.Error, match=r"Out of memory on IPU 0: [\d,]+ bytes used but IPUs only have"
    ) as e:
        model.compile(torch.empty(2, 4096, device="meta"))
    assert "Memory per IPU" in str(e.value)
    assert not model.isCompiled()


@pytest.mark.parametrize("sharded", [False, True])
def test_inference_is_priced_with_the_execution_strategy_of_the_options(sharded):
    # PopTorch's default for a model on several IPUs is PipelinedExecution: the stages overlap across
    # device iterations; ShardedExecution runs each micro-batch through the IPUs in turn.
    opts = poptorch.Options().deviceIterations(2)
    if sharded:
        opts.setExecutionStrategy(poptorch.ShardedExecution())
    inference = poptorch.inferenceModel(Net().eval(), opts)
    inference(*_inputs(4))
    report = inference.compile_result.report
    assert report.workload.pipelined_inference is not sharded
    assert ("Pipelined inference: 3 cycles per call (DI 2 + 2 - 1)" in report.summary()) is not sharded


@pytest.mark.parametrize("half_types", [False, True])
def test_the_optimizers_state_types_are_priced(half_types):
    # PopTorch keeps every optimizer state in fp32 unless told (accum_type, *_momentum_accum_type).
    types = (
        dict(accum_type=torch.float16, first_order_momentum_accum_type=torch.float16) if half_types else {}
    )
    net = Net()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    model = poptorch.trainingModel(
        net, opts, optimizer=poptorch.optim.AdamW(net.parameters(), lr=1e-3, **types)
    )
    model.compile(*_inputs(4))
    ipu1 = 2 * (16 * 16 + 16) + 16 * 5 + 5
    memory = model.compile_result.report.memory.ipus[1]
    assert memory.gradients == ipu1 * (2 if half_types else 4)  # the accumulator's type
    assert memory.optimizer == ipu1 * ((2 if half_types else 4) + 4)  # the first moment's type + fp32


def test_the_memory_check_comes_from_the_environment(monkeypatch, caplog):
    # OPTIMUM_IPU_MEMORY_CHECK=off: a PopTorch program, run unchanged, compiles a layout the estimate calls
    # out of memory, warning once; an unknown value is an error naming the three choices.
    with torch.device("meta"):
        huge = Huge()
    monkeypatch.setenv("OPTIMUM_IPU_MEMORY_CHECK", "off")
    model = poptorch.trainingModel(huge, poptorch.Options())
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.compiling"):
        model.compile(torch.empty(2, 4096, device="meta"))
    assert model.isCompiled() and "a real IPU may not fit this layout" in caplog.text
    monkeypatch.setenv("OPTIMUM_IPU_MEMORY_CHECK", "sometimes")
    with torch.device("meta"):
        other = Huge()
    with pytest.raises(ValueError, match="OPTIMUM_IPU_MEMORY_CHECK='sometimes': choose margin"):
        poptorch.trainingModel(other, poptorch.Options()).compile(torch.empty(2, 4096, device="meta"))
