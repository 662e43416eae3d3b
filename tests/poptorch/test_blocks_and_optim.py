"""Blocks and PopTorch's placement checks; poptorch.optim's extra arguments; model.half() training."""

import copy

import pytest
import torch
from torch import nn

import poptorch


class Four(nn.Module):
    """Four layers; forward returns (output, loss)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x, x.pow(2).mean()


def on_ipus(model, ipus):
    for layer, ipu in zip(model.layers, ipus):
        if ipu is not None:
            poptorch.BeginBlock(layer, ipu_id=ipu)
    return model


def test_pipelined_training_needs_gradient_accumulation_2n_minus_1():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(5)
    with pytest.raises(poptorch.Error, match=r"gradientAccumulation must be greater than or equal to the number of "
                       r"pipeline stages \(7\) when using poptorch.PipelinedExecution. Please note that a model with 4 "
                       r"pipeline stages in PopTorch will have an additional 3 stages when training."):  # fmt: skip
        poptorch.trainingModel(on_ipus(Four(), [0, 1, 2, 3]), opts)(torch.randn(5 * 2, 4))
    ok = poptorch.Options()
    ok.Training.gradientAccumulation(7)
    model = poptorch.trainingModel(on_ipus(Four(), [0, 1, 2, 3]), ok)
    model(torch.randn(7 * 2, 4))
    assert (model.num_ipus, model.num_stages) == (4, 4)


def test_sharded_training_has_no_accumulation_constraint_and_equals_one_device():
    torch.manual_seed(0)
    plain = Four()
    sharded = on_ipus(copy.deepcopy(plain), [0, 1, 2, 3])
    opts = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution())
    x = torch.randn(4, 4)
    poptorch.trainingModel(sharded, opts)(x)
    poptorch.trainingModel(plain)(x)
    for p, q in zip(plain.parameters(), sharded.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_pipelined_inference_needs_device_iterations_n():
    with pytest.raises(poptorch.Error, match=r"deviceIterations must be greater than or equal to the number of "
                       r"pipeline stages \(2\) when using PopTorch.PipelinedExecution."):  # fmt: skip
        poptorch.inferenceModel(on_ipus(Four(), [0, None, 1, None]))(torch.randn(3, 4))
    out, _ = poptorch.inferenceModel(
        on_ipus(Four(), [0, None, 1, None]), poptorch.Options().deviceIterations(2)
    )(torch.randn(4, 4))
    assert out.shape == (4, 4)


def test_ipu_count_must_be_a_power_of_two_unless_auto_rounded():
    model = on_ipus(Four(), [0, 1, 2, None])
    opts = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution())
    with pytest.raises(poptorch.Error, match="The model specifies the use of 3 IPUs, however PopTorch must reserve a "
                       "minimum of 4 in order to allow the model to run"):  # fmt: skip
        poptorch.inferenceModel(model, opts)(torch.randn(2, 4))
    poptorch.inferenceModel(model, opts.clone().autoRoundNumIPUs(True))(torch.randn(2, 4))
    with pytest.raises(poptorch.Error, match=r"Too many IPUs requested \(128\)"):
        poptorch.inferenceModel(Four(), poptorch.Options().replicationFactor(128))(torch.randn(128, 4))


def test_block_context_auto_increment_and_remove_blocks():
    class WithBlocks(Four):
        def forward(self, x):
            with poptorch.Block("a", ipu_id=0):
                x = self.layers[0](x)
            with poptorch.Block("b", ipu_id=1):
                x = self.layers[1](x)
            with poptorch.Block("c", ipu_id=0):
                x = self.layers[2](x)
                loss = x.pow(2).mean()  # in a block: PopTorch refuses an op after the last one ended
            return x, loss

    opts = poptorch.Options().setExecutionStrategy(
        poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement)
    )
    opts.Training.gradientAccumulation(5)
    model = poptorch.trainingModel(WithBlocks(), opts)
    model(torch.randn(10, 4))
    assert model.num_stages == 3
    layer = nn.Linear(2, 2)
    poptorch.BeginBlock(layer, "x", 1)
    with pytest.raises(poptorch.Error, match="module has already been assigned to a block."):
        poptorch.BeginBlock(layer, "y", 2)
    poptorch.removeBlocks(layer)
    poptorch.BeginBlock(layer, "y", 2)


def test_poptorch_optim_sgd_loss_scaling_and_clipping_equal_plain_pytorch():
    torch.manual_seed(0)
    model, ref = Four(), None
    ref = copy.deepcopy(model)
    opt = poptorch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, loss_scaling=1024.0, max_grad_norm=0.01
    )
    x = torch.randn(4, 4)
    _, loss = poptorch.trainingModel(model, optimizer=opt)(x)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_loss = ref(x)[1]
    ref_loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01)
    ref_opt.step()
    torch.testing.assert_close(loss, ref_loss.detach())
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_accumulation_types_must_be_fp16_or_fp32():
    with pytest.raises(
        AssertionError, match="Accumulation types must be either torch.float32 or torch.float16"
    ):
        poptorch.optim.Adam(Four().parameters(), accum_type=torch.bfloat16)


@pytest.mark.parametrize("optimizer", ["torch", "poptorch"])
def test_half_model_trains_through_the_fp16_path(optimizer):
    torch.manual_seed(0)
    model = Four().half()
    params = model.parameters()
    opt = (
        torch.optim.SGD(params, lr=0.5)
        if optimizer == "torch"
        else poptorch.optim.SGD(params, lr=0.5, loss_scaling=128)
    )
    opts = poptorch.Options().deviceIterations(4)
    opts.Precision.enableStochasticRounding(True)
    training = poptorch.trainingModel(model, opts, optimizer=opt)
    x = torch.randn(16, 4)
    opts_all = [float(training(x)[1]) for _ in range(5)]
    assert all(p.dtype == torch.float16 and p.isfinite().all() for p in model.parameters())
    assert opts_all[-1] < opts_all[0]


def test_custom_op_is_a_clear_error():
    with pytest.raises(poptorch.Error, match="custom_op\\('LeakyRelu', domain 'custom.ops'\\) runs a Poplar"):
        poptorch.custom_op([torch.randn(2)], "LeakyRelu", "custom.ops", 1, example_outputs=[torch.randn(2)])


def test_recomputation_checkpoint_and_nop_keep_values():
    x = torch.randn(3, requires_grad=True)
    assert poptorch.recomputationCheckpoint(x) is x and poptorch.nop(x) is x


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_half_weights_without_stochastic_rounding_take_the_fp32_update_rounded_to_nearest(momentum):
    # PopTorch's default (enableStochasticRounding off): the update in fp32, written to fp16 to nearest.
    torch.manual_seed(0)
    weights = [nn.Parameter(torch.randn(5, 4).half()), nn.Parameter(torch.randn(3).half())]
    references = [w.detach().float().requires_grad_() for w in weights]
    optimizer = poptorch.optim.SGD(weights, lr=0.1, momentum=momentum)
    reference = torch.optim.SGD(references, lr=0.1, momentum=momentum)
    for _ in range(3):
        grads = [torch.randn(w.shape) for w in weights]
        optimizer.step(gradients=dict(zip(weights, [g.clone() for g in grads])))
        for r, g in zip(references, grads):
            r.grad = g
        reference.step()
        with torch.no_grad():
            for r in references:
                r.copy_(r.half().float())  # the fp16 weight the next step starts from
    for w, r in zip(weights, references):
        assert w.dtype == torch.float16 and w.grad is None
        assert torch.equal(w.float(), r.detach())


class _Tiny(nn.Module):
    """loss = sum(w * x): the gradient of w is x (times the loss scale in use)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return (self.w * x).sum()


