"""What public PopTorch programs (Graphcore's tutorials, PopTorch's examples and user-guide code) rely on.

Each test exercises, in a program of ours, an API or a semantic a program by others failed on
(docs/poptorch.md, "Checked with programs by others", lists the programs and outcomes).
"""

import copy

import pytest
import torch
from torch import nn

import poptorch


class Adder(nn.Module):
    def forward(self, x, y):
        return x + y


def test_an_inference_model_without_weights_runs():
    # PopTorch's examples/simple_adder.py: a module with no parameters failed to compile.
    model = poptorch.inferenceModel(Adder())
    assert model(torch.tensor([1.0]), torch.tensor([2.0])) == 3.0
    opts = poptorch.Options().deviceIterations(2)
    out = poptorch.inferenceModel(Adder(), opts)(torch.arange(4.0), torch.ones(4))
    torch.testing.assert_close(out, torch.arange(4.0) + 1)


def test_a_training_model_without_weights_is_an_error_naming_it():
    with pytest.raises(poptorch.Error, match="no weights to train"):
        poptorch.trainingModel(Adder())


class PlainCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.i = torch.tensor([0.0])

    def forward(self):
        self.i += 1
        return self.i


class BufferCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("i", torch.tensor([0.0]))

    def forward(self):
        self.i += 1
        return self.i


def test_a_plain_tensor_attribute_is_a_constant_of_the_compiled_model():
    # PopTorch's user guide (buffers.py): every call starts from the value traced; the host keeps its own.
    model = PlainCounter()
    wrapped = poptorch.inferenceModel(model)
    assert [wrapped().item(), wrapped().item()] == [1.0, 1.0]
    torch.testing.assert_close(model.i, torch.tensor([1.0]))  # the trace ran the forward once on the host


def test_a_buffer_carries_over_calls_and_compiling_leaves_it_alone():
    model = BufferCounter()
    wrapped = poptorch.inferenceModel(model)
    assert [wrapped().item(), wrapped().item()] == [1.0, 2.0]
    wrapped.copyWeightsToHost()
    torch.testing.assert_close(model.i, torch.tensor([2.0]))


def test_ipu_hardware_is_available_for_up_to_64_ipus():
    # PopTorch's examples gate on it (mnist.py, the user guide's device_iterations.py).
    assert poptorch.ipuHardwareIsAvailable() and poptorch.ipuHardwareIsAvailable(64)
    assert not poptorch.ipuHardwareIsAvailable(65)


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        with poptorch.Block("A"):
            x = self.a(x)
        with poptorch.Block("B"):
            x = self.b(x)
        return x


def test_strategy_stage_places_a_named_block():
    # The user guide's mnist.py: `strategy.stage("B1").ipu(0)` after building the strategy.
    strategy = poptorch.ShardedExecution(poptorch.Stage("A"), poptorch.Stage("B"))
    strategy.stage("A").ipu(0)
    strategy.stage("B").ipu(1)
    model = poptorch.inferenceModel(Blocks(), poptorch.Options().setExecutionStrategy(strategy))
    model(torch.randn(2, 4))
    assert model.num_ipus == 2
    with pytest.raises(AssertionError, match="Unknown block C"):
        strategy.stage("C")


def test_phases_are_phase_objects_or_lists_of_stages():
    # The user guide's phased_execution.py: phases given as [Stage, Stage] lists, placed with phase(i).ipus().
    parallel = poptorch.ParallelPhasedExecution([poptorch.Stage("A"), poptorch.Stage("B")])
    assert [s.blocks for s in parallel.phase(0).stages] == [["A"], ["B"]]
    parallel.phase(0).ipus(0, 1)
    assert [s._ipu for s in parallel.stages] == [0, 1]
    serial = poptorch.SerialPhasedExecution(poptorch.Phase("A", "B"))  # block ids: one stage of both
    assert [s.blocks for s in serial.phase(0).stages] == [["A", "B"]]
    with pytest.raises(AssertionError, match="Phase contains 1 stages but you provided 2 ipus"):
        serial.phase(0).ipus(0, 1)
    opts = poptorch.Options().setExecutionStrategy(parallel)
    x = torch.randn(2, 4)
    plain = Blocks()
    torch.testing.assert_close(poptorch.inferenceModel(copy.deepcopy(plain), opts)(x), plain(x))


class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 10)

    def forward(self, x, target=None):
        out = self.fc(x)
        return out if target is None else (out, nn.functional.mse_loss(out, target))


def test_load_executable_compiles_the_saved_shapes_and_keeps_this_models_weights(tmp_path):
    # The user guide's precompilation.py: compileAndExport(export_model=False), then a new wrapper's
    # loadExecutable(filename); and inferenceModel(training_model) on the same module.
    path = str(tmp_path / "model.poptorch")
    torch.manual_seed(0)
    poptorch.trainingModel(WithLoss()).compileAndExport(
        path, torch.randn(10), torch.randn(10), export_model=False
    )
    mine = WithLoss()
    before = copy.deepcopy(mine)
    training = poptorch.trainingModel(mine)
    training.loadExecutable(path)
    assert training.isCompiled() and training.isAttachedToDevice()
    torch.testing.assert_close(mine.fc.weight, before.fc.weight)  # the file's weights are not loaded
    x, target = torch.randn(10), torch.randn(10)
    training(x, target)
    assert not torch.equal(mine.fc.weight, before.fc.weight)
    inference = poptorch.inferenceModel(training)  # a wrapped model: its module, weights shared
    torch.testing.assert_close(inference(x), mine.fc(x).detach())
    training.save(str(tmp_path / "again.poptorch"))
    assert poptorch.load(str(tmp_path / "again.poptorch")).isCompiled()
    with pytest.raises(poptorch.Error, match="Model has not been compiled or has been destroyed."):
        poptorch.inferenceModel(WithLoss()).save(str(tmp_path / "none.poptorch"))


class HalfNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x, labels):
        out = self.fc(x)
        return out, nn.functional.cross_entropy(out.float(), labels)


def test_half_model_trains_with_fp16_accumulation_types_as_the_mixed_precision_tutorial():
    # Graphcore's mixed_precision tutorial: model.half(), AdamW(accum_type=fp16, loss_scaling=1024), SR on.
    # The second update failed (fp16 state met fp32 working copies).
    torch.manual_seed(0)
    model = HalfNet().half()
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=1e-2, accum_type=torch.float16, loss_scaling=1024,
                                     first_order_momentum_accum_type=torch.float16)  # fmt: skip
    opts = poptorch.Options()
    opts.Precision.enableStochasticRounding(True)
    opts.Precision.setPartialsType(torch.half)
    wrapped = poptorch.trainingModel(model, opts, optimizer)
    x, labels = torch.randn(8, 6).half(), torch.randint(0, 3, (8,))
    losses = [wrapped(x, labels)[1].item() for _ in range(20)]
    assert losses[-1] < losses[0]
    state = optimizer.state[model.fc.weight]
    assert (state["exp_avg"].dtype, state["exp_avg_sq"].dtype) == (torch.float16, torch.float32)


class _HalfWeight(nn.Module):
    """loss = sum(w * x) on an fp16 weight: its gradient is x times the loss scale, computed in fp16."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 4).half())

    def forward(self, x):
        return (self.weight * x).float().sum()


def test_fp16_accumulation_types_round_the_gradient_and_the_chosen_moments():
    # The rule, step by step against torch's AdamW on fp32 copies with the same roundings written out:
    # accum_type fp16 = the loss-scaled gradient held in fp16; first-order moment stored in fp16; fp16 weights.
    torch.manual_seed(0)
    model = _HalfWeight()
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=1e-2, accum_type=torch.float16, loss_scaling=8.0,
                                     first_order_momentum_accum_type=torch.float16)  # fmt: skip
    training = poptorch.trainingModel(model, poptorch.Options(), optimizer=optimizer)
    ref_weight = nn.Parameter(model.weight.detach().float())
    reference = torch.optim.AdamW([ref_weight], lr=1e-2)
    for _ in range(3):
        x = (torch.randn(1, 5, 4) * 1e-3).half()
        training(x)
        ref_weight.grad = (x[0].float() * 8.0).half().float() / 8.0
        reference.step()
        with torch.no_grad():
            ref_weight.copy_(ref_weight.half().float())
            moments = reference.state[ref_weight]
            moments["exp_avg"].copy_(moments["exp_avg"].half().float())
    torch.testing.assert_close(model.weight.float(), ref_weight.detach(), rtol=0, atol=0)
    torch.testing.assert_close(
        optimizer.state[model.weight]["exp_avg"].float(), reference.state[ref_weight]["exp_avg"]
    )
    assert optimizer.state[model.weight]["exp_avg"].dtype == torch.float16


def test_options_file_lines_run_as_setter_calls_that_may_name_poptorch(tmp_path):
    # PopTorch's user guide (api.py, poptorch.conf): a line is `options.<line>`, with `poptorch` in scope;
    # `setExecutionStrategy(poptorch.ShardedExecution())` failed to load.
    conf = tmp_path / "poptorch.conf"
    conf.write_text(
        "# comment\ndeviceIterations(3)\nsetExecutionStrategy(poptorch.ShardedExecution())\n"
        "Training.gradientAccumulation(2)\nreplicationFactor(1)\n"
    )
    opts = poptorch.Options().loadFromFile(str(conf))
    assert opts.device_iterations == 3 and opts.Training.gradient_accumulation == 2
    assert type(opts.execution_strategy) is poptorch.ShardedExecution
    conf.write_text("deviceIterations(3\n")
    with pytest.raises(ValueError, match=r"poptorch.conf:1: 'deviceIterations\(3' is not a setter call"):
        poptorch.Options().loadFromFile(str(conf))


def test_ipu_print_tensor_prints_when_the_model_runs_not_when_it_compiles(capsys):
    # PopTorch's user guide (api.py): the compile traces printed the tensor twice more (once on the meta device).
    class Printing(nn.Module):
        def forward(self, x):
            return poptorch.ipu_print_tensor(x + 1) * 2

    model = poptorch.inferenceModel(Printing())
    model(torch.tensor([1.0, 2.0]))
    model(torch.tensor([1.0, 2.0]))
    assert capsys.readouterr().out.count("tensor([2., 3.])") == 2


def test_inputs_of_different_lengths_are_each_split_by_their_own_length():
    # PopTorch's if_test.py: a one-element condition per micro-batch beside a tensor of 2 rows per micro-batch.
    class Select(nn.Module):
        def forward(self, condition, x):
            return torch.where(condition.bool(), x * 2, x - 1).sum(0, keepdim=True)

    opts = poptorch.Options().deviceIterations(3)
    condition, x = torch.tensor([1.0, 0.0, 1.0]), torch.arange(12.0).reshape(6, 2)
    out = poptorch.inferenceModel(Select(), opts)(condition, x)
    expected = torch.cat([Select()(condition[i : i + 1], x[2 * i : 2 * i + 2]) for i in range(3)])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
