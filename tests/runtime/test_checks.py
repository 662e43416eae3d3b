"""PopTorch's compile-time checks: the limits they enforce (hand-worked) and every word of their messages."""

from __future__ import annotations

import logging
import re

import pytest

from optimum_ipu.runtime.checks import (
    IPUCompilationError,
    check_num_ipus,
    check_pipelined_training,
    min_gradient_accumulation,
)


def _raises(message: str):
    return pytest.raises(IPUCompilationError, match="^" + re.escape(message) + "$")


def test_a_pipeline_of_s_forward_stages_needs_an_accumulation_of_2s_minus_1():
    assert [min_gradient_accumulation(s) for s in (1, 2, 3, 4, 8)] == [1, 3, 5, 7, 15]
    check_pipelined_training(1, 1)  # no pipeline: any accumulation
    check_pipelined_training(3, 2)  # exactly 2S-1
    check_pipelined_training(7, 4)
    check_pipelined_training(9, 4, forward_stages=5)
    with _raises(
        "gradientAccumulation must be greater than or equal to the number of pipeline stages (2S−1 = 3 for S = 2 "
        "forward stages: 2 IPUs per replica), got gradient_accumulation_steps=2. Raise --gradient_accumulation_steps "
        "to at least 3 (more amortises the pipeline fill and flush), or use fewer IPUs per replica."
    ):
        check_pipelined_training(2, 2)


def test_a_tied_head_back_on_ipu_0_counts_as_one_more_forward_stage():
    with _raises(
        "gradientAccumulation must be greater than or equal to the number of pipeline stages (2S−1 = 9 for S = 5 "
        "forward stages: 4 IPUs per replica, plus 1 for blocks back on an IPU the forward had left: a head tied to "
        "the word embedding runs on IPU 0 after the last layer), got gradient_accumulation_steps=8. Raise "
        "--gradient_accumulation_steps to at least 9 (more amortises the pipeline fill and flush), or use fewer "
        "IPUs per replica."
    ):
        check_pipelined_training(8, 4, forward_stages=5)


def test_a_process_attaches_to_a_power_of_two_ipus_up_to_64():
    assert [check_num_ipus(ipus, replicas) for ipus, replicas in [(1, 1), (2, 1), (4, 4), (8, 8)]] == [
        1,
        2,
        16,
        64,
    ]
    with _raises(
        "8 IPUs per replica x 16 replicas = 128 IPUs, but one process can use at most 64. Lower replication_factor, "
        "or launch more processes (torchrun --nproc_per_node), each running its share of the replicas."
    ):
        check_num_ipus(8, 16)
    with _raises(
        "3 IPUs per replica x 2 replicas = 6 IPUs, which is not a power of two. Use 4 or 8 IPUs in total (change "
        "replication_factor or layers_per_ipu), or let the runtime round up to 8 (auto_round_num_ipus=True; the "
        "extra IPUs sit idle)."
    ):
        check_num_ipus(3, 2)
    with pytest.raises(
        IPUCompilationError, match=r"= 5 IPUs, which is not a power of two\. Use 8 IPUs in total"
    ):
        check_num_ipus(5, 1)  # 4 IPUs cannot hold a replica of 5


def test_auto_round_rounds_up_to_the_next_power_of_two_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.runtime.checks"):
        assert check_num_ipus(3, 2, auto_round=True) == 8
        assert check_num_ipus(5, 1, auto_round=True) == 8
        assert check_num_ipus(4, 2, auto_round=True) == 8
    assert [r.getMessage() for r in caplog.records] == [
        "Rounding 6 requested IPUs up to 8 (the extra IPUs are idle).",
        "Rounding 5 requested IPUs up to 8 (the extra IPUs are idle).",
    ]
    with pytest.raises(IPUCompilationError, match="at most 64"):
        check_num_ipus(5, 16, auto_round=True)  # 80: the limit holds before any rounding


def test_processes_sharing_a_run_each_attach_to_their_share_of_its_ipus():
    """128 replicas of 1 IPU over 2 processes: 64 IPUs each, as each of 2 poprun instances attaches to its 64
    (PopTorch's limit is per process); over 4 processes, 32 each; the checks read the share, not the run."""
    assert check_num_ipus(1, 128, processes=2) == 64
    assert check_num_ipus(4, 32, processes=4) == 32
    assert check_num_ipus(4, 1, processes=4) == 1  # 4 stage processes of one 4-IPU pipeline: 1 IPU each
    with _raises(
        "1 IPUs per replica x 256 replicas / 2 processes = 128 IPUs, but one process can use at most 64. Lower "
        "replication_factor, or launch more processes (torchrun --nproc_per_node), each running its share of the "
        "replicas."
    ):
        check_num_ipus(1, 256, processes=2)
    with pytest.raises(IPUCompilationError, match=r"= 3 IPUs, which is not a power of two\. Use 2 or 4 IPUs per process"):
        check_num_ipus(1, 6, processes=2)
