"""A PopTorch training program written as Graphcore's applications write them for poprun.

`python _poprun_worker.py OUT --replicas R` runs it in one process with R replicas (the reference);
`poprun --num-instances N --num-replicas R python _poprun_worker.py OUT` runs it as N instances, where
it takes its options from `popdist.poptorch.Options`, starts from instance 0's weights
(`hvd.broadcast_parameters`) and averages its loss over the instances (`hvd.allreduce`). Each run
writes the mean loss of every call and the final weights (instance 0, through
`popdist.execute_on_instances`), and every instance writes what popdist and horovod told it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import popart
import popdist
import popdist.poptorch
import poptorch

if popdist.isPopdistEnvSet():
    import horovod.torch as hvd


class ModelWithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))

    def forward(self, x, labels):
        out = self.net(x)
        return out, torch.nn.functional.cross_entropy(out, labels)


def create_options(replicas: int) -> poptorch.Options:
    if popdist.isPopdistEnvSet():
        opts = popdist.poptorch.Options(ipus_per_replica=1)
    else:
        opts = poptorch.Options().replicationFactor(replicas)
    opts.deviceIterations(2).randomSeed(0)
    opts.Training.gradientAccumulation(2)
    opts._Popart.set("subgraphCopyingStrategy", int(popart.SubgraphCopyingStrategy.JustInTime))
    return opts


def main(out: Path, replicas: int) -> None:
    distributed = popdist.isPopdistEnvSet()
    if distributed:
        popdist.init()
        hvd.init()
    torch.manual_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.randn(128, 6), torch.randint(0, 3, (128,)))
    torch.manual_seed(popdist.getInstanceIndex() + 1)  # each instance starts from other weights ...
    model = ModelWithLoss()
    if distributed:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # ... until instance 0's are broadcast
    start = float(sum(p.detach().sum() for p in model.parameters()))
    opts = create_options(replicas)
    loader = poptorch.DataLoader(opts, dataset, batch_size=4, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    losses = []
    for _ in range(2):
        for x, labels in loader:
            _, loss = training(x, labels)
            loss = torch.mean(loss)  # this instance's replicas
            losses.append(float(hvd.allreduce(loss, average=True)) if distributed else float(loss))
    training.detachFromDevice()

    out.mkdir(parents=True, exist_ok=True)
    rank = popdist.getInstanceIndex()
    seen = {"isPopdistEnvSet": distributed, "instance": rank, "instances": popdist.getNumInstances(),
            "total_replicas": popdist.getNumTotalReplicas(), "local_replicas": popdist.getNumLocalReplicas(),
            "replication_factor": opts.replication_factor, "process": [opts.Distributed.processId,
            opts.Distributed.numProcesses], "start": start}  # fmt: skip
    if distributed:  # the other calls the applications make, on values that tell the instances apart
        seen["hvd"] = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                       "seed": hvd.broadcast(torch.Tensor([rank + 7]), root_rank=0).item(),
                       "allgather": hvd.allgather(torch.tensor([rank, 10 * rank])).tolist(),
                       "grouped": [t.item() for t in hvd.grouped_allreduce([torch.tensor(1.0), torch.tensor(rank)],
                                                                           op=hvd.Sum)]}  # fmt: skip
    (out / f"instance{rank}.json").write_text(json.dumps(seen))

    def save() -> None:
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        torch.save(
            {"losses": torch.tensor(losses, dtype=torch.float64), "weights": weights}, out / "result.pt"
        )
        (out / f"saved_by{rank}").touch()

    if distributed:
        popdist.execute_on_instances({0}, save)
    else:
        save()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    main(args.out, args.replicas)
