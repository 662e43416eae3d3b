"""What a call returns per OutputMode (PopTorch's batching page / PopART's anchor shapes).

Micro-batches are ordered [device iteration][accumulation step][replica]. All: every one; Final:
the last of each replica; Sum: per replica, the sum over device iterations and accumulation steps;
EveryN(N): device iterations N-1, 2N-1, ... A 0-dim output (the loss) becomes a vector, or stays
0-dim when one micro-batch is returned.
"""

import pytest
import torch
from torch import nn

import poptorch


class Frozen(nn.Module):
    """lr 0 keeps weights fixed, so every micro-batch's output is known in advance."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x):
        out = self.linear(x)
        return out, out.pow(2).mean()


def expected_micro_outputs(model, x, di, ga, r):
    with torch.no_grad():
        chunks = x.reshape(di, ga, r, -1, 3)
        return [[[model(chunks[d, g, k]) for k in range(r)] for g in range(ga)] for d in range(di)]


def run(mode, di, ga, r, period=None, mb=2):
    torch.manual_seed(0)
    model = Frozen()
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    if mode is not None:
        opts.outputMode(mode, period)
    x = torch.randn(di * ga * r * mb, 3)
    out, loss = poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))(x)
    return out, loss, expected_micro_outputs(model, x, di, ga, r)


def test_all_returns_every_micro_batch_in_poptorch_order():
    out, loss, e = run(poptorch.OutputMode.All, di=3, ga=2, r=2)
    order = [e[d][g][k] for d in range(3) for g in range(2) for k in range(2)]
    assert out.shape == (3 * 2 * 2 * 2, 2) and loss.shape == (12,)
    torch.testing.assert_close(out, torch.cat([o for o, _ in order]))
    torch.testing.assert_close(loss, torch.stack([loss_ for _, loss_ in order]))


@pytest.mark.parametrize("mode", [None, poptorch.OutputMode.Default, poptorch.OutputMode.Final])
def test_training_default_is_final_the_last_micro_batch_of_each_replica(mode):
    out, loss, e = run(mode, di=3, ga=2, r=2)
    assert out.shape == (2 * 2, 2) and loss.shape == (2,)
    torch.testing.assert_close(out, torch.cat([e[2][1][0][0], e[2][1][1][0]]))
    torch.testing.assert_close(loss, torch.stack([e[2][1][0][1], e[2][1][1][1]]))


def test_final_with_one_replica_returns_a_0_dim_loss():
    out, loss, e = run(poptorch.OutputMode.Final, di=4, ga=1, r=1)
    assert out.shape == (2, 2) and loss.shape == ()
    torch.testing.assert_close(loss, e[3][0][0][1])


def test_sum_adds_device_iterations_and_accumulation_steps_per_replica():
    out, loss, e = run(poptorch.OutputMode.Sum, di=3, ga=2, r=2)
    assert out.shape == (2 * 2, 2) and loss.shape == (2,)
    for k in range(2):
        torch.testing.assert_close(
            out[2 * k : 2 * k + 2], sum(e[d][g][k][0] for d in range(3) for g in range(2))
        )
        torch.testing.assert_close(loss[k], sum(e[d][g][k][1] for d in range(3) for g in range(2)))


def test_every_n_returns_device_iterations_n_minus_1_2n_minus_1():
    out, loss, e = run(poptorch.OutputMode.EveryN, di=10, ga=1, r=1, period=5, mb=1)
    assert out.shape == (2, 2) and loss.shape == (2,)
    torch.testing.assert_close(out, torch.cat([e[4][0][0][0], e[9][0][0][0]]))


def test_inference_default_is_all():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opts = poptorch.Options().deviceIterations(3).replicationFactor(2)
    x = torch.randn(3 * 2 * 4, 3)
    out = poptorch.inferenceModel(model, opts)(x)
    assert out.shape == (24, 2)
    torch.testing.assert_close(out, model(x).detach())
