"""trainingModel = a plain PyTorch loop over the same micro-batches (hand-written reference).

PopTorch lays a combined batch out [device iteration][accumulation step][replica][micro-batch]; per
device iteration the gradients of its GA x replicas micro-batches are reduced (mean or sum) and the
optimizer steps once. The reference below does exactly that with torch alone.
"""

import copy

import pytest
import torch
from torch import nn

import poptorch


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))

    def forward(self, x, y):
        out = self.net(x)
        return out, nn.functional.mse_loss(out, y)


def data(di, ga, r, mb, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = di * ga * r * mb
    return torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)


def reference(model, optimizer, x, y, di, ga, r, mean):
    """Plain PyTorch: per device iteration, sum the GA x R micro-batch gradients, reduce, step once.

    Returns every micro-batch's (output, loss) in PopTorch's order [d][g][r].
    """
    xs, ys = x.reshape(di, ga, r, -1, 4), y.reshape(di, ga, r, -1, 2)
    outputs = []
    for d in range(di):
        optimizer.zero_grad()
        for g in range(ga):
            for k in range(r):
                out, loss = model(xs[d, g, k], ys[d, g, k])
                loss.backward()
                outputs.append((out.detach(), loss.detach()))
        if mean:
            for p in model.parameters():
                p.grad /= ga * r
        optimizer.step()
    return outputs


@pytest.mark.parametrize("reduction", [poptorch.ReductionType.Mean, poptorch.ReductionType.Sum])
@pytest.mark.parametrize("di,ga,r", [(1, 1, 1), (3, 2, 2), (2, 4, 1), (2, 1, 3)])
def test_training_model_equals_the_plain_loop_over_the_same_micro_batches(di, ga, r, reduction):
    torch.manual_seed(0)
    ipu_model = Regressor()
    ref_model = copy.deepcopy(ipu_model)
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r).autoRoundNumIPUs(r == 3)
    opts.Training.gradientAccumulation(ga).accumulationAndReplicationReductionType(reduction)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(
        ipu_model, opts, optimizer=torch.optim.SGD(ipu_model.parameters(), lr=0.1, momentum=0.9)
    )
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    for call in range(2):
        x, y = data(di, ga, r, mb=3, seed=call)
        out, loss = training(x, y)
        expected = reference(
            ref_model, ref_opt, x, y, di, ga, r, mean=reduction == poptorch.ReductionType.Mean
        )
        torch.testing.assert_close(out, torch.cat([o for o, _ in expected]), rtol=0, atol=1e-6)
        m = di * ga * r
        torch.testing.assert_close(
            loss,
            torch.stack([loss_ for _, loss_ in expected]) if m > 1 else expected[0][1],
            rtol=0,
            atol=1e-6,
        )
    for p, q in zip(ipu_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_no_optimizer_means_sgd_with_lr_0_01():
    torch.manual_seed(0)
    model = Regressor()
    ref = copy.deepcopy(model)
    x, y = data(1, 1, 1, 4)
    poptorch.trainingModel(model)(x, y)
    reference(ref, torch.optim.SGD(ref.parameters(), lr=0.01), x, y, 1, 1, 1, mean=True)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


def test_training_and_inference_models_of_one_module_share_weights():
    torch.manual_seed(0)
    model = Regressor()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    inference = poptorch.inferenceModel(model)
    x, y = data(1, 1, 1, 4)
    before, _ = inference(x, y)
    training(x, y)
    training.detachFromDevice()
    after, _ = inference(x, y)
    with torch.no_grad():
        expected, _ = model(x, y)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected)


def test_optimizer_hyper_parameters_change_only_through_set_optimizer():
    torch.manual_seed(0)
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    training = poptorch.trainingModel(model, optimizer=opt)
    x, y = data(1, 1, 1, 4)
    training(x, y)
    opt.param_groups[0]["lr"] = 0.0  # PopTorch keeps lr 0.1 until setOptimizer
    w = model.net[0].weight.clone()
    training(x, y)
    assert not torch.equal(w, model.net[0].weight)
    assert opt.param_groups[0]["lr"] == 0.0  # the user's value is left as the user set it
    training.setOptimizer(opt)
    w = model.net[0].weight.clone()
    training(x, y)
    assert torch.equal(w, model.net[0].weight)


def test_the_returned_loss_is_not_scaled():
    torch.manual_seed(0)
    model = Regressor()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.loss_scaling = 128.0  # what poptorch.optim's loss_scaling sets
    x, y = data(1, 1, 1, 4)
    _, loss = poptorch.trainingModel(model, optimizer=opt)(x, y)
    expected = reference(ref, torch.optim.SGD(ref.parameters(), lr=0.1), x, y, 1, 1, 1, mean=True)
    torch.testing.assert_close(loss, expected[0][1])
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
