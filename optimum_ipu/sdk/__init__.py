"""The Poplar SDK's companions of PopTorch, as optimum-ipu provides them: one room.

Graphcore's PyTorch applications import more of the Poplar SDK than PopTorch (`optimum_ipu.poptorch`,
the room below this one). What they use is here, each a stand-in for the SDK's own:

- `popart`: PopART 3.4's session-option enums, which programs pass to `poptorch.Options`
  (`import popart` is this module: the top-level `popart/` package aliases it).
- `popdist` (with `popdist.poptorch.Options`): what an instance launched by `poprun` asks about its
  launch (`import popdist` is this package: the top-level `popdist/` aliases it).
- `poprun`: the launcher, the `poprun` console command: N instances of a program on this machine,
  started by torchrun; when one fails, the others are stopped and poprun exits with its status.
- `horovod_torch`: Horovod's host-side collectives on torch.distributed, served to poprun's instances
  as `horovod.torch`; `examples_utils`: `examples_utils.load_lib`, served the same way. poprun serves
  them from `poprun_stand_ins/` (put on the instances' `PYTHONPATH`) only when the real package is
  not installed; nothing else imports that folder.
- `launch`: the launch contract between poprun and the instances. poprun starts them with torchrun,
  which sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE`; poprun adds
  `POPDIST_NUM_TOTAL_REPLICAS` (the whole run's replicas, R) and, when given,
  `POPDIST_NUM_IPUS_PER_REPLICA`. popdist and horovod.torch read them back by the same names. The
  rule: every instance runs the same number of replicas, R / N, at least one; poprun refuses a
  command line that breaks it and popdist a value that does (set by hand), both in its words.

The instances share one process group (the runtime's backend choice,
`runtime.distributed.process_group_backend`), which PopTorch's models, `popdist.init()` and
`horovod.torch`'s `init()` all join.
"""
