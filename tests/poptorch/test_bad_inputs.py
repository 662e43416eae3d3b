"""Bad inputs to the poptorch front end are refused with an error naming the input, its value and the fix.

Each of these was silently accepted (or failed with a raw Python error) before: a DataLoader too
small for one combined batch (a training loop that does nothing), a negative or non-integer IPU id,
an optimizer over tensors that are not the model's (weights that never change), and an input
replica grouping of size 0 (a `ZeroDivisionError`).

Then PopTorch's own behaviour where ours differed: a dataset failing under an asynchronous DataLoader
(PopTorch's worker errors, not torch's), an op after a `with poptorch.Block` ended ("No active Block"),
a zero-sized input ("Zero-sized tensors are unsupported"), a loss no trainable parameter reaches (runs,
updating nothing) and an input that requires grad (detached, with PopTorch's warning).
"""

import logging
import time

import numpy as np
import pytest
import torch
from torch import nn

import poptorch

# -- 1. a DataLoader must hold at least one combined batch -------------------------------------------


def _data(samples: int) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.arange(float(samples)).unsqueeze(1))


def test_dataloader_smaller_than_one_combined_batch_is_refused_when_created():
    opts = poptorch.Options().deviceIterations(4)
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error) as caught:
        poptorch.DataLoader(opts, _data(10), batch_size=2)
    message = str(caught.value)
    assert "The dataset has 10 samples, fewer than one combined batch of 16" in message
    assert "batch_size(2) x deviceIterations(4) x gradientAccumulation(2) x replicationFactor(1)" in message
    assert "yields no batch" in message
    assert "Use fewer device iterations" in message and "a dataset of at least 16 samples" in message


def test_dataloader_combined_batch_names_replicas_and_input_group_size():
    opts = poptorch.Options().replicationFactor(4).inputReplicaGrouping(2, poptorch.CommGroupType.Consecutive)
    with pytest.raises(poptorch.Error, match=r"fewer than one combined batch of 6 .*"
                       r"x \(replicationFactor\(4\) / input group size\(2\)\)"):  # fmt: skip
        poptorch.DataLoader(opts, _data(5), batch_size=3)


def test_dataloader_counts_the_samples_its_sampler_draws():
    sampler = torch.utils.data.SubsetRandomSampler(range(3))
    with pytest.raises(
        poptorch.Error, match="The sampler draws 3 samples, fewer than one combined batch of 4 "
    ):
        poptorch.DataLoader(poptorch.Options().deviceIterations(2), _data(100), batch_size=2, sampler=sampler)


def test_dataloader_with_exactly_one_combined_batch_or_drop_last_false_is_accepted():
    opts = poptorch.Options().deviceIterations(4)
    assert len(poptorch.DataLoader(opts, _data(8), batch_size=2)) == 1
    small = poptorch.DataLoader(opts, _data(6), batch_size=2, drop_last=False)  # one smaller batch
    assert [batch[0].shape[0] for batch in small] == [6]


def test_dataloader_of_an_empty_dataset_is_refused_even_without_drop_last():
    with pytest.raises(poptorch.Error, match="The dataset has 0 samples"):
        poptorch.DataLoader(poptorch.Options(), _data(0), batch_size=1, drop_last=False)


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, samples: int):
        self.samples = samples

    def __iter__(self):
        return iter(torch.arange(float(self.samples)).unsqueeze(1))


def test_dataloader_over_an_iterable_dataset_too_small_for_a_combined_batch_is_refused_when_iterated():
    loader = poptorch.DataLoader(poptorch.Options().deviceIterations(4), _Stream(5), batch_size=2)
    with pytest.raises(poptorch.Error, match=r"The iterable dataset _Stream gave fewer samples than one "
                       r"combined batch of 8 \(batch_size\(2\) x deviceIterations\(4\)"):  # fmt: skip
        list(loader)
    enough = poptorch.DataLoader(poptorch.Options().deviceIterations(4), _Stream(17), batch_size=2)
    assert [batch.shape[0] for batch in enough] == [8, 8]


