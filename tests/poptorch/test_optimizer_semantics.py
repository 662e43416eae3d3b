"""The optimizer as PopTorch 3.4 uses it (its optimizers_test.py): no Python optimizer code runs, only the
algorithm of SGD, Adam, AdamW, RMSprop or LAMB with the optimizer's attributes; `poptorch.optim`'s
`state_dict()` carries `ipu_state` and `ipu_param`, and only such a dict loads into one."""

import copy
import logging

import pytest
import torch
from fixtures import LinearRegression

import poptorch


def _data():
    torch.manual_seed(1)
    return torch.randn(8, 4), torch.randn(8, 1)


class StepDoublingSGD(torch.optim.SGD):
    """A subclass whose own step PopTorch never runs (it would apply each update twice)."""

    def step(self, closure=None):
        super().step(closure)
        return super().step(closure)


def test_a_subclass_step_is_not_run_the_parent_algorithm_is_with_a_warning_once(caplog):
    x, y = _data()
    model, reference = LinearRegression(), LinearRegression()
    optimizer = StepDoublingSGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING):
        training = poptorch.trainingModel(model, optimizer=optimizer)  # PopTorch warns when it takes it
        training(x, y)
        training(x, y)
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        sgd.zero_grad()
        reference(x, y)[1].backward()
        sgd.step()
    torch.testing.assert_close(model.linear.weight, reference.linear.weight)
    warnings = [r for r in caplog.records if "StepDoublingSGD" in r.getMessage()]
    assert len(warnings) == 1 and "Poptorch does not run Python optimizer code directly" in warnings[0].getMessage()
    assert "step" not in vars(optimizer)  # the subclass's step is back after the call


def test_poptorch_optimizer_state_dict_has_ipu_entries_none_until_compiled():
    x, y = _data()
    model = LinearRegression()
    optimizer = poptorch.optim.Adam(model.parameters(), lr=0.05, weight_decay=0.025, loss_scaling=0.75)
    training = poptorch.trainingModel(model, optimizer=optimizer)
    before = optimizer.state_dict()
    assert before["ipu_state"] is None and before["ipu_param"] is None
    training.compile(x, y)
    compiled = optimizer.state_dict()
    params = compiled["ipu_param"]
    assert params["learningRate___specific___linear.bias"] == torch.tensor(0.05)
    assert params["weightDecay___specific___linear.weight"] == torch.tensor(0.025)
    assert params["lossScaling_FLOAT"] == torch.tensor(0.75)
    training(x, y)
    state = optimizer.state_dict()["ipu_state"]
    assert set(state) >= {"exp_avg___linear.weight", "exp_avg_sq___linear.bias"}
    torch.testing.assert_close(state["exp_avg___linear.weight"], optimizer.state[model.linear.weight]["exp_avg"])


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "half"])
def test_a_saved_ipu_state_dict_loads_back_and_training_continues_alike(half):
    """A half model's optimizer keeps fp32 moments: loading them into a new optimizer kept torch's cast to the
    weights' fp16, and the next update then failed on the mixed types."""
    x, y = _data()
    x = x.half() if half else x
    model = LinearRegression().half() if half else LinearRegression()
    optimizer = poptorch.optim.Adam(model.parameters(), lr=0.05)
    training = poptorch.trainingModel(model, optimizer=optimizer)
    training(x, y)
    saved_weights, saved_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    training(x, y)
    want = model.linear.weight.detach().clone()

    resumed = LinearRegression().half() if half else LinearRegression()
    resumed.load_state_dict(saved_weights)
    resumed_optimizer = poptorch.optim.Adam(resumed.parameters(), lr=0.05)
    resumed_optimizer.load_state_dict(saved_state)
    poptorch.trainingModel(resumed, optimizer=resumed_optimizer)(x, y)
    torch.testing.assert_close(resumed.linear.weight, want, rtol=0, atol=0)


