"""PopTorch names Graphcore's applications call besides custom ops: `poptorch.Attribute`, name scopes and
`internal_cast` through `torch.ops.poptorch`, `nearest`, `fps` and `ctc_beam_search_decoder`, each against a
hand-worked answer or a brute-force reference, with PopTorch's errors."""

import copy
import itertools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import poptorch
from optimum_ipu.poptorch import attributes


@pytest.fixture(autouse=True)
def _nothing_left_open():
    """Every test starts and must end with no attribute or name scope open."""
    attributes._attributes.clear()
    attributes._name_scopes.clear()
    yield
    leftover = (attributes.current_attributes(), attributes.current_name_scope())
    attributes._attributes.clear()
    attributes._name_scopes.clear()
    assert leftover == ({}, ""), leftover


# -- Attribute -------------------------------------------------------------------------------------------------
def test_attributes_nest_and_leaving_restores_the_outer_values():
    with poptorch.Attribute(__outline={"layer": "encoder"}):
        assert attributes.current_attributes() == {"__outline": {"layer": "encoder"}}
        with poptorch.Attribute(__outline={"layer": "attention", "part": "qkv"}, other={"k": "v"}):
            assert attributes.current_attributes() == {
                "__outline": {"layer": "attention", "part": "qkv"},
                "other": {"k": "v"},
            }
        assert attributes.current_attributes() == {"__outline": {"layer": "encoder"}}
    assert attributes.current_attributes() == {}


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.seen = []

    def forward(self, x):
        self.seen.append(attributes.current_attributes())
        return torch.tanh(self.linear(x))


def outline_attribute(module, value):
    """The BERT and GPT-2 applications' helper, as they write it: enter and leave from forward hooks."""
    context = poptorch.Attribute(__outline={"layer": value})
    module.register_forward_pre_hook(lambda *args: context.__enter__())
    module.register_forward_hook(lambda *args: context.__exit__(None, None, None))


def test_attributes_entered_from_hooks_annotate_each_layer_and_change_no_value():
    torch.manual_seed(0)
    model = nn.Sequential(Layer(), Layer())
    plain = copy.deepcopy(model)
    outline_attribute(model[0], "A")
    outline_attribute(model[1], "B")
    x = torch.randn(4, 4)
    out = poptorch.inferenceModel(model)(x)
    torch.testing.assert_close(out, plain(x), rtol=0, atol=0)
    assert model[0].seen[-1] == {"__outline": {"layer": "A"}} and model[1].seen[-1] == {
        "__outline": {"layer": "B"}
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"__outline": "layer"}, r"takes a dict of keys to values for each attribute, got 'layer'"),
        ({"__outline": {"layer": 3}}, r"the value of __outline\['layer'\] is 3 \(int\)"),
        ({"__outline": {1: "a"}}, r"the key of attribute '__outline' is 1"),
    ],
)
def test_attribute_values_are_dicts_of_strings(kwargs, message):
    with pytest.raises(TypeError, match=message):
        with poptorch.Attribute(other={"kept": "out"}, **kwargs):
            pass
    assert attributes.current_attributes() == {}  # nothing of a refused scope is applied


def test_leaving_an_attribute_scope_never_entered_is_poptorchs_error():
    with pytest.raises(poptorch.Error, match="Unknown key 'layer' for attribute '__outline'"):
        poptorch.Attribute(__outline={"layer": "x"}).__exit__(None, None, None)
    torch.ops.poptorch.set_attribute("__outline", "layer", "x")
    torch.ops.poptorch.clear_attribute("__outline", "layer")
    with pytest.raises(poptorch.Error, match="Unknown key 'layer' for attribute '__outline'"):
        torch.ops.poptorch.clear_attribute("__outline", "layer")


def test_an_attribute_scope_entered_again_while_open_restores_each_level():
    context = poptorch.Attribute(__outline={"layer": "x"})
    with poptorch.Attribute(__outline={"layer": "outer"}):
        context.__enter__()
        context.__enter__()
        context.__exit__(None, None, None)
        assert attributes.current_attributes() == {"__outline": {"layer": "x"}}
        context.__exit__(None, None, None)
        assert attributes.current_attributes() == {"__outline": {"layer": "outer"}}