# -- 2. block and stage IPU ids are non-negative integers -------------------------------------------


@pytest.mark.parametrize("ipu_id", [-1, 1.5, "1", True])
def test_ipu_id_must_be_a_non_negative_integer(ipu_id):
    layer = nn.Linear(2, 2)
    with pytest.raises(poptorch.Error, match=rf"BeginBlock\(Linear, user_id='enc'\): ipu_id must be a "
                       rf"non-negative integer .* got {ipu_id!r}"):  # fmt: skip
        poptorch.BeginBlock(layer, "enc", ipu_id=ipu_id)
    assert not hasattr(layer, "_poptorch_block")  # nothing was annotated
    with pytest.raises(poptorch.Error, match=rf"Block\(user_id='dec'\): ipu_id .* got {ipu_id!r}"):
        poptorch.Block("dec", ipu_id=ipu_id)
    with pytest.raises(poptorch.Error, match=rf"Block.start\(user_id=None\): ipu_id .* got {ipu_id!r}"):
        poptorch.Block.start(ipu_id=ipu_id)
    with pytest.raises(poptorch.Error, match=rf"BlockFunction\(user_id='head'\): ipu_id .* got {ipu_id!r}"):
        poptorch.BlockFunction("head", ipu_id=ipu_id)
    with pytest.raises(poptorch.Error, match=rf"Stage\('a', 'b'\).ipu: ipu_id .* got {ipu_id!r}"):
        poptorch.Stage("a", "b").ipu(ipu_id)
    with pytest.raises(poptorch.Error, match=rf"Stage\('a'\).ipu: ipu_id .* got {ipu_id!r}"):
        poptorch.Phase("a").ipus(ipu_id)


def test_ipu_ids_that_are_integers_are_accepted():
    layer = poptorch.BeginBlock(nn.Linear(2, 2), "enc", ipu_id=np.int64(1))
    assert layer._poptorch_block == ("enc", 1)
    assert poptorch.Stage("a").ipu(0)._ipu == 0
    assert poptorch.Block("b", ipu_id=None).ipu_id is None


# -- 3. the optimizer updates the model's own parameters ----------------------------------------------


class _WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x):
        out = self.linear(x)
        return out, out.pow(2).mean()