def test_an_fp16_accumulator_rounds_the_gradient_at_the_automatic_scale_in_use():
    # accum_type=fp16 holds the loss-scaled gradient in fp16. Automatic loss scaling starts at the
    # optimizer's loss_scaling (1) and doubles after every clean update, so a gradient of 1e-8, which
    # is 0 in fp16 at scale 1, survives once the scale in use is large enough. Rounded at the
    # optimizer's fixed loss_scaling instead, it is 0 at every step and the weight never moves.
    model = _Tiny()
    opts = poptorch.Options()
    opts.Training.setAutomaticLossScaling(True)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=1.0, loss_scaling=1.0, accum_type=torch.float16)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    x = torch.full((1, 4), 1e-8)
    expected = torch.zeros(4)
    for step in range(12):
        scale = 2.0**step  # plain torch: the fp16 value the accumulator holds at that scale, unscaled
        expected -= (x[0] * scale).half().float() / scale
        training(x)
    assert expected.abs().max() > 0
    torch.testing.assert_close(model.w.detach(), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("ours", "torchs"),
    [
        (lambda p: poptorch.optim.Adam(p, lr=None, betas=None, eps=None, weight_decay=None), torch.optim.Adam),
        (lambda p: poptorch.optim.AdamW(p, betas=None, eps=None, amsgrad=None), torch.optim.AdamW),
        (lambda p: poptorch.optim.RMSprop(p, alpha=None, momentum=None), torch.optim.RMSprop),
        (lambda p: poptorch.optim.SGD(p, lr=0.01, momentum=None, nesterov=None), torch.optim.SGD),
    ],
)
def test_none_arguments_are_torchs_defaults(ours, torchs):
    """PopTorch's optimizers take None for "the default" (graphcore/examples pass `betas=None` through)."""
    weight = nn.Parameter(torch.ones(2))
    theirs = torchs([weight], lr=0.01) if torchs is torch.optim.SGD else torchs([weight])
    mine = ours([weight]).param_groups[0]
    for key, value in theirs.param_groups[0].items():
        if key != "params":
            assert mine[key] == value, key