# -- name scopes -----------------------------------------------------------------------------------------------
def test_push_and_pop_name_scope_nest_and_share_the_stack_with_name_scope():
    torch.ops.poptorch.push_name_scope("backbone")
    with poptorch.NameScope("block0"):
        torch.ops.poptorch.push_name_scope("conv")
        assert attributes.current_name_scope() == "backbone/block0/conv"
        torch.ops.poptorch.pop_name_scope()
        assert attributes.current_name_scope() == "backbone/block0"
    assert attributes.current_name_scope() == "backbone"
    torch.ops.poptorch.pop_name_scope()
    assert attributes.current_name_scope() == ""


def test_a_pop_without_a_push_is_an_error():
    with pytest.raises(poptorch.Error, match=r"pop_name_scope\(\) with no name scope open"):
        torch.ops.poptorch.pop_name_scope()
    with pytest.raises(RuntimeError, match="Expected a value of type 'str'"):
        torch.ops.poptorch.push_name_scope(3)


def name_scope_hook(module):
    """The CNN application's hook: every module's name, pushed before its forward and popped after."""
    for name, m in module.named_modules():
        m.register_forward_pre_hook(
            lambda _m, _i, n=name: torch.ops.poptorch.push_name_scope(n.split(".")[-1])
        )
        m.register_forward_hook(lambda _m, _i, _o: torch.ops.poptorch.pop_name_scope())


def test_name_scopes_from_every_modules_hooks_train_as_the_plain_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    plain = copy.deepcopy(model)
    name_scope_hook(model)
    x, y = torch.randn(8, 4), torch.randn(8, 1)

    class WithLoss(nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x, y):
            out = self.net(x)
            return out, F.mse_loss(out, y)

    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(WithLoss(model), opts, torch.optim.SGD(model.parameters(), lr=0.1))
    training(x, y)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for i in range(2):
        (F.mse_loss(plain(x[4 * i : 4 * i + 4]), y[4 * i : 4 * i + 4]) / 2).backward()
    opt.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


# -- internal_cast ---------------------------------------------------------------------------------------------
def test_internal_cast_casts_to_the_named_type_and_passes_the_gradient():
    x = torch.randn(3, requires_grad=True)
    half = torch.ops.poptorch.internal_cast(x, "FLOAT16")
    assert half.dtype == torch.half
    back = torch.ops.poptorch.internal_cast(half, "FLOAT")
    assert back.dtype == torch.float32
    (back * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.ops.poptorch.internal_cast(torch.tensor([1.7]), "INT32").dtype == torch.int32
    assert torch.ops.poptorch.internal_cast(torch.empty(2, device="meta"), "FLOAT16").dtype == torch.half
    with pytest.raises(poptorch.Error, match="No at::scalar_type for FLOAT8.*takes one of UINT8"):
        torch.ops.poptorch.internal_cast(x, "FLOAT8")


# -- nearest ---------------------------------------------------------------------------------------------------
X = torch.tensor([[-1.0, -1], [-1, 1], [1, 1], [1, -1], [-2, -2], [-2, 2], [2, 2], [2, -2]])
Y = torch.tensor([[-2.0, 0], [2, 0], [-1, 0], [1, 0]])


def test_nearest_hand_worked():
    # Sample 0 (the four points at distance 1 from the origin) may only use Y's sample 0 (+-2, 0), sample 1 only
    # (+-1, 0): the batches change the answer from the unbatched one.
    batch_x, batch_y = [0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1]
    expected = [0, 0, 1, 1, 2, 2, 3, 3]
    assert poptorch.nearest(X, Y, batch_x, batch_y).tolist() == expected
    assert poptorch.nearest(X, Y, torch.tensor(batch_x), torch.tensor(batch_y)).tolist() == expected
    assert poptorch.nearest(X, Y, batch_x, torch.tensor(batch_y)).tolist() == expected
    unbatched = poptorch.nearest(X, Y)
    assert unbatched.tolist() == [2, 2, 3, 3, 0, 0, 1, 1] and unbatched.dtype == torch.int32
    assert poptorch.nearest(X, Y, batch_x=[0] * 8).tolist() == unbatched.tolist()


def test_nearest_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 3, generator=g), torch.randn(9, 3, generator=g)
    batch_x, batch_y = sorted(torch.randint(0, 3, (20,), generator=g).tolist()), [0, 0, 0, 1, 1, 1, 2, 2, 2]
    expected = [
        min(
            (j for j in range(9) if batch_y[j] == batch_x[i]), key=lambda j: float(((x[i] - y[j]) ** 2).sum())
        )
        for i in range(20)
    ]
    assert poptorch.inferenceModel(NearestModel())(x, y, torch.tensor(batch_x)).tolist() == expected


