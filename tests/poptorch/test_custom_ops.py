"""`poptorch.custom_op`: the custom ops of Graphcore's applications against plain PyTorch or a hand-worked
answer, inside `trainingModel` / `inferenceModel` too, and the errors for the rest.

Training checks: one trainingModel call (SGD with momentum, DI x GA = 2 x 2) gives the weights of the
plain loop over the same micro-batches within 1e-6.
"""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import poptorch

DI, GA, MB = 2, 2, 3


def plain_steps(model, *inputs, lr=0.1):
    """The plain loop: per device iteration, the mean of GA micro-batch gradients, one SGD step."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr, momentum=0.9)
    chunks = [t.reshape(DI, GA, -1, *t.shape[1:]) for t in inputs]
    for d in range(DI):
        opt.zero_grad()
        for g in range(GA):
            (model(*(c[d, g] for c in chunks))[1] / GA).backward()
        opt.step()


def ipu_steps(model, *inputs, lr=0.1):
    opts = poptorch.Options().deviceIterations(DI)
    opts.Training.gradientAccumulation(GA)
    params = [p for p in model.parameters() if p.requires_grad]
    training = poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(params, lr=lr, momentum=0.9))
    out = training(*inputs)
    training.destroy()
    return out


def assert_same_weights(a, b, atol=1e-6):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=name)


# -- RemapCE and CopyTensor: identities ------------------------------------------------------------------------
REMAP_ATTRIBUTES = {"fwd_grain_size": 16, "bwd_grain_size": 16, "fwd_clone_layout": 0, "bwd_clone_layout": 0,
                    "fwd_after_matmul": 0, "bwd_after_matmul": 0, "debug_str": "attn"}  # fmt: skip


@pytest.mark.parametrize("name", ["RemapCE", "CopyTensor"])
def test_identity_ops_return_a_copy_and_pass_the_gradient_through(name):
    x = torch.randn(3, 4, requires_grad=True)
    attributes = REMAP_ATTRIBUTES if name == "RemapCE" else None
    out = poptorch.custom_op([x], name, "ai.graphcore", 1, example_outputs=[x], attributes=attributes)
    assert isinstance(out, list) and len(out) == 1
    torch.testing.assert_close(out[0], x, rtol=0, atol=0)
    assert out[0].data_ptr() != x.data_ptr()  # a new tensor, as the op's output is
    weights = torch.randn(3, 4)
    (out[0] * weights).sum().backward()
    torch.testing.assert_close(x.grad, weights, rtol=0, atol=0)


class Remapped(nn.Module):
    def __init__(self, remap=True):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
        self.remap = remap

    def forward(self, x, y):
        h = torch.tanh(self.a(x))
        if self.remap:  # as GPT-2 remaps its attention weights before the matmul
            h = poptorch.custom_op(
                [h], "RemapCE", "ai.graphcore", 1, example_outputs=[h], attributes={"grain_size": 8}
            )[0]
        out = self.b(h)
        return out, F.mse_loss(out, y)


def test_remap_in_a_training_model_trains_as_the_plain_model():
    torch.manual_seed(0)
    plain = Remapped(remap=False)
    model = copy.deepcopy(plain)
    model.remap = True
    x, y = torch.randn(DI * GA * MB, 4), torch.randn(DI * GA * MB, 2)
    ipu_steps(model, x, y)
    plain_steps(plain, x, y)
    assert_same_weights(model, plain)


# -- Ctc -------------------------------------------------------------------------------------------------------
def ctc_inputs(t=7, n=3, c=5, s=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(t, n, c, generator=g).log_softmax(-1).requires_grad_()
    targets = torch.randint(1, c, (n, s), generator=g, dtype=torch.int32)
    input_lengths = torch.tensor([t, t - 1, t - 2][:n], dtype=torch.int32)
    target_lengths = torch.tensor([s, s - 1, 1][:n], dtype=torch.int32)
    return log_probs, targets, input_lengths, target_lengths


def run_ctc(inputs, reduction, out_shape=()):
    dummy = torch.zeros(out_shape, requires_grad=True)
    attributes = {
        "enableReducedClassesInLabel": True,
        "reduction": reduction,
        "blank": 0,
        "outDataType": "UNDIFINED",
    }
    return poptorch.custom_op(list(inputs), "Ctc", "ai.graphcore", 1, example_outputs=[dummy, inputs[0]],
                              attributes=attributes)  # fmt: skip


@pytest.mark.parametrize(
    ("reduction", "torch_reduction"), [("Sum", "sum"), ("Mean", "mean"), ("None", "none")]
)
def test_ctc_equals_torchs_ctc_loss_in_value_and_gradient(reduction, torch_reduction):
    inputs = ctc_inputs()
    log_probs = inputs[0]
    loss, gradient = run_ctc(inputs, reduction, out_shape=(3,) if reduction == "None" else ())
    expected = F.ctc_loss(*(t.long() if i else t for i, t in enumerate(inputs)), reduction=torch_reduction)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    weights = torch.randn(loss.shape)
    (got,) = torch.autograd.grad((loss * weights).sum(), log_probs)
    (want,) = torch.autograd.grad((expected * weights).sum(), log_probs)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # The second output: the gradient of each sample's (unreduced) loss, without a gradient of its own.
    per_sample = F.ctc_loss(*(t.long() if i else t for i, t in enumerate(inputs)), reduction="none")
    (each,) = torch.autograd.grad(per_sample.sum(), log_probs)
    torch.testing.assert_close(gradient, each, rtol=1e-6, atol=1e-6)
    assert not gradient.requires_grad


def test_ctc_mean_divides_each_loss_by_its_target_length_then_averages():
    inputs = ctc_inputs()
    per_sample = run_ctc(inputs, "None", out_shape=(3,))[0]
    mean = run_ctc(inputs, "Mean")[0]
    torch.testing.assert_close(mean, (per_sample / torch.tensor([3.0, 2.0, 1.0])).mean())


def test_ctc_in_half_returns_half_outputs_like_the_examples():
    log_probs, *rest = ctc_inputs()
    half = log_probs.detach().half().requires_grad_()
    loss, gradient = run_ctc([half, *rest], "Sum", out_shape=())
    assert (loss.dtype, gradient.dtype) == (torch.float32, torch.half)  # typed like example_outputs
    dummy = torch.zeros((), dtype=torch.half)
    loss, gradient = poptorch.custom_op([half, *rest], "Ctc", "ai.graphcore", 1, example_outputs=[dummy, half],
                                        attributes={"reduction": "Sum", "blank": 0})  # fmt: skip
    assert loss.dtype == gradient.dtype == torch.half
    loss.backward()
    assert half.grad.dtype == torch.half


class CtcModel(nn.Module):
    """An acoustic model with the conformer's CTC loss call (the targets' last token dropped by its length)."""

    def __init__(self, custom=True):
        super().__init__()
        self.proj = nn.Linear(4, 5)
        self.custom = custom

    def forward(self, features, targets, feature_lengths, target_lengths):
        log_probs = self.proj(features).log_softmax(-1).transpose(0, 1)  # [T, N, C]
        if self.custom:
            dummy = torch.zeros((), requires_grad=True)
            loss = poptorch.custom_op([log_probs, targets, feature_lengths, target_lengths - 1], "Ctc", "ai.graphcore",
                                      1, example_outputs=[dummy, log_probs],
                                      attributes={"reduction": "Sum", "blank": 0})[0]  # fmt: skip
        else:
            loss = F.ctc_loss(log_probs, targets.long(), feature_lengths.long(), (target_lengths - 1).long(),
                              reduction="sum")  # fmt: skip
        loss = loss / log_probs.shape[1]
        return log_probs, poptorch.identity_loss(loss, reduction="mean")


def test_ctc_in_a_training_model_trains_as_torchs_ctc_loss():
    torch.manual_seed(0)
    plain = CtcModel(custom=False)
    model = copy.deepcopy(plain)
    model.custom = True
    n = DI * GA * MB
    features = torch.randn(n, 6, 4)
    targets = torch.randint(1, 5, (n, 3), dtype=torch.int32)
    feature_lengths = torch.randint(4, 7, (n,), dtype=torch.int32)
    target_lengths = torch.randint(2, 4, (n,), dtype=torch.int32)
    inputs = (features, targets, feature_lengths, target_lengths)
    ipu_steps(model, *inputs)
    plain_steps(plain, *inputs)
    assert_same_weights(model, plain)


def test_ctc_runs_in_an_inference_model():
    model = CtcModel()
    inputs = (torch.randn(4, 6, 4), torch.randint(1, 5, (4, 3)), torch.full((4,), 6), torch.full((4,), 3))
    log_probs, losses = poptorch.inferenceModel(model)(*inputs)
    assert log_probs.shape == (6, 4, 5)
    assert torch.isfinite(losses).all()


# -- ExpMovAvg -------------------------------------------------------------------------------------------------
def test_exp_mov_avg_moves_the_teacher_in_place_outside_a_training_model():
    student, teacher = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])
    out = poptorch.custom_op([student, teacher, torch.tensor([0.75])], "ExpMovAvg", "com.acme", 1,
                             example_outputs=[student], attributes={})  # fmt: skip
    torch.testing.assert_close(teacher, torch.tensor([2.5, 5.0]))  # 0.75 * 3 + 0.25 * 1, 0.75 * 6 + 0.25 * 2
    assert out[0] is teacher


class Dino(nn.Module):
    """DINO's shape: the forward moves the teacher toward the student, then the loss uses both."""

    def __init__(self):
        super().__init__()
        self.student = nn.Linear(3, 2)
        self.teacher = copy.deepcopy(self.student)
        for p in self.teacher.parameters():
            p.requires_grad = False

    def forward(self, x, ema_factor, plain=False):
        if not plain:
            with torch.no_grad():
                for s, t in zip(self.student.parameters(), self.teacher.parameters()):
                    poptorch.custom_op(
                        [s, t, ema_factor], "ExpMovAvg", "com.acme", 1, example_outputs=[s], attributes={}
                    )
        target = self.teacher(x).detach()
        out = self.student(x)
        return out, F.mse_loss(out, target.flip(-1))