def test_a_torch_optimizers_state_is_refused_by_a_poptorch_optimizer():
    model = LinearRegression()
    torch_state = torch.optim.Adam(model.parameters(), lr=0.05).state_dict()
    optimizer = poptorch.optim.Adam(model.parameters(), lr=0.05)
    with pytest.raises(RuntimeError, match="Only IPU optimizer states can be loaded onto the IPU"):
        optimizer.load_state_dict(torch_state)
    with pytest.raises(RuntimeError, match="empty"):
        optimizer.load_state_dict({})


def _fp16_accumulator_model(accum_type):
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    model = LinearRegression()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.01, accum_type=accum_type)
    return opts, poptorch.trainingModel(model, opts, optimizer=optimizer), model


def test_taking_an_fp16_accumulator_sets_the_running_mean_strategy_in_the_models_options():
    """PopTorch (`_optimizer_attributes.py`) writes `MeanReductionStrategy.Running` into the model's options
    (its copy of the user's) when it takes an optimizer whose `accum_type` is fp16 (at wrap, before
    compiling): they read back what the run does; the user's own options are left as they were."""
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    opts, training, _ = _fp16_accumulator_model(torch.float16)
    strategy = poptorch.MeanReductionStrategy
    assert training.options.Training.meanAccumulationAndReplicationReductionStrategy == strategy.Running
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy == strategy.Post
    training(x, y)
    assert training.options.Training.meanAccumulationAndReplicationReductionStrategy == strategy.Running
    _, training32, _ = _fp16_accumulator_model(torch.float32)
    training32(x, y)
    assert training32.options.Training.meanAccumulationAndReplicationReductionStrategy == strategy.Post


def test_set_optimizer_refuses_an_fp16_accumulator_after_compiling_with_the_post_strategy():
    """PopTorch raises: the new optimizer would need the Running strategy the compiled executable lacks."""
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    _, training, model = _fp16_accumulator_model(torch.float32)
    training(x, y)
    with pytest.raises(ValueError, match="Running but the executable is already compiled"):
        training.setOptimizer(poptorch.optim.SGD(model.parameters(), lr=0.01, accum_type=torch.float16))
    training(x, y)  # the old optimizer still trains


def test_the_combined_sgd_variant_keeps_the_post_strategy_and_a_later_set_optimizer_takes_it():
    """`use_combined_accum=True` is PopTorch's combined SGD variant, for which it keeps the Post strategy even
    with an fp16 accumulator (`_optimizer_attributes.py`; its options test expects Post): so the options read
    back Post and a `setOptimizer` with it after compiling with an fp32 optimizer is accepted."""
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    strategy = poptorch.MeanReductionStrategy
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    model = LinearRegression()
    combined = poptorch.optim.SGD(model.parameters(), lr=0.01, accum_type=torch.float16, use_combined_accum=True)
    assert combined.use_combined_accum is True
    training = poptorch.trainingModel(model, opts, optimizer=combined)
    training(x, y)
    assert training.options.Training.meanAccumulationAndReplicationReductionStrategy == strategy.Post
    _, training32, model32 = _fp16_accumulator_model(torch.float32)
    training32(x, y)
    training32.setOptimizer(
        poptorch.optim.SGD(model32.parameters(), lr=0.01, accum_type=torch.float16, use_combined_accum=True)
    )
    training32(x, y)


class _Squared(torch.nn.Module):
    """`layer`'s output and the mean of its square (computed in fp32) as the loss."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        out = self.layer(x)
        return out, out.float().pow(2).mean()


def _half_linear_trained(optimizer_class, rounding: bool, seed: int | None = None) -> torch.Tensor:
    """An fp16 Linear trained 3 calls by `optimizer_class` under `enableStochasticRounding(rounding)`."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).half()
    opts = poptorch.Options()
    if seed is not None:
        opts.randomSeed(seed)
    opts.Precision.enableStochasticRounding(rounding)
    training = poptorch.trainingModel(_Squared(layer), opts, optimizer=optimizer_class(layer.parameters(), lr=1e-3))
    inputs = torch.Generator().manual_seed(5)
    for _ in range(3):
        training(torch.randn(8, 64, generator=inputs).half())
    return layer.weight.detach().clone()