def test_optimizer_over_parameters_not_in_the_model_is_refused_at_wrap():
    model, other = _WithLoss(), _WithLoss()
    with pytest.raises(poptorch.Error) as caught:
        poptorch.trainingModel(model, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    message = str(caught.value)
    assert "2 of the optimizer's 2 parameters are not parameters of the model (_WithLoss)" in message
    assert "the model's weights would never change" in message
    assert "optimizer = SGD(model.parameters(), ...)" in message
    # nothing is left wrapped: the same model can be wrapped with the right optimizer
    poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_optimizer_with_some_parameters_not_in_the_model_is_refused_and_a_subset_is_accepted():
    model, other = _WithLoss(), _WithLoss()
    mixed = torch.optim.SGD([{"params": model.parameters()}, {"params": [other.linear.bias]}], lr=0.1)
    with pytest.raises(
        poptorch.Error, match=r"1 of the optimizer's 3 parameters are not parameters of the model"
    ):
        poptorch.trainingModel(model, optimizer=mixed)
    frozen_bias = torch.optim.SGD([model.linear.weight], lr=0.1)  # training only some weights is fine
    poptorch.trainingModel(model, optimizer=frozen_bias)


def test_set_optimizer_over_parameters_not_in_the_model_is_refused():
    model = _WithLoss()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(
        poptorch.Error, match=r"2 of the optimizer's 2 parameters are not parameters of the model"
    ):
        training.setOptimizer(torch.optim.SGD(_WithLoss().parameters(), lr=0.1))
    before = model.linear.weight.detach().clone()
    training(torch.ones(1, 2))  # the optimizer it had is still the one that runs
    assert not torch.equal(before, model.linear.weight)


# -- 4. inputReplicaGrouping's group size and type ---------------------------------------------------


@pytest.mark.parametrize("size", [0, -2, 1.5, "2", None, True])
def test_input_replica_group_size_must_be_a_positive_integer(size):
    with pytest.raises(ValueError, match=rf"input_group_size must be a positive integer .*, got {size!r}"):
        poptorch.Options().replicationFactor(4).inputReplicaGrouping(size, poptorch.CommGroupType.Consecutive)


def test_input_replica_group_size_must_divide_the_replication_factor():
    opts = poptorch.Options().replicationFactor(4)
    with pytest.raises(ValueError, match=r"input_group_size must be a factor of replication_factor \(3 does not "
                       r"divide 4\).*one of 1, 2, 4"):  # fmt: skip
        opts.inputReplicaGrouping(3, poptorch.CommGroupType.Consecutive)
    with pytest.raises(
        ValueError, match=r"input_group_size cannot be larger than replication_factor \(8 > 4\)"
    ):
        opts.inputReplicaGrouping(8, poptorch.CommGroupType.Orthogonal)
    assert opts.inputReplicaGrouping(2, poptorch.CommGroupType.Orthogonal).input_group_size == 2


def test_input_replica_group_size_is_checked_once_the_replication_factor_is_known():
    # the replication factor is not set yet: the group size is checked against it when it is
    opts = poptorch.Options().inputReplicaGrouping(2, poptorch.CommGroupType.Consecutive)
    with pytest.raises(
        ValueError, match=r"replicationFactor\(3\) must be a multiple of the input_group_size \(2\)"
    ):
        opts.replicationFactor(3)
    assert opts.replicationFactor(4).replication_factor == 4
    never_set = poptorch.Options().inputReplicaGrouping(2, poptorch.CommGroupType.Consecutive)
    with pytest.raises(
        ValueError, match=r"input_group_size cannot be larger than replication_factor \(2 > 1\)"
    ):
        poptorch.DataLoader(never_set, _data(8), batch_size=1)
    with pytest.raises(ValueError, match=r"input_group_size cannot be larger than replication_factor"):
        poptorch.inferenceModel(nn.Linear(1, 1), never_set)


@pytest.mark.parametrize("group_type", ["Consecutive", None, 7, poptorch.ReductionType.Sum])
def test_input_replica_group_type_must_be_a_comm_group_type(group_type):
    with pytest.raises(ValueError, match=r"input_group_type must be a poptorch.CommGroupType \(Consecutive, "
                       rf"Orthogonal or NoGrouping\), got {group_type!r}"):  # fmt: skip
        poptorch.Options().replicationFactor(2).inputReplicaGrouping(2, group_type)


def test_input_replica_group_type_all_is_refused_and_no_grouping_means_size_one():
    with pytest.raises(ValueError, match="input_group_type cannot be All"):
        poptorch.Options().replicationFactor(2).inputReplicaGrouping(2, poptorch.CommGroupType.All)
    opts = poptorch.Options().replicationFactor(4).inputReplicaGrouping(2, poptorch.CommGroupType.NoGrouping)
    assert (opts.input_group_size, opts.input_cgt) == (1, poptorch.CommGroupType.Consecutive)


# -- 5. a dataset that fails while an asynchronous DataLoader loads ahead ----------------------------


class _BrokenFrom(torch.utils.data.Dataset):
    """Samples 0 .. first_bad - 1 load; from `first_bad` on, `__getitem__` fails as PopTorch's test dataset does."""

    def __init__(self, first_bad: int, length: int = 40):
        self.first_bad, self.length = first_bad, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        assert index < self.first_bad, "Broken dataset"
        return torch.zeros(2)


_ASYNC_MODES = [poptorch.DataLoaderMode.Async, poptorch.DataLoaderMode.AsyncRebatched]


@pytest.mark.parametrize("mode", _ASYNC_MODES)
def test_a_dataset_failing_before_the_first_batch_of_an_async_loader_is_poptorchs_worker_start_error(mode):
    loader = poptorch.DataLoader(poptorch.Options(), _BrokenFrom(0), batch_size=2, num_workers=2, mode=mode)
    started = time.monotonic()
    with pytest.raises(poptorch.Error) as error:
        next(iter(loader))
    assert time.monotonic() - started < 60  # raised, not hung waiting for a batch
    message = str(error.value)
    assert message.startswith("AsynchronousDataAccessor worker thread failed to start (Check above for details)")
    assert "AssertionError: Broken dataset" in message  # what the dataset raised
    assert "mode=poptorch.DataLoaderMode.Sync and num_workers=0" in message  # how to debug it
    assert isinstance(error.value.__cause__, AssertionError)  # the worker's traceback is printed above


@pytest.mark.parametrize("mode", _ASYNC_MODES)
def test_a_dataset_failing_after_the_first_batch_of_an_async_loader_is_poptorchs_data_fetcher_assertion(mode):
    loader = poptorch.DataLoader(poptorch.Options(), _BrokenFrom(10), batch_size=2, num_workers=2, mode=mode)
    loaded = []
    started = time.monotonic()
    with pytest.raises(AssertionError, match="^An error occurred in the data fetcher") as error:
        for batch in loader:
            loaded.append(batch)
    assert time.monotonic() - started < 60
    assert loaded  # the batches before the bad sample came through
    assert isinstance(error.value, poptorch.Error)  # PopTorch asserts; a program catching poptorch.Error too
    assert "AssertionError: Broken dataset" in str(error.value)


def test_a_dataset_failing_under_the_asynchronous_data_accessor_is_poptorchs_worker_start_error():
    loader = poptorch.DataLoader(poptorch.Options(), _BrokenFrom(0), batch_size=1, num_workers=2)
    with pytest.raises(poptorch.Error, match=r"^AsynchronousDataAccessor worker thread failed to start"):
        next(iter(poptorch.AsynchronousDataAccessor(loader)))


def test_a_dataset_failing_in_a_synchronous_loaders_workers_raises_torchs_exception_as_poptorch_does():
    # a Sync loader is torch's DataLoader on PopTorch too: torch re-raises the worker's exception
    loader = poptorch.DataLoader(poptorch.Options(), _BrokenFrom(0), batch_size=2, num_workers=2)
    with pytest.raises(AssertionError, match="Caught AssertionError in DataLoader worker process") as error:
        next(iter(loader))
    assert not isinstance(error.value, poptorch.Error)


# -- 6. every op runs in a block once a `with poptorch.Block` has ended -------------------------------


class _TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)


