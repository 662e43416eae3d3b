"""The layers_per_ipu -> IPU rule: every example of the semantics reference, section 2, and its errors."""

import pytest

from optimum_ipu.pipelining.placement import (
    PlacementError,
    expand_layers_per_ipu,
    ipu_of_each_layer,
    layer_counts_per_ipu,
    stage_of_each_block,
)


@pytest.mark.parametrize(
    ("num_layers", "layers_per_ipu", "ipus", "expected"),
    [
        # one IPU: everything on IPU 0, layers_per_ipu ignored
        (5, [-1], 1, [0, 0, 0, 0, 0]),
        (5, [2, 3], 1, [0, 0, 0, 0, 0]),
        # all wildcards: even split, remainder on the last IPU
        (6, [-1], 2, [0, 0, 0, 1, 1, 1]),
        (7, [-1], 2, [0, 0, 0, 1, 1, 1, 1]),
        (8, [-1], 4, [0, 0, 1, 1, 2, 2, 3, 3]),
        (8, [-1, -1, -1, -1], 4, [0, 0, 1, 1, 2, 2, 3, 3]),
        (6, [-1, -1], 2, [0, 0, 0, 1, 1, 1]),
        # a mix: explicit counts honoured, the rest over the wildcards, remainder on the last wildcard
        (6, [2, -1], 2, [0, 0, 1, 1, 1, 1]),
        (6, [-1, 2], 2, [0, 0, 0, 0, 1, 1]),
        (7, [-1, 2, -1, 2], 4, [0, 1, 1, 2, 2, 3, 3]),
        # no wildcards: the counts as given; Graphcore/bert-base-ipu leaves IPU 0 to the embeddings
        (12, [0, 4, 4, 4], 4, [1] * 4 + [2] * 4 + [3] * 4),
        (24, [3, 7, 7, 7], 4, [0] * 3 + [1] * 7 + [2] * 7 + [3] * 7),
    ],
)
def test_ipu_of_each_layer_follows_the_reference_examples(num_layers, layers_per_ipu, ipus, expected):
    assert ipu_of_each_layer(num_layers, layers_per_ipu, ipus) == expected


def test_counts_per_ipu_resolve_wildcards():
    assert layer_counts_per_ipu(7, [-1, 2, -1, 2], 4) == [1, 2, 2, 2]
    assert layer_counts_per_ipu(12, [0, 4, 4, 4], 4) == [0, 4, 4, 4]
    assert layer_counts_per_ipu(3, [-1], 4) == [0, 0, 0, 3]  # fewer layers than IPUs: remainder goes last
    assert layer_counts_per_ipu(0, [-1], 2) == [0, 0]


def test_expand_widens_an_all_wildcard_list():
    assert expand_layers_per_ipu([-1], 4) == [-1, -1, -1, -1]
    assert expand_layers_per_ipu([-1, -1], 3) == [-1, -1, -1]
    assert expand_layers_per_ipu([1, 2], 2) == [1, 2]


def test_counts_that_do_not_sum_to_the_model_name_both_numbers():
    with pytest.raises(PlacementError, match=r"places 11 layers but the model has 12"):
        ipu_of_each_layer(12, [0, 4, 4, 3], 4)


def test_a_list_of_the_wrong_length_is_an_error():
    with pytest.raises(PlacementError, match=r"has 3 entries but ipus_per_replica=4"):
        ipu_of_each_layer(12, [4, 4, 4], 4)
    with pytest.raises(PlacementError, match=r"has 2 entries but ipus_per_replica=4"):
        ipu_of_each_layer(6, [-1, 2], 4)


def test_explicit_counts_above_the_model_are_an_error():
    with pytest.raises(PlacementError, match=r"places 8 layers explicitly but the model has only 6"):
        ipu_of_each_layer(6, [4, 4, -1], 3)


@pytest.mark.parametrize(
    ("num_layers", "layers_per_ipu", "ipus", "message"),
    [
        (6, [-2, 8], 2, r"entries must be >= -1"),
        (6, [-1], 0, r"ipus_per_replica must be >= 1"),
        (-1, [-1], 2, r"negative number of layers"),
    ],
)
def test_invalid_inputs_are_rejected(num_layers, layers_per_ipu, ipus, message):
    with pytest.raises(PlacementError, match=message):
        ipu_of_each_layer(num_layers, layers_per_ipu, ipus)


def test_placement_error_is_a_value_error():
    assert issubclass(PlacementError, ValueError)


@pytest.mark.parametrize(
    "ipus, n, stages",
    [
        ([0, 0, 1, 1], 2, [0, 0, 1, 1]),  # one stage per IPU
        ([0, 1, 1, 0], 2, [0, 1, 1, 2]),  # a tied head back on IPU 0: one stage more
        ([0, 1, 2, 3, 0, 3], 4, [0, 1, 2, 3, 4, 5]),  # a tied head, then an untied one on the last IPU
        ([0, 1, 0, 0], 2, [0, 1, 2, 2]),  # blocks following each other on one IPU share a stage
        ([0, 0, 0], 1, [0, 0, 0]),
    ],
)
def test_stages_are_numbered_as_poptorch_auto_increment_numbers_them(ipus, n, stages):
    assert stage_of_each_block(ipus, n) == stages