class NearestModel(nn.Module):
    def forward(self, x, y, batch_x):
        return poptorch.nearest(x, y, batch_x, [0, 0, 0, 1, 1, 1, 2, 2, 2])


@pytest.mark.parametrize(
    ("batch_x", "batch_y", "error", "message"),
    [
        ([0, 0, 1, 0, 0, 0, 0, 0], [0, 0, 1, 1], ValueError, "'batch_x' is not sorted"),
        ([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 0], ValueError, "'batch_y' is not sorted"),
        ([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0], ValueError, "Some batch indices occur in 'batch_x'"),
        ([0, 0, 0, 0, 1, 1, 1], [0, 0, 1, 1], ValueError, r"x.size\(0\) == batch_x.size\(0\)"),
        ("0", [0], poptorch.Error, "must be torch.Tensors or lists"),
    ],
)
def test_nearest_errors(batch_x, batch_y, error, message):
    with pytest.raises(error, match=message):
        poptorch.nearest(X, Y, batch_x, batch_y)


# -- fps -------------------------------------------------------------------------------------------------------
def test_fps_hand_worked():
    # On a line 0, 1, 2, 10 with ratio 0.75 (3 points): start at 0, the farthest is 10, then 2 (2 from 0 vs 1 for 1).
    src = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    out = poptorch.fps(src, [0, 4], 0.75)
    assert out.tolist() == [0, 3, 2] and out.dtype == torch.int32


def brute_force_fps(src, ptr, ratio):
    taken = []
    for start, end in zip(ptr[:-1], ptr[1:]):
        count = int(torch.ceil(torch.tensor(float(end - start)) * torch.tensor(ratio)))
        chosen = [start]
        while len(chosen) < count:
            far = max(
                range(start, end),
                key=lambda i: (min(float(((src[i] - src[j]) ** 2).sum()) for j in chosen), -i),
            )
            chosen.append(far)
        taken += chosen
    return taken


@pytest.mark.parametrize("ptr", [[0, 19], [0, 13, 19], [0, 2, 3, 4, 9, 11, 19]])
@pytest.mark.parametrize("ratio", [0.3, 0.6, 1.0])
def test_fps_equals_brute_force(ptr, ratio):
    src = torch.rand(19, 3, generator=torch.Generator().manual_seed(1))
    assert poptorch.fps(src, ptr, ratio).tolist() == brute_force_fps(src, ptr, ratio)


def test_fps_counts_round_up_in_float32_and_a_random_start_stays_in_its_sample():
    # 25 * 0.6 in float32 is just above 15: 16 points, as PopTorch and torch_cluster compute it (float64: 15).
    assert len(poptorch.fps(torch.rand(25, 2), [0, 25], 0.6)) == 16
    torch.manual_seed(0)
    ptr = [0, 2, 6, 11, 28, 29]
    out = poptorch.fps(torch.rand(29, 3), ptr, 1.0, random_start=True)
    for start, end in zip(ptr[:-1], ptr[1:]):
        assert sorted(out[start:end].tolist()) == list(range(start, end))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((torch.rand(4, 2), [0, 4], 0), "`ratio` must be of float type"),
        ((torch.rand(4, 2), [0, 4], 1.5), r"`ratio` \(1.5\) has to be in range \(0.0, 1.0>"),
        ((torch.rand(4, 2), (0, 4), 0.5), "`ptr` must be a list of integers."),
        ((torch.rand(4, 2), [0], 0.5), "`ptr` must containt at least 2 elements."),
        ((torch.rand(4), [0, 4], 0.5), "`src` is supposed to be 2d Tensor"),
    ],
)
def test_fps_errors(args, message):
    with pytest.raises(poptorch.Error, match=message):
        poptorch.fps(*args)