@pytest.mark.parametrize("optimizer_class", [poptorch.optim.AdamW, poptorch.optim.LAMB])
def test_stochastic_rounding_follows_the_options_for_every_poptorch_optimizer(optimizer_class, caplog):
    """`Precision.enableStochasticRounding` decides the rounding of the fp16 weights' updates, LAMB's too (its
    own default is not the options'), and the model says nothing about changed hyper-parameters: the user
    changed none."""
    caplog.set_level(logging.WARNING)
    nearest, stochastic = _half_linear_trained(optimizer_class, False), _half_linear_trained(optimizer_class, True)
    assert (nearest != stochastic).sum() > 100
    assert not [r for r in caplog.records if "hyper-parameters changed" in r.getMessage()]


def test_stochastic_rounding_draws_follow_the_options_random_seed():
    """On the IPU `randomSeed` seeds the device's generators, which stochastic rounding draws from: another
    seed, other roundings; the same seed, the same bits."""
    first, again = _half_linear_trained(torch.optim.SGD, True, seed=1), _half_linear_trained(torch.optim.SGD, True, seed=1)
    other = _half_linear_trained(torch.optim.SGD, True, seed=2)
    assert torch.equal(first, again)
    assert (first != other).sum() > 100


def _two_calls(optimizer_of, change, mark_variable: str | None = None):
    """Train LinearRegression one call with `optimizer_of(params)`, apply `change(optimizer)` and give it to
    `setOptimizer`, then train a second call: (the model's weights, a plain torch loop's with the same change)."""
    torch.manual_seed(0)
    model = LinearRegression()
    reference = copy.deepcopy(model)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    optimizer, plain = optimizer_of(model.parameters()), optimizer_of(reference.parameters())
    if mark_variable:
        optimizer.variable_attrs.markAsVariable(mark_variable)
    training = poptorch.trainingModel(model, poptorch.Options(), optimizer=optimizer)
    for call in range(2):
        if call:
            change(optimizer)
            change(plain)
            training.setOptimizer(optimizer)
        training(x, y)
        plain.zero_grad()
        reference(x, y)[1].backward()
        plain.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), torch.cat(
        [p.detach().reshape(-1) for p in reference.parameters()]
    )


def _momentum(value):
    def change(optimizer):
        optimizer.param_groups[0]["momentum"] = value

    return change


def test_set_optimizer_refuses_a_change_to_an_attribute_compiled_as_a_constant_and_keeps_the_old_one():
    """PopTorch compiles the attributes a poptorch.optim optimizer was not given as constants (docs, "Constant
    attributes"): momentum changed later is refused by name, and the model trains on with what it had."""
    torch.manual_seed(0)
    model = LinearRegression()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1)
    assert optimizer.variable_attrs.isConstant("momentum") and not optimizer.variable_attrs.isConstant("lr")
    training = poptorch.trainingModel(model, poptorch.Options(), optimizer=optimizer)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    training(x, y)
    optimizer.param_groups[0]["momentum"] = 0.9
    with pytest.raises(poptorch.Error, match=r"momentum of parameter group 0 was compiled as a constant \(0\) and "
                                             r"cannot change to 0.9.*markAsVariable\('momentum'\)"):  # fmt: skip
        training.setOptimizer(optimizer)
    training(x, y)  # still the compiled optimizer's momentum 0: trains on
    loss_scaled = poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=64.0)
    with pytest.raises(poptorch.Error, match=r"attribute loss_scaling was compiled as a constant \(1.0\)"):
        training.setOptimizer(loss_scaled)