def test_lamb_defaults_and_no_bias_correction_act():
    weight = nn.Parameter(torch.ones(2))
    group = poptorch.optim.LAMB([weight], lr=None, betas=None, eps=None, weight_decay=None).param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (1e-3, (0.9, 0.999), 1e-8, 1e-2)
    assert group["bias_correction"] is True
    steps = []
    for correction in (True, False):
        weight = nn.Parameter(torch.tensor([1.0, 2.0]))
        optimizer = poptorch.optim.LAMB([weight], lr=0.1, bias_correction=correction)
        assert optimizer.param_groups[0]["bias_correction"] is correction
        weight.grad = torch.tensor([0.5, 0.1])
        optimizer.step()
        steps.append(weight.detach().clone())
    assert not torch.equal(*steps)


@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_without_bias_correction_uses_the_moments_as_they_are(decoupled):
    """One step from w = 1 with gradient 0.5, by hand: m = 0.1 * 0.5 = 0.05, v = 0.001 * 0.25 = 2.5e-4,
    w -= 0.1 * 0.05 / (sqrt(2.5e-4) + 1e-8) = 0.1 * 3.16227..., where torch's corrected step moves 0.1.
    AdamW first decays the weight by lr * weight_decay (0.1 * 0.5); Adam adds weight_decay * w to the gradient."""
    make = poptorch.optim.AdamW if decoupled else poptorch.optim.Adam
    weight = nn.Parameter(torch.ones(1, dtype=torch.float64))
    optimizer = make([weight], lr=0.1, weight_decay=0.5 if decoupled else 0.0, bias_correction=False)
    decay = 1 - 0.1 * 0.5 if decoupled else 1.0
    first = decay - 0.1 * 0.05 / (2.5e-4**0.5 + 1e-8)
    m, v = 0.9 * 0.05 + 0.1 * 0.5, 0.999 * 2.5e-4 + 0.001 * 0.25
    for expected in (first, first * decay - 0.1 * m / (v**0.5 + 1e-8)):
        weight.grad = torch.full_like(weight, 0.5)
        optimizer.step()
        assert weight.item() == pytest.approx(expected, rel=1e-9)
    corrected = nn.Parameter(torch.ones(1, dtype=torch.float64))
    plain = make([corrected], lr=0.1, weight_decay=0.0)
    corrected.grad = torch.full_like(corrected, 0.5)
    plain.step()
    assert corrected.item() == pytest.approx(0.9, rel=1e-6)  # torch's corrected first step: lr


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_rmsprop_tf_variant_takes_tensorflows_step(momentum):
    """By hand, from w = 1 with gradient 0.5 (lr 0.1, alpha 0.9, eps 1e-8): the mean square starts at 1, so
    s1 = 0.9 + 0.1 x 0.25 = 0.925, rms = sqrt(s1 + eps); with momentum the buffer holds lr x g / rms."""
    weight = nn.Parameter(torch.ones(1, dtype=torch.float64))
    optimizer = poptorch.optim.RMSprop([weight], lr=0.1, alpha=0.9, momentum=momentum, use_tf_variant=True)
    s1 = 0.925
    s2 = 0.9 * s1 + 0.025
    step1 = 0.1 * 0.5 / (s1 + 1e-8) ** 0.5
    step2 = 0.1 * 0.5 / (s2 + 1e-8) ** 0.5 + momentum * step1
    for expected in (1 - step1, 1 - step1 - step2):
        weight.grad = torch.full_like(weight, 0.5)
        optimizer.step()
        assert weight.item() == pytest.approx(expected, rel=1e-12)
    plain = nn.Parameter(torch.ones(1, dtype=torch.float64))
    torchs = poptorch.optim.RMSprop([plain], lr=0.1, alpha=0.9, momentum=momentum)
    plain.grad = torch.full_like(plain, 0.5)
    torchs.step()
    assert plain.item() != pytest.approx(1 - step1)  # torch's variant starts the mean square at 0


