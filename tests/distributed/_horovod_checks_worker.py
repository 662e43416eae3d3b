"""Two instances that call horovod.torch wrongly, as a program's bug would, then rightly.

`poprun --num-instances 2 python _horovod_checks_worker.py OUT`: each instance writes OUT/instanceK.json
with the error each wrong call raised (None if it raised none) and the result of a right allreduce made
after them (the instances must still agree). The instance ends itself after 120 s (SIGALRM), so a call
that hangs cannot outlive the test.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import horovod.torch as hvd
import torch

signal.alarm(120)


def error_of(call) -> str | None:
    try:
        call()
    except ValueError as error:
        return str(error)
    return None


def main(out: Path) -> None:
    hvd.init()
    rank = hvd.rank()
    seen = {
        # instance 0 passes a tensor of 2 values, instance 1 one of 3
        "allreduce_shapes": error_of(lambda: hvd.allreduce(torch.ones(2 + rank), op=hvd.Sum)),
        "allreduce_dtypes": error_of(lambda: hvd.allreduce(torch.ones(2, dtype=torch.float32 if rank else torch.int64))),
        "broadcast_shapes": error_of(lambda: hvd.broadcast(torch.ones(1, 2 + rank), root_rank=0)),
        "broadcast_root_2": error_of(lambda: hvd.broadcast(torch.ones(2), root_rank=2)),
        "broadcast_root_-1": error_of(lambda: hvd.broadcast_(torch.ones(2), root_rank=-1)),
        "broadcast_object_root_2": error_of(lambda: hvd.broadcast_object({"a": 1}, root_rank=2)),
        "allgather_trailing": error_of(lambda: hvd.allgather(torch.ones(1 + rank, 2 + rank))),
        "after": hvd.allreduce(torch.tensor([1.0 + rank]), op=hvd.Sum).tolist(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"instance{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
