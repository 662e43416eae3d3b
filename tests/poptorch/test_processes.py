"""Under torchrun the replicas are shared out over the processes (the launch itself: tests/distributed)."""

import pytest
import torch

import poptorch


def options(process: int, processes: int, replicas: int = 2) -> poptorch.Options:
    opts = poptorch.Options().deviceIterations(2).replicationFactor(replicas)
    opts.Training.gradientAccumulation(3)
    opts.Distributed.configureProcessId(process, processes)
    return opts


@pytest.fixture
def torchrun(monkeypatch):
    """torchrun's rendezvous variables: the processes have a process group to run one IPU run through."""
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)


def test_each_process_is_handed_its_replicas_part_of_every_combined_batch(torchrun):
    dataset = torch.utils.data.TensorDataset(torch.arange(96.0))
    whole = next(iter(poptorch.DataLoader(options(0, 1), dataset, batch_size=4)))[0]  # [DI][GA][R][micro]
    layout = whole.reshape(2, 3, 2, 4)
    for process in (0, 1):
        loader = poptorch.DataLoader(options(process, 2), dataset, batch_size=4)
        assert loader.combinedBatchSize == 4 * 2 * 3 and len(loader) == 2
        torch.testing.assert_close(next(iter(loader))[0], layout[:, :, process].reshape(-1))


def test_replicas_that_the_processes_cannot_share_are_an_error_naming_both(torchrun):
    """A model that is not pipelined cannot run as stage processes: R=3 over 2 processes fails at compile."""
    model = poptorch.trainingModel(torch.nn.Linear(2, 2), options(0, 2, replicas=3).autoRoundNumIPUs(True))
    with pytest.raises(poptorch.Error, match=r"replicationFactor\(3\) cannot be shared by the 2 processes.*"
                       r"need a training model pipelined over 2 or more stages.*one of 3, or"):  # fmt: skip
        model.compile(torch.randn(2 * 3 * 3, 2))


def test_processes_that_do_not_split_the_replicas_are_each_handed_every_replica(torchrun):
    """R=1 over 2 torchrun processes (stage processes): each process gets the whole combined batch, one
    shuffle. (Without torchrun's process group there are no stage processes: tests/poptorch/test_dataloader.py.)"""
    dataset = torch.utils.data.TensorDataset(torch.arange(96.0))
    whole = next(iter(poptorch.DataLoader(options(0, 1, replicas=1), dataset, batch_size=4)))[0]
    for process in (0, 1):
        loader = poptorch.DataLoader(options(process, 2, replicas=1), dataset, batch_size=4)
        assert loader.combinedBatchSize == 4 * 2 * 3
        torch.testing.assert_close(next(iter(loader))[0], whole)


class TwoBlocks(torch.nn.Module):
    """Linear on IPU 0, Linear on IPU 1; `skip=True` adds stage 0's output to stage 1's (a skip connection)."""

    def __init__(self, skip: bool = False):
        super().__init__()
        self.skip = skip
        self.first = poptorch.BeginBlock(torch.nn.Linear(4, 4), "first", ipu_id=0)
        self.second = poptorch.BeginBlock(torch.nn.Linear(4, 4), "second", ipu_id=1)

    def forward(self, x):
        hidden = torch.tanh(self.first(x))
        out = self.second(hidden) + (hidden if self.skip else 0)
        return out, out.pow(2).mean()


def pipelined(process: int, processes: int, replicas: int = 1) -> poptorch.Options:
    opts = options(process, processes, replicas).setExecutionStrategy(poptorch.PipelinedExecution())
    return opts


def test_a_skip_connection_across_a_stage_boundary_is_an_error_naming_the_stage(torchrun):
    """Stage 1 would read a placeholder for stage 0's output: the compile compares each stage with the
    one-process forward and refuses (before any process group is joined)."""
    model = poptorch.trainingModel(TwoBlocks(skip=True), pipelined(0, 2))
    with pytest.raises(
        poptorch.Error, match=r"Pipeline stage 1 \(from the boundary at second\).*skip connection"
    ):
        model.compile(torch.randn(2 * 3 * 2, 4))


def test_stage_processes_plan_only_the_boundary_input_crossing():
    """Without the skip connection the same model plans 2 stages: stage 0 owns `first`, stage 1 `second`,
    and stage 1's forward replays zeros for `first`."""
    from optimum_ipu.poptorch._stages import plan_stages

    module = TwoBlocks()
    strategy = poptorch.PipelinedExecution()
    with torch.no_grad():
        plan = plan_stages(module, (torch.randn(2, 4),), {}, strategy, 2)
    assert plan.boundaries == ["second"]
    assert {path: stage for path, (stage, _) in plan.placeholders.items()} == {"first": 0, "second": 1}
    assert [plan.owners[id(p)] for p in module.parameters()] == [0, 0, 1, 1]


def test_a_process_count_that_is_no_whole_number_of_pipelines_is_an_error_naming_the_counts(torchrun):
    """3 processes, 2 stages, 1 replica: neither replica processes nor pipelines of 2 stage processes."""
    model = poptorch.trainingModel(TwoBlocks(), pipelined(0, 3))
    with pytest.raises(poptorch.Error, match=r"replicationFactor\(1\) cannot be shared by the 3 processes.*"
                       r"2 pipeline stages x a number of pipelines.*one of 2,"):  # fmt: skip
        model.compile(torch.randn(2 * 3 * 2, 4))


class TiedAcrossStages(torch.nn.Module):
    """The same Linear on stage 0 and again on stage 1 (a tied weight)."""

    def __init__(self):
        super().__init__()
        self.shared = torch.nn.Linear(4, 4)
        self.middle = poptorch.BeginBlock(torch.nn.Tanh(), "second", ipu_id=1)

    def forward(self, x):
        out = torch.nn.functional.linear(self.middle(self.shared(x)), self.shared.weight)
        return out, out.pow(2).mean()


def test_a_weight_used_on_two_stages_is_an_error_naming_it(torchrun):
    """Each stage process computes only its own weights' gradients: a weight read on stages 0 and 1 is refused."""
    model = poptorch.trainingModel(TiedAcrossStages(), pipelined(0, 2))
    with pytest.raises(poptorch.Error, match=r"The weight shared.weight is used on pipeline stages \[0, 1\]"):
        model.compile(torch.randn(2 * 3 * 2, 4))


def test_a_block_context_starts_a_stage_at_the_first_module_called_in_it():
    """`with poptorch.Block(...)` (no BeginBlock'ed module): the boundary is the first module run in the block."""
    from optimum_ipu.poptorch._stages import plan_stages

    class WithBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            with poptorch.Block("0", ipu_id=0):
                x = self.a(x)
            with poptorch.Block("1", ipu_id=1):
                return self.b(x)

    with torch.no_grad():
        plan = plan_stages(WithBlocks(), (torch.randn(2, 4),), {}, poptorch.PipelinedExecution(), 2)
    assert plan.boundaries == ["b"]


def test_whether_processes_run_together_is_decided_once_for_the_loader_and_the_model(monkeypatch):
    """A program that creates its process group itself between building its DataLoader and its model: the
    options keep the first answer, so the loader's batches and the model's replicas agree."""
    from optimum_ipu.poptorch import _distributed

    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    opts = options(0, 2)
    assert _distributed.run_processes(opts) == 1  # no process group yet: each process alone
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    assert _distributed.run_processes(opts) == 1  # the group came later: the same answer
    assert _distributed.run_processes(options(0, 2)) == 2  # options made with the group there