@pytest.mark.parametrize(
    "optimizer_of, mark_variable",
    [
        (lambda params: poptorch.optim.SGD(params, lr=0.1, momentum=0.5), None),  # given: a variable
        (lambda params: poptorch.optim.SGD(params, lr=0.1), "momentum"),  # marked a variable before compiling
        (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.5), None),  # a torch optimizer's non-default
    ],
    ids=["given", "marked-variable", "torch-non-default"],
)
def test_a_variable_attribute_changed_by_set_optimizer_trains_as_the_plain_loop(optimizer_of, mark_variable):
    ipu, plain = _two_calls(optimizer_of, _momentum(0.9), mark_variable)
    torch.testing.assert_close(ipu, plain, rtol=0, atol=1e-6)


def test_a_torch_optimizers_constants_are_judged_by_value_betas_and_alpha_always_lr_never():
    """A torch optimizer records nothing of what it was given: PopTorch makes constants of its attributes at
    their neutral values (dampening 0, ...), of its betas and alpha whatever their values, never of lr."""
    with pytest.raises(poptorch.Error, match=r"dampening of parameter group 0 was compiled as a constant"):
        _two_calls(lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.5),
                   lambda o: o.param_groups[0].update(dampening=0.1))  # fmt: skip
    with pytest.raises(poptorch.Error, match=r"betas of parameter group 0 was compiled as a constant"):
        _two_calls(lambda params: torch.optim.Adam(params, lr=0.1, betas=(0.8, 0.99)),
                   lambda o: o.param_groups[0].update(betas=(0.7, 0.99)))  # fmt: skip
    with pytest.raises(poptorch.Error, match=r"alpha of parameter group 0 was compiled as a constant"):
        _two_calls(lambda params: torch.optim.RMSprop(params, lr=0.1, alpha=0.9),
                   lambda o: o.param_groups[0].update(alpha=0.8))  # fmt: skip

    def halve_lr(optimizer):
        optimizer.param_groups[0]["lr"] /= 2

    ipu, plain = _two_calls(lambda params: torch.optim.SGD(params, lr=0.1), halve_lr)
    torch.testing.assert_close(ipu, plain, rtol=0, atol=1e-6)


def test_velocity_scaling_given_to_the_separate_sgd_variant_says_it_has_no_effect(caplog):
    """PopTorch scales the velocity only in the combined variant and warns when the separate one is given it."""
    caplog.set_level(logging.WARNING)
    poptorch.optim.SGD(LinearRegression().parameters(), lr=0.1, momentum=0.9, velocity_scaling=4.0)
    assert [r for r in caplog.records if "velocity_scaling=4.0 has no effect with the separate SGD" in r.getMessage()]
    caplog.clear()
    poptorch.optim.SGD(LinearRegression().parameters(), lr=0.1, momentum=0.9, velocity_scaling=4.0,
                       use_combined_accum=True)  # fmt: skip
    assert not [r for r in caplog.records if "velocity_scaling" in r.getMessage()]


def test_stochastic_rounding_draws_carry_on_through_set_optimizer_with_a_new_optimizer():
    """The draws come from the device's generators, not the optimizer object: a setOptimizer with a new,
    equal optimizer continues them exactly as giving the same object again does."""

    def trained(new_object: bool) -> torch.Tensor:
        torch.manual_seed(0)
        layer = torch.nn.Linear(64, 64).half()
        opts = poptorch.Options().randomSeed(3)
        opts.Precision.enableStochasticRounding(True)
        optimizer = torch.optim.SGD(layer.parameters(), lr=1e-3)
        training = poptorch.trainingModel(_Squared(layer), opts, optimizer=optimizer)
        inputs = torch.Generator().manual_seed(5)
        for call in range(3):
            if call:
                training.setOptimizer(torch.optim.SGD(layer.parameters(), lr=1e-3) if new_object else optimizer)
            training(torch.randn(8, 64, generator=inputs).half())
        return layer.weight.detach().clone()

    assert torch.equal(trained(new_object=True), trained(new_object=False))