def _auto_increment(device_iterations: int = 2, accumulation: int = 1) -> poptorch.Options:
    opts = poptorch.Options().deviceIterations(device_iterations)
    opts.Training.gradientAccumulation(accumulation)
    return opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))


def test_an_op_after_a_block_context_ends_is_poptorchs_no_active_block_error():
    class OpAfterTheBlock(_TwoLayers):  # PopTorch's tests/pipelining_test.py::test_missing_block
        def forward(self, x):
            poptorch.Block.useAutoId()
            with poptorch.Block(ipu_id=0):
                x = self.a(x)
            return x * 4

    model = poptorch.inferenceModel(OpAfterTheBlock(), _auto_increment())
    with pytest.raises(poptorch.Error, match=r"^No active Block, all the ops must belong to a Block: ") as error:
        model.compile(torch.randn(2, 4))
    message = str(error.value)
    assert "mul" in message and "user_id='0'" in message and "IPU 0" in message  # which op, after which block
    assert "Move the op inside a block" in message  # the fix


def test_a_loss_computed_after_the_last_block_function_is_refused_and_inside_it_is_accepted():
    class LossOutside(_TwoLayers):
        @poptorch.BlockFunction("head", ipu_id=1)
        def head(self, x):
            return self.b(x)

        def forward(self, x):
            with poptorch.Block("body", ipu_id=0):
                x = self.a(x)
            x = self.head(x)
            return x, x.pow(2).mean()

    with pytest.raises(poptorch.Error, match=r"No active Block.*after `with poptorch.Block\(user_id='head'\)` \(on IPU 1\)"):
        poptorch.trainingModel(LossOutside(), _auto_increment(1, 3))(torch.randn(3, 4))

    class LossInside(LossOutside):
        def forward(self, x):
            with poptorch.Block("body", ipu_id=0):
                x = self.a(x)
            with poptorch.Block("head", ipu_id=1):
                x = self.b(x)
                loss = x.pow(2).mean()
            assert x.shape == (1, 4) and x.dim() == 2  # reading metadata is no op: allowed outside a block
            return x, loss

    model = poptorch.trainingModel(LossInside(), _auto_increment(1, 3))
    model(torch.randn(3, 4))
    assert model.num_stages == 2


