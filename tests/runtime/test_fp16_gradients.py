"""fp16 training hands the optimizer the true mean gradient: its magnitude, not only its sign and dtype.

The reference is plain PyTorch in fp32 on the same weights and micro-batches: the mean over the
micro-batches of each one's gradient. The fp16 run (loss scaling, gradient accumulation, replicas,
emulated fp16 compute) must hand its optimizer fp32 gradients equal to that within fp16 round-off; a
gradient off by any constant factor (a scale not divided back, a mean over the wrong count) fails.
Both gradient accumulators are held to it: fp32 (PopTorch's default) and fp16 (Optimum Graphcore's fp16
training, IPUTrainer's), whose sums round each addition to fp16 at the loss-scaled magnitude.
"""

from __future__ import annotations

import pytest
import torch
from fixtures import tiny_bert_config
from transformers import BertForSequenceClassification

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.runtime.batches import split_batch
from optimum_ipu.runtime.executor import TrainingExecutable
from optimum_ipu.runtime.loss_scaling import LossScaler
from optimum_ipu.runtime.replicas import ReplicaStreams


class RecordingSGD(torch.optim.SGD):
    """Records the fp32 gradients the executable hands over; changes no weight (lr 0)."""

    def step(self, closure=None, gradients=None):
        self.seen = {p: g.detach().clone() for p, g in (gradients or {}).items()}


def data(n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "input_ids": torch.randint(5, 128, (n, 10), generator=g),
        "attention_mask": torch.ones(n, 10, dtype=torch.long),
        "labels": torch.randint(0, 2, (n,), generator=g),
    }


@pytest.mark.parametrize("accumulator", [torch.float32, torch.float16], ids=["fp32-sums", "fp16-sums"])
@pytest.mark.parametrize("loss_scaling", [1.0, 1024.0])
@pytest.mark.parametrize("ga, replicas", [(2, 2), (1, 1)])  # summed in buffers; one micro-batch, none
def test_fp16_gradients_equal_the_fp32_mean_gradient_of_the_same_micro_batches(
    loss_scaling, ga, replicas, accumulator
):
    torch.manual_seed(0)
    fp16 = BertForSequenceClassification(tiny_bert_config()).half()
    fp32 = BertForSequenceClassification(tiny_bert_config())
    fp32.load_state_dict({k: v.float() for k, v in fp16.state_dict().items()})  # the very same weights
    batch = data(8)
    config = CallLayout(gradient_accumulation_steps=ga, replication_factor=replicas, device_iterations=1)  # fmt: skip
    optimizer = RecordingSGD(fp16.parameters(), lr=0.0)
    executable = TrainingExecutable(
        fp16, config, lambda mb: fp16(**mb).loss, optimizer, LossScaler(loss_scaling), ReplicaStreams(0, replicas),
        fp16_compute="emulated", accumulator_dtype=accumulator,
    )  # fmt: skip
    executable(batch)

    fp32.train()
    micro_batches = split_batch(batch, ga * replicas)
    for micro in micro_batches:
        (fp32(**micro).loss / len(micro_batches)).backward()
    by_name = dict(fp16.named_parameters())
    compared = 0
    for name, p in fp32.named_parameters():
        expected = p.grad
        got = optimizer.seen[by_name[name]]
        assert got.dtype == torch.float32
        scale = expected.abs().max().item()
        if scale < 1e-4:  # too small for fp16 activations to carry a relative comparison
            continue
        torch.testing.assert_close(got, expected, rtol=0, atol=0.03 * scale, msg=name)
        ratio = (got * expected).sum() / (expected * expected).sum()  # magnitude: a least-squares factor
        assert ratio.item() == pytest.approx(1.0, abs=0.01), name
        compared += 1
    assert compared > 20