def test_exp_mov_avg_in_a_training_model_moves_the_teacher_once_per_update_from_the_student_before_it():
    torch.manual_seed(0)
    plain = Dino()
    with torch.no_grad():
        plain.teacher.weight.add_(1.0)  # teacher and student differ, so the averages show
    model = copy.deepcopy(plain)
    x = torch.randn(DI * GA * MB, 3)
    factor = torch.full((DI * GA,), 0.5)  # one factor per micro-batch, as DINO feeds it
    ipu_steps(model, x, factor)

    opt = torch.optim.SGD(plain.student.parameters(), lr=0.1, momentum=0.9)
    xs = x.reshape(DI, GA, MB, 3)
    for d in range(DI):  # the teacher the whole step sees; one average per update, before the student moves
        opt.zero_grad()
        for g in range(GA):
            (plain(xs[d, g], None, plain=True)[1] / GA).backward()
        with torch.no_grad():
            for s, t in zip(plain.student.parameters(), plain.teacher.parameters()):
                t.mul_(0.5).add_(0.5 * s)
        opt.step()
    assert_same_weights(model, plain)


def test_exp_mov_avg_changes_nothing_while_a_model_compiles():
    model = Dino()
    before = [t.clone() for t in model.teacher.parameters()]
    opts = poptorch.Options()
    poptorch.trainingModel(model, opts).compile(torch.randn(2, 3), torch.full((1,), 0.5))
    for t, b in zip(model.teacher.parameters(), before):
        torch.testing.assert_close(t, b, rtol=0, atol=0)


