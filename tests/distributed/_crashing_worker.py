"""A two-instance program whose instance 1 fails while instance 0 waits for it in a collective.

`python _crashing_worker.py COLLECTIVE HOW`, launched with 2 instances (poprun, torchrun, or
`optimum-ipu run` under torchrun); it writes the time of the failure to the file
`$CRASHING_WORKER_MARK` names. Both instances join the process group and take one collective
step together; then instance 1 fails (HOW: `raise`, an uncaught RuntimeError; `exit`, `sys.exit(3)`)
while instance 0 goes on into the next step, where it waits for instance 1. COLLECTIVE is the step:
`hvd`, a `horovod.torch` allreduce (optimum-ipu's stand-in); `poptorch`, a replicated PopTorch
training step (the replicas' gradient sums are all-reduced over the instances).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

try:
    import horovod.torch as hvd  # poprun serves the stand-in under this name
except ImportError:
    from optimum_ipu.sdk import horovod_torch as hvd


def fail(how: str) -> None:
    mark = os.environ.get("CRASHING_WORKER_MARK")
    if mark:  # when it failed, for the test to time the launch's end from
        Path(mark).write_text(repr(time.time()))
    print("instance 1 fails now", flush=True)
    if how == "exit":
        sys.exit(3)
    raise RuntimeError("instance 1 fails on purpose")


def main(collective: str, how: str) -> None:
    rank = int(os.environ["RANK"])
    if collective == "hvd":
        hvd.init()
        step = lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum)  # noqa: E731
    else:
        import poptorch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(4, 2)

            def forward(self, x, labels):
                out = self.linear(x)
                return out, torch.nn.functional.cross_entropy(out, labels)

        torch.manual_seed(0)
        model = Model()
        training = poptorch.trainingModel(model, poptorch.Options().replicationFactor(2),
                                          optimizer=torch.optim.SGD(model.parameters(), lr=0.1))  # fmt: skip
        x, labels = torch.randn(2, 4), torch.tensor([0, 1])
        step = lambda: training(x, labels)  # noqa: E731
    step()
    if rank == 1:
        fail(how)
    step()  # instance 0 waits here for instance 1, which never comes
    print("instance 0 was not stopped", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