def test_ops_before_the_first_block_run_on_ipu_0_as_on_poptorch():
    # No block is active yet, so PopTorch places them on IPU 0 (its compiler's starting IPU): with the first
    # block on IPU 1, the forward switches IPU once, 2 stages, 3 when training (so GA 2 is too little).
    class OpsBeforeTheFirstBlock(_TwoLayers):
        def __init__(self):
            super().__init__()
            poptorch.BeginBlock(self.b, "b", ipu_id=1)

        def forward(self, x):
            return self.b(self.a(x * 2)).sum()

    with pytest.raises(poptorch.Error, match=r"number of pipeline stages \(3\)"):
        poptorch.trainingModel(OpsBeforeTheFirstBlock(), _auto_increment(1, 2))(torch.randn(2, 4))
    model = poptorch.trainingModel(OpsBeforeTheFirstBlock(), _auto_increment(1, 3))
    model(torch.randn(3, 4))
    assert (model.num_ipus, model.num_stages) == (2, 2)


# -- 7. no zero-sized input -------------------------------------------------------------------------


class _Adds(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x, extra=None):
        return self.l(x) if extra is None else self.l(x) + extra[1].sum()


def test_a_batch_of_zero_samples_is_poptorchs_zero_sized_tensor_error_naming_the_input():
    opts = poptorch.Options().deviceIterations(2)
    with pytest.raises(poptorch.Error) as error:
        poptorch.inferenceModel(_Adds(), opts)(torch.empty(0, 4))
    message = str(error.value)
    assert message.startswith("Zero-sized tensors are unsupported (Got shape [0, 4]).")  # PopTorch's sentence
    assert "The input x of forward has shape [0, 4]" in message
    assert "a batch of at least 2 samples, one per micro-batch" in message  # the fix, with the number


def test_a_zero_sized_dimension_other_than_the_batch_names_the_input_and_the_dimension():
    opts = poptorch.Options().deviceIterations(2)
    extra = [torch.ones(4, 1), torch.empty(4, 3, 0)]
    with pytest.raises(poptorch.Error) as error:
        poptorch.inferenceModel(_Adds(), opts)(torch.ones(4, 4), extra=extra)
    message = str(error.value)
    # PopTorch's shape is one micro-batch's: 4 samples over 2 device iterations
    assert message.startswith("Zero-sized tensors are unsupported (Got shape [2, 3, 0]).")
    assert "The input extra[1] of forward has shape [4, 3, 0]" in message
    assert "give dimension 2 at least one element" in message