def test_every_poptorch_optimizer_is_a_poptorch_optimizer_and_pickles_under_a_scheduler():
    """graphcore/examples annotate with `poptorch.optim.Optimizer`; Lightning saves the state of a scheduler
    that holds the optimizer, whose `step` the scheduler wrapped."""
    import io

    weight = nn.Parameter(torch.ones(2))
    for make in (poptorch.optim.SGD, poptorch.optim.Adam, poptorch.optim.AdamW, poptorch.optim.RMSprop,
                 poptorch.optim.LAMB):  # fmt: skip
        optimizer = make([weight], lr=0.1)
        assert isinstance(optimizer, poptorch.optim.Optimizer)
        torch.optim.lr_scheduler.MultiStepLR(optimizer, [1])
        buffer = io.BytesIO()
        torch.save(optimizer, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert loaded.loss_scaling == optimizer.loss_scaling and loaded.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("make", [poptorch.optim.SGD, poptorch.optim.Adam, poptorch.optim.AdamW, poptorch.optim.RMSprop])
def test_a_users_step_hook_runs_once_per_step(make):
    """torch wraps the step of each optimizer class it instantiates; ours call their parent's step, which
    must not run the user's hooks a second time once a plain torch optimizer of that class exists."""
    weight = nn.Parameter(torch.ones(2))
    getattr(torch.optim, make.__name__)([nn.Parameter(torch.ones(1))])  # torch now wraps the parent's step
    optimizer = make([weight], lr=0.1)
    calls = []
    optimizer.register_step_pre_hook(lambda *_: calls.append("pre"))
    optimizer.register_step_post_hook(lambda *_: calls.append("post"))
    weight.grad = torch.ones(2)
    optimizer.step()
    assert calls == ["pre", "post"]


def test_set_optimizer_takes_a_torch_optimizer_on_half_weights():
    """A plain torch optimizer given by `setOptimizer` to a half model updates through fp32 copies, as the
    one given at wrapping does (it raised on `step(gradients=...)` before). Hand-worked: the weight of
    `sum(w * x)` has gradient sum(x), so SGD writes fp16(w - lr * sum(x)) to nearest."""

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.tensor([1.0, -2.0, 0.5]).half())

        def forward(self, x):
            return (self.w * x).sum().float()

    model = Scale()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.25))
    x = torch.tensor([[1.0, 2.0, 4.0]]).half()
    training(x)
    expected = torch.tensor([1.0, -2.0, 0.5]) - 0.25 * torch.tensor([1.0, 2.0, 4.0])
    assert torch.equal(model.w.detach(), expected.half())
    training.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.125))
    training(x)
    expected = expected - 0.125 * torch.tensor([1.0, 2.0, 4.0])
    assert model.w.dtype == torch.float16 and torch.equal(model.w.detach(), expected.half())


def test_set_optimizer_applies_the_new_loss_scaling():
    # loss_scaling is one of an optimizer's variable attributes: setOptimizer writes it to the device.
    # With an fp16 gradient accumulator, a gradient of 1e-8 is 0 at scale 1 and survives at scale 2**20,
    # so the weight moves only once the new optimizer's scale is in force (hand-worked with plain torch).
    model = _Tiny()
    first = poptorch.optim.SGD(model.parameters(), lr=1.0, loss_scaling=1.0, accum_type=torch.float16)
    training = poptorch.trainingModel(model, optimizer=first)
    x = torch.full((1, 4), 1e-8)
    training(x)
    assert torch.equal(model.w.detach(), torch.zeros(4))  # (1e-8).half() == 0: nothing to apply
    scale = 2.0**20
    training.setOptimizer(
        poptorch.optim.SGD(model.parameters(), lr=1.0, loss_scaling=scale, accum_type=torch.float16)
    )
    training(x)
    expected = -(x[0] * scale).half().float() / scale
    assert expected.abs().min() > 0
    torch.testing.assert_close(model.w.detach(), expected, rtol=0, atol=0)