# -- Nms -------------------------------------------------------------------------------------------------------
def nms_call(scores, boxes, k, threshold=0.5, score_threshold=0.1, examples=None, **extra):
    b = scores.shape[0]
    examples = examples or [torch.zeros(b, k, dtype=torch.long), torch.zeros(b, k), torch.zeros(b, k, 4),
                            torch.zeros(b, k, dtype=torch.int), torch.zeros(b, dtype=torch.int)]  # fmt: skip
    attributes = {
        "threshold": threshold,
        "scoreThreshold": score_threshold,
        "numDetections": k,
        "useGather": 1,
    }
    attributes.update(extra)
    return poptorch.custom_op([scores, boxes], "Nms", "ai.graphcore", 1, example_outputs=examples,
                              attributes=attributes)  # fmt: skip


def test_nms_hand_worked():
    # Box 1 overlaps box 0 (IoU 81/119 = 0.68); box 2 is apart. Class 0: box 0 wins and suppresses box 1;
    # class 1: box 1 (0.6) is kept, box 2 (0.05) is under the score threshold.
    boxes = torch.tensor([[[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [20.0, 20.0, 30.0, 30.0]]])
    scores = torch.tensor([[[0.9, 0.2], [0.8, 0.6], [0.3, 0.05]]])
    indices, top_scores, top_boxes, classes, lengths = nms_call(scores, boxes, k=3)
    assert indices.tolist() == [[0, 1, 2]] and indices.dtype == torch.long
    torch.testing.assert_close(top_scores, torch.tensor([[0.9, 0.6, 0.3]]))
    torch.testing.assert_close(top_boxes, boxes[:, [0, 1, 2]])
    assert classes.tolist() == [[0, 1, 0]] and lengths.tolist() == [3]
    # With room for more, the fourth slot is padding and the count stops at 3.
    indices, top_scores, _, classes, lengths = nms_call(torch.cat([scores, scores[:, :1]], 1),
                                                        torch.cat([boxes, boxes[:, :1] + 100], 1), k=4)  # fmt: skip
    assert lengths.tolist() == [4] and indices.tolist() == [[0, 3, 1, 2]]
    indices, top_scores, _, classes, lengths = nms_call(scores, boxes, k=3, score_threshold=0.5)
    assert lengths.tolist() == [2] and indices.tolist() == [[0, 1, -1]]
    assert classes[0, 2] == torch.iinfo(torch.int32).max and top_scores[0, 2] == 0


def reference_nms(scores, boxes, k, threshold, score_threshold):
    """Per-class greedy NMS, then all classes' kept boxes by score: the same result by another route."""

    def iou(a, b):
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = w * h
        area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
        return inter / (area(a) + area(b) - inter)

    n, c = len(scores), len(scores[0])
    kept = []
    for cls in range(c):
        order = sorted(range(n), key=lambda i: -scores[i][cls])
        chosen = []
        for i in order:
            if scores[i][cls] > score_threshold and all(iou(boxes[i], boxes[j]) <= threshold for j in chosen):
                chosen.append(i)
        kept += [(scores[i][cls], i, cls) for i in chosen]
    kept.sort(reverse=True)
    return [(i, cls) for _, i, cls in kept[:k]]


def test_nms_equals_per_class_greedy_nms():
    g = torch.Generator().manual_seed(0)
    b, n, c, k = 3, 12, 3, 8
    corners = torch.rand(b, n, 2, generator=g) * 20
    boxes = torch.cat([corners, corners + 4 + torch.rand(b, n, 2, generator=g) * 6], -1)
    scores = torch.rand(b, n, c, generator=g)
    indices, top_scores, top_boxes, classes, lengths = nms_call(
        scores, boxes, k, threshold=0.3, score_threshold=0.2
    )
    for i in range(b):
        expected = reference_nms(scores[i].tolist(), boxes[i].tolist(), k, 0.3, 0.2)
        got = list(zip(indices[i].tolist(), classes[i].tolist()))[: lengths[i]]
        assert got == expected
        torch.testing.assert_close(top_boxes[i, : lengths[i]], boxes[i, indices[i, : lengths[i]]])
        torch.testing.assert_close(
            top_scores[i, : lengths[i]], scores[i, indices[i, : lengths[i]], classes[i, : lengths[i]]]
        )


def test_soft_nms_lowers_overlapping_scores_instead_of_removing_them():
    boxes = torch.tensor([[[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 5.0]]])  # IoU 0.5
    scores = torch.tensor([[[0.9], [0.8]]])
    _, top_scores, *_ = nms_call(scores, boxes, k=2, threshold=0.3, score_threshold=0.0, sigma=0.5)
    torch.testing.assert_close(top_scores, torch.tensor([[0.9, 0.8 * torch.exp(torch.tensor(-0.25 / 0.5))]]))


def test_nms_runs_in_an_inference_model():
    class Detector(nn.Module):
        def forward(self, scores, boxes):
            return nms_call(scores, boxes, k=2)

    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [20.0, 20.0, 30.0, 30.0]]).expand(
        4, 3, 4
    )
    scores = torch.rand(4, 3, 2)
    out = poptorch.inferenceModel(Detector())(scores, boxes)
    plain = Detector()(scores, boxes)
    for got, want in zip(out, plain):  # the IPU has no int64: a compiled model's indices come back int32
        assert got.dtype == (torch.int32 if want.dtype == torch.int64 else want.dtype)
        torch.testing.assert_close(got, want.to(got.dtype))


