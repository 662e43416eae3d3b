"""What replicas and hosts cost: the gradient all-reduce across the pod and the host I/O of each call.

Replicas beyond one IPU pipeline pay, once per weight update, for summing their gradients. Inside one
POD64 the IPUs are joined by IPU-Links (a 2D torus, seed 004), so a ring all-reduce moves
2(r-1)/r of each IPU's gradient bytes over `ASSUMPTIONS.allreduce_links` links. Beyond 64 IPUs the
all-reduce is hierarchical, as Graphcore's GCL runs it: reduce-scatter inside each POD over
IPU-Links, all-reduce of the 1/r_pod shard across PODs over the machines' GW-Links (2 x 100 Gbps per
machine), all-gather inside each POD again. Every ring step is one BSP exchange, so it also pays the
fixed cost of an operation: that is what makes many small replicas lose efficiency.

Each host call streams the inputs of every micro-batch in, and the outputs out: each IPU through its
gateway's buffer at the end-to-end rates Graphcore's gc-hosttraffictest publishes for one IPU-M2000
IPU (3.3 GB/s in, 2.9 GB/s out, `ChipSpec`), and all the replicas one host (`IPUS_PER_HOST` IPUs)
drives through that host's one 100GbE NIC (`HOST_NIC_BANDWIDTH`). Hosts run in parallel, each paying
the fixed call overhead once per call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from optimum_ipu.costmodel.hardware import (
    ASSUMPTIONS,
    HOST_NIC_BANDWIDTH,
    IPUS_PER_HOST,
    IPUS_PER_POD,
    Calibration,
    ChipSpec,
)
from optimum_ipu.costmodel.workload import Workload


@dataclass(frozen=True)
class PodShape:
    """How a workload's replicas spread over PODs and hosts.

    Attributes:
        pods: POD64s the replicas span (1 up to 64 IPUs).
        replicas_per_pod: replicas inside one POD (joined by IPU-Links).
        replicas_per_host: replicas one Poplar host streams data for.
        replicas_per_process: replicas whose streams one host process copies, one after another
            (`Workload.processes` split a host's replicas).
    """

    pods: int
    replicas_per_pod: int
    replicas_per_host: int
    replicas_per_process: int

    @classmethod
    def of(cls, workload: Workload) -> PodShape:
        r, n = workload.replication_factor, workload.ipus_per_replica
        pods = max(math.ceil(workload.total_ipus / IPUS_PER_POD), 1)
        per_pod = max(r // pods, 1)
        per_host = max(min(r, IPUS_PER_HOST // n), 1)
        return cls(pods, per_pod, per_host, min(per_host, math.ceil(r / workload.processes)))


def allreduce_time(
    trainable: Sequence[int], workload: Workload, hardware: ChipSpec, calibration: Calibration
) -> float:
    """Seconds of the gradient all-reduce across replicas, once per weight update.

    Args:
        trainable: trainable parameters on each IPU of one pipeline (each IPU all-reduces its own
            gradients with the same IPU of the other replicas, all pipelines' IPUs in parallel).
    """
    if workload.replication_factor <= 1:
        return 0.0
    shape = PodShape.of(workload)
    per_op = calibration.cycles_per_operation / hardware.clock_hz
    links = ASSUMPTIONS.allreduce_links * hardware.ipu_link_bandwidth
    worst = 0.0
    for p in trainable:
        nbytes = p * workload.float_bytes
        seconds = 0.0
        r_in = shape.replicas_per_pod
        if r_in > 1:
            seconds += 2 * (r_in - 1) / r_in * nbytes / links + 2 * (r_in - 1) * per_op
        if shape.pods > 1:
            shard = nbytes / r_in
            seconds += 2 * (shape.pods - 1) / shape.pods * shard / hardware.gw_link_bandwidth_per_ipu
            seconds += 2 * (shape.pods - 1) * per_op
        worst = max(worst, seconds)
    return worst


def host_copy_time(input_bytes: float, output_bytes: float, workload: Workload, calibration: Calibration) -> float:
    """Seconds the host spends copying one call's streams (bytes per replica): each input micro-batch from
    the program's tensor into the buffer Poplar streams from (PopART's `InputDatastream::read`, a `memcpy`)
    and each output into the tensor PopTorch returns, at the fitted `host_copy_bandwidth`, one replica after
    another within a host process (its stream callbacks run on one thread), the processes at once. The call
    waits for them, so they add to it whether or not the data loading is asynchronous."""
    per_process = PodShape.of(workload).replicas_per_process
    return (input_bytes + output_bytes) * per_process / calibration.host_copy_bandwidth


def host_io_time(input_bytes: float, output_bytes: float, workload: Workload, hardware: ChipSpec) -> float:
    """Seconds to stream one call's inputs in and outputs out (bytes per replica): each replica
    through its gateway, all the replicas of one host through that host's NIC; whichever is slower
    bounds the call."""
    shape = PodShape.of(workload)
    link = input_bytes / hardware.host_to_ipu_bandwidth + output_bytes / hardware.ipu_to_host_bandwidth
    host = (input_bytes + output_bytes) * shape.replicas_per_host / HOST_NIC_BANDWIDTH
    return max(link, host)
