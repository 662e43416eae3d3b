"""Automatic loss scaling follows PopART's rule, checked against sequences worked out by hand.

PopART's automatic loss scaling looks at the gradients as the IPU stores them (fp16, still scaled by S,
reduced over the micro-batches) after each update: if more than 1e-7 of their elements lie at or above
1/8 of the fp16 maximum (65504 / 8 = 8188), S halves, otherwise it doubles; an overflow skips the
update and halves S; S stays between 1 and 2**15. The numbers below sit just either side of each
constant, so moving the bin edge, the fraction or a bound by a little changes the sequence.
"""

from __future__ import annotations

import pytest
import torch

from optimum_ipu.runtime.loss_scaling import LossScaler

EDGE = 65504 / 8  # 8188.0, the mean scaled gradient that counts as "near the top of fp16"


def gradients_with(mean_value: float, micro_batches: int, elements: int = 10) -> list[torch.Tensor]:
    """fp32 sums over `micro_batches` whose mean scaled gradient is `mean_value` in one element, 1 elsewhere."""
    g = torch.full((elements,), float(micro_batches))
    g[0] = mean_value * micro_batches
    return [g]


def test_the_scale_follows_a_hand_worked_sequence_around_the_bin_edge():
    scaler = LossScaler(1024.0, auto=True)
    steps = [  # (largest mean scaled gradient, expected scale after the update)
        (EDGE * 0.999, 2048.0),  # just below 1/8 of fp16 max: head-room, double
        (EDGE * 1.001, 1024.0),  # just above: crowded, halve
        (EDGE * 0.999, 2048.0),
        (float("inf"), 1024.0),  # overflow: update skipped, halve
        (100.0, 2048.0),
        (EDGE * 4, 1024.0),
    ]
    seen = []
    for value, _ in steps:
        scaler.unscale_(gradients_with(value, micro_batches=4), micro_batches=4)
        seen.append(scaler.scale)
    assert seen == [expected for _, expected in steps]
    assert scaler.skipped_updates == 1


@pytest.mark.parametrize(
    "elements, halves",
    [(9_000_000, True), (11_000_000, False)],  # one element above the edge: 1.11e-7 and 9.1e-8 of them
    ids=["fraction-1.1e-7", "fraction-0.9e-7"],
)
def test_the_scale_halves_only_when_more_than_1e_minus_7_of_the_elements_are_above_the_edge(elements, halves):
    scaler = LossScaler(1024.0, auto=True)
    scaler.unscale_(gradients_with(EDGE * 2, micro_batches=1, elements=elements), micro_batches=1)
    assert scaler.scale == (512.0 if halves else 2048.0)


def test_the_scale_never_rises_above_2_to_the_15():
    scaler = LossScaler(2.0**14, auto=True)
    for _ in range(3):
        scaler.unscale_(gradients_with(1.0, micro_batches=1), micro_batches=1)
    assert scaler.scale == 2.0**15


def test_the_scale_never_falls_below_1_on_overflows_or_crowded_gradients():
    scaler = LossScaler(2.0, auto=True)
    scaler.unscale_(gradients_with(float("nan"), micro_batches=1), micro_batches=1)
    scaler.unscale_(gradients_with(float("inf"), micro_batches=1), micro_batches=1)
    assert scaler.scale == 1.0
    scaler.unscale_(gradients_with(EDGE * 2, micro_batches=1), micro_batches=1)
    assert scaler.scale == 1.0
    assert scaler.skipped_updates == 2


def test_unscaling_gives_the_mean_true_gradient_and_its_norm():
    """Sums of S x grad over 4 micro-batches at S = 256, worked by hand: the mean gradient is sum / (4 x 256)."""
    scaler = LossScaler(256.0)
    grads = [torch.tensor([1024.0, -2048.0]), torch.tensor([0.0, 3072.0])]  # mean true gradients 1, -2, 0, 3
    norm = scaler.unscale_(grads, micro_batches=4)
    assert grads[0].tolist() == [1.0, -2.0] and grads[1].tolist() == [0.0, 3.0]
    assert norm == pytest.approx(14**0.5)
    assert scaler.scale == 256.0  # static: unchanged