# -- errors ----------------------------------------------------------------------------------------------------
def test_an_unknown_op_is_a_clear_error_naming_it_and_the_supported_ones():
    with pytest.raises(
        poptorch.Error, match=r"custom_op\('Cube', domain 'com.acme'\) runs a Poplar"
    ) as error:
        poptorch.custom_op([torch.randn(2)], "Cube", "com.acme", 1, example_outputs=[torch.randn(2)])
    for name in ("RemapCE (ai.graphcore)", "CopyTensor", "Ctc", "ExpMovAvg (com.acme)", "Nms"):
        assert name in str(error.value)
    with pytest.raises(poptorch.Error, match="RemapCE runs here in domain 'ai.graphcore', not 'com.acme'"):
        poptorch.custom_op([torch.randn(2)], "RemapCE", "com.acme", 1, example_outputs=[torch.randn(2)])
    with pytest.raises(poptorch.Error, match="runs here as version 1, not 2"):
        poptorch.custom_op([torch.randn(2)], "RemapCE", "ai.graphcore", 2, example_outputs=[torch.randn(2)])


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({1: 2}, "All attribute keys must be strings."),
        ({"a": None}, "Attribute values must be floats, ints, strings"),
        ({"a": [1, "b"]}, "The types in a list/tuple attribute must all be the same."),
        ({"a": "caf\u00e9"}, "contains non-ASCII characters"),
    ],
)
def test_attributes_are_checked_as_poptorch_checks_them(attributes, message):
    with pytest.raises(ValueError, match=message):
        poptorch.custom_op([torch.randn(2)], "RemapCE", "ai.graphcore", 1, example_outputs=[torch.randn(2)],
                           attributes=attributes)  # fmt: skip


def test_example_outputs_must_match_the_outputs():
    x = torch.randn(2, 3)
    with pytest.raises(
        poptorch.Error, match=r"output 0 is shaped \[2, 3\] but example_outputs\[0\] is shaped \[3\]"
    ):
        poptorch.custom_op([x], "CopyTensor", "ai.graphcore", 1, example_outputs=[torch.zeros(3)])
    with pytest.raises(poptorch.Error, match="has 1 outputs but 2 example_outputs"):
        poptorch.custom_op([x], "CopyTensor", "ai.graphcore", 1, example_outputs=[x, x])


def test_a_shape_only_trace_gets_outputs_like_the_examples():
    x = torch.empty(5, 4, device="meta")
    out = poptorch.custom_op([x, x[:, :4]], "Nms", "ai.graphcore", 1,
                             example_outputs=[torch.zeros(5, 2, dtype=torch.long), torch.zeros(5)])  # fmt: skip
    assert [(t.device.type, tuple(t.shape), t.dtype) for t in out] == [("meta", (5, 2), torch.long),
                                                                        ("meta", (5,), torch.float32)]  # fmt: skip