def test_a_zero_sized_floating_point_weight_is_poptorchs_zero_sized_tensor_error_naming_it():
    # PopTorch moves the weights to the IPU before the inputs: the weight is named first
    model = poptorch.trainingModel(nn.Sequential(nn.Linear(0, 1), nn.Flatten(0)))
    with pytest.raises(poptorch.Error, match=r"^Zero-sized tensors are unsupported \(Got shape \[1, 0\]\)\. "
                       r"The model's parameter 0.weight has a dimension of size 0"):  # fmt: skip
        model(torch.empty(2, 0))
    counted = nn.Linear(2, 2)
    counted.register_buffer("seen", torch.empty(0, dtype=torch.long))  # an integer one is a constant there
    poptorch.inferenceModel(counted)(torch.ones(1, 2))
    counted.register_buffer("scales", torch.empty(0))
    with pytest.raises(poptorch.Error, match=r"The model's buffer scales has a dimension of size 0"):
        poptorch.inferenceModel(counted)(torch.ones(1, 2))


# -- 8. a loss no trainable parameter reaches: PopTorch runs, updating nothing -----------------------


class _FrozenWithLoss(nn.Module):
    """PopTorch's norms_test.py::test_batchNorm_eval_during_training, with a Linear: every weight frozen."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)
        self.l.requires_grad_(False)

    def forward(self, x, target):
        y = self.l(x)
        return y, nn.functional.mse_loss(y, target)


def test_a_training_model_with_every_parameter_frozen_runs_and_changes_no_weight_as_on_poptorch(caplog):
    torch.manual_seed(0)
    model, x, target = _FrozenWithLoss(), torch.randn(4, 4), torch.randn(4, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    native_out, native_loss = model(x, target)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        for _ in range(2):
            out, loss = training(x, target)
    torch.testing.assert_close(out, native_out)
    torch.testing.assert_close(loss, native_loss)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert caplog.text.count("The loss depends on no trainable parameter") == 1  # said once, at compile
    assert "set requires_grad=True on the parameters to learn" in caplog.text  # the fix


def test_an_identity_loss_no_trainable_parameter_reaches_is_the_loss_and_changes_no_weight(caplog):
    class LossOfTheInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return self.l(x), poptorch.identity_loss(x.pow(2), reduction="mean")

    model, x = LossOfTheInputs(), torch.randn(2, 4)
    weight = model.l.weight.detach().clone()
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        out, loss = poptorch.trainingModel(model)(x)
    torch.testing.assert_close(loss, x.pow(2).mean())
    assert torch.equal(model.l.weight, weight)
    assert "The loss depends on no trainable parameter" in caplog.text


def test_a_detached_loss_beside_outputs_that_require_grad_is_still_no_loss_in_graph():
    class Detached(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            y = self.l(x)
            return y, y.detach().sum()  # not a torch loss nor identity_loss: PopTorch finds no loss either

    with pytest.raises(poptorch.Error, match="^Couldn't find a loss in graph!"):
        poptorch.trainingModel(Detached())(torch.randn(2, 4))


# -- 9. an input that requires grad is detached, as PopTorch detaches it ----------------------------


def test_an_input_that_requires_grad_is_detached_with_poptorchs_warning_and_gets_no_grad(caplog):
    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(2, 2)

        def forward(self, x):
            y = self.l(x)
            return y, y.pow(2).sum()

    x = torch.ones(2, 2, requires_grad=True)
    model = poptorch.trainingModel(WithLoss())
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        for _ in range(2):
            model(x)
    assert x.grad is None  # no backward pass reaches an input on PopTorch
    # PopTorch's sentence (tests/tensor_ops_test.py::test_requires_grad_true), once per wrapper
    assert caplog.text.count(
        "Input tensor has requires_grad=True set. This tensor will be detached because backward pass via "
        "inputs is not supported."
    ) == 1
    assert "return the gradient as an output" in caplog.text
    inference = poptorch.inferenceModel(nn.Linear(2, 2))
    assert not inference(torch.ones(1, 2, requires_grad=True)).requires_grad