def test_unscaling_without_the_norm_gives_the_same_mean_gradient_and_reports_it_as_not_measured():
    scaler = LossScaler(256.0)
    grads = [torch.tensor([1024.0, -2048.0]), torch.tensor([0.0, 3072.0])]  # as in the test above
    norm = scaler.unscale_(grads, micro_batches=4, norm=False)
    assert grads[0].tolist() == [1.0, -2.0] and grads[1].tolist() == [0.0, 3.0]
    assert norm != norm  # NaN: not measured (None would mean a skipped update)
    odd = [torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 1e3]
    by_hand = odd[0] * torch.tensor(1 / (3 * 256.0))  # GA 3: 1/768 is not exact in binary
    scaler.unscale_(odd, micro_batches=3, norm=False)
    assert torch.equal(odd[0], by_hand)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_unscaling_without_the_norm_still_finds_a_non_finite_gradient_and_skips_the_update(bad):
    scaler = LossScaler(1.0)
    assert scaler.unscale_([torch.ones(3), torch.tensor([1.0, bad])], micro_batches=2, norm=False) is None
    assert scaler.skipped_updates == 1
    scaler.unscale_([torch.tensor([bad])], micro_batches=1, norm=False)
    assert scaler.skipped_updates == 2  # counted, not just flagged


def test_without_a_loss_scaling_argument_the_scale_is_1_and_a_scale_of_0_or_less_is_refused():
    assert LossScaler().scale == 1.0 and not LossScaler().auto
    for bad in (0.0, -64.0):
        with pytest.raises(
            ValueError, match=rf"loss_scaling must be > 0, got {bad}; typical values are 64 to 32768"
        ):
            LossScaler(bad)


def test_a_fraction_of_exactly_1e_minus_7_above_the_edge_is_not_more_than_it():
    scaler = LossScaler(1024.0, auto=True)
    scaler.unscale_(gradients_with(EDGE * 2, micro_batches=1, elements=10_000_000), micro_batches=1)
    assert scaler.scale == 2048.0  # "more than 1e-7" of the elements: exactly 1e-7 leaves head-room


def test_a_gradient_exactly_at_the_edge_counts_as_near_the_top():
    scaler = LossScaler(1024.0, auto=True)
    scaler.unscale_(gradients_with(EDGE, micro_batches=2), micro_batches=2)
    assert scaler.scale == 512.0


def test_with_an_update_period_the_scale_moves_every_period_clean_updates_and_an_overflow_restarts_the_count():
    scaler = LossScaler(1024.0, auto=True, update_period=2)
    seen = []
    for value in (1.0, 1.0, 1.0, float("inf"), 1.0, 1.0):
        scaler.unscale_(gradients_with(value, micro_batches=1), micro_batches=1)
        seen.append((scaler.scale, scaler.clean_updates))
    # doubles after 2 clean updates; an overflow halves at once and the next doubling needs 2 more
    assert seen == [(1024.0, 1), (2048.0, 2), (2048.0, 3), (1024.0, 0), (1024.0, 1), (2048.0, 2)]


def test_the_scaler_state_round_trips_through_a_checkpoint():
    scaler = LossScaler(1024.0, auto=True)
    for value in (1.0, float("inf"), 1.0):
        scaler.unscale_(gradients_with(value, micro_batches=1), micro_batches=1)
    state = scaler.state_dict()
    assert state == {
        "scale": 2048.0,
        "clean_updates": 1,
        "skipped_updates": 1,
    }  # 1024 -> 2048 -> 1024 -> 2048
    restored = LossScaler(1.0, auto=True)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert LossScaler().state_dict() == {"scale": 1.0, "clean_updates": 0, "skipped_updates": 0}


def test_each_scale_change_and_each_skipped_update_is_logged_with_the_way_out(caplog):
    caplog.set_level("INFO", logger="optimum_ipu.runtime.loss_scaling")
    auto = LossScaler(1024.0, auto=True)
    auto.unscale_(gradients_with(1.0, micro_batches=1), micro_batches=1)
    auto.unscale_(gradients_with(float("inf"), micro_batches=1), micro_batches=1)
    static = LossScaler(64.0)
    static.unscale_(gradients_with(float("nan"), micro_batches=1), micro_batches=1)
    static.unscale_(gradients_with(1.0, micro_batches=1), micro_batches=1)
    assert caplog.messages == [
        "Automatic loss scaling: scale 1024 -> 2048.",
        "Gradient overflow: update skipped, loss scale 2048 -> 1024.",
        "Gradient overflow with static loss scale 64: update skipped. Lower --loss_scaling or use --auto_loss_scaling.",
    ]
    capped = LossScaler(2.0**15, auto=True)
    capped.unscale_(gradients_with(1.0, micro_batches=1), micro_batches=1)
    assert len(caplog.messages) == 3  # no change, no line


@pytest.mark.parametrize("scale", [1.0, 2.0, 64.0])
def test_the_loss_to_backpropagate_is_the_loss_times_the_scale_in_fp32(scale):
    loss = torch.tensor(3.0, dtype=torch.float16)
    scaled = LossScaler(scale).scale_loss(loss)
    assert scaled.dtype == torch.float32 and scaled.item() == 3.0 * scale