# -- ctc_beam_search_decoder -----------------------------------------------------------------------------------
def test_beam_search_hand_worked():
    # Two steps, blank 0 and label 1: P("1") = 0.4 * 0.7 + 0.4 * 0.3 + 0.6 * 0.7 = 0.82, P("") = 0.6 * 0.3 = 0.18.
    probs = torch.tensor([[[0.6, 0.4]], [[0.3, 0.7]]]).log()
    log_p, lengths, paths = poptorch.ctc_beam_search_decoder(
        probs, torch.tensor([2]), beam_width=4, top_paths=2
    )
    torch.testing.assert_close(log_p.exp(), torch.tensor([[0.82, 0.18]]))
    assert lengths.tolist() == [[1.0, 0.0]] and paths.tolist() == [[[1.0, 0.0], [0.0, 0.0]]]
    assert log_p.dtype == lengths.dtype == paths.dtype == torch.float32  # as PopTorch returns them


def brute_force_decodings(log_probs, steps, blank, top):
    """Every label sequence's exact log-probability (torch's CTC loss sums all its alignments), best first."""
    labels = [c for c in range(log_probs.shape[1]) if c != blank]
    scored = []
    for n in range(steps + 1):
        for seq in itertools.product(labels, repeat=n):
            loss = F.ctc_loss(log_probs[:steps, None], torch.tensor([list(seq) or [labels[0]]]),
                              torch.tensor([steps]), torch.tensor([n]), blank=blank, reduction="none")  # fmt: skip
            if torch.isfinite(loss):
                scored.append((-float(loss), seq))
    scored.sort(reverse=True)
    return scored[:top]


@pytest.mark.parametrize("blank", [0, 2])
def test_beam_search_with_a_wide_beam_finds_the_exact_best_paths(blank):
    g = torch.Generator().manual_seed(0)
    time, batch, classes = 4, 3, 3
    probs = torch.randn(time, batch, classes, generator=g).mul(2).log_softmax(-1)
    lengths = torch.tensor([4, 3, 1])
    log_p, out_lengths, paths = poptorch.ctc_beam_search_decoder(
        probs, lengths, blank, beam_width=100, top_paths=3
    )
    assert log_p.shape == out_lengths.shape == (batch, 3) and paths.shape == (batch, 3, time)
    for b in range(batch):
        expected = brute_force_decodings(probs[:, b], int(lengths[b]), blank, 3)
        torch.testing.assert_close(log_p[b, : len(expected)], torch.tensor([p for p, _ in expected]))
        for k, (_, seq) in enumerate(expected):
            assert out_lengths[b, k] == len(seq) and paths[b, k, : len(seq)].tolist() == list(seq)
            assert paths[b, k, len(seq) :].eq(0).all()


def test_beam_search_narrow_beam_returns_its_beams_best_first_and_runs_in_a_model():
    class Decoder(nn.Module):
        def forward(self, log_probs, lengths):
            return poptorch.ctc_beam_search_decoder(log_probs, lengths, beam_width=2, top_paths=2)

    probs = torch.randn(9, 3, 10, generator=torch.Generator().manual_seed(42)).log_softmax(-1)
    lengths = torch.tensor([9, 6, 5], dtype=torch.int)
    out = poptorch.inferenceModel(Decoder())(probs, lengths)
    assert [tuple(t.shape) for t in out] == [(3, 2), (3, 2), (3, 2, 9)]
    assert (out[0][:, 0] >= out[0][:, 1]).all()
    for got, want in zip(out, Decoder()(probs, lengths)):
        torch.testing.assert_close(got, want)


def test_beam_search_errors():
    with pytest.raises(poptorch.Error, match="probs must be a torch.tensor argument"):
        poptorch.ctc_beam_search_decoder([[0.0]], torch.tensor([1]))
    with pytest.raises(poptorch.Error, match="must be rank-3"):
        poptorch.ctc_beam_search_decoder(torch.zeros(2, 3), torch.tensor([1]))
    with pytest.raises(
        poptorch.Error, match=r"top_paths \(3\) must be at least 1 and at most beam_width \(2\)"
    ):
        poptorch.ctc_beam_search_decoder(torch.zeros(2, 1, 3), torch.tensor([1]), beam_width=2, top_paths=3)
