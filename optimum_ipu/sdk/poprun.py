"""`poprun`: the Poplar SDK's launcher of PopTorch programs over several instances, on this machine.

On an IPU-POD, `poprun --num-instances N --num-replicas R python train.py ...` starts N instances
(host processes) of the program, each running R / N replicas, over V-IPU partitions, hosts and MPI.
Here the N instances are N processes of this machine started by torchrun (`torch.distributed.run`,
a c10d rendezvous on localhost), which gives each its `RANK` / `WORLD_SIZE`; poprun adds what PopDist
reads beyond that (`POPDIST_NUM_TOTAL_REPLICAS`, `POPDIST_NUM_IPUS_PER_REPLICA`: the launch contract,
`optimum_ipu.sdk.launch`, which popdist reads them with). The instances also get optimum-ipu's `horovod.torch` and
`examples_utils.load_lib` (`poprun_stand_ins/` on their `PYTHONPATH`), each only when the real package is
not installed: a real installation is never shadowed.

The options that shape the launch are read: `--num-instances`, `--num-replicas` (a multiple of the
instances; by default one replica per instance), `--ipus-per-replica`, `--only-output-from-instance`.
Those that only mean something on a pod (`--vipu-*`, `--host`, `--mpi-*-args`, `--num-ilds`, `-vv`, ...)
are accepted and each says once, on stderr, that it has no effect here. Any other option is an error
(naming the option it is a misspelling of), before anything is launched. The exit status is the
program's: when an instance fails, the others are stopped within seconds (even while they wait for it
in a collective) and poprun exits with the status of the first instance that failed (128 + N for a
signal N), naming it and where its output went.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from optimum_ipu.sdk import launch as contract

__all__ = ["Launch", "PoprunError", "launch_instances", "main", "parse"]


# Folders the instances find a stand-in package in (`for_<package>/<package>/`), each put on their
# `PYTHONPATH` only when that package is not installed: a real installation is never shadowed.
STAND_INS = Path(__file__).with_name("poprun_stand_ins")
STAND_IN_PACKAGES = ("horovod", "examples_utils")

# poprun's options that shape the launch here: name -> the dataclass field it sets (each takes an integer).
_READ = {
    "--num-instances": "instances",
    "--num-replicas": "replicas",
    "--ipus-per-replica": "ipus_per_replica",
    "--only-output-from-instance": "only_output_from",
}
_POD = (
    "optimum-ipu runs the instances as processes of this machine, with no V-IPU partition, host list or MPI"
)
# Options of real poprun that take a value and only mean something on a pod (and any other --vipu-* one).
_POD_VALUED = (
    "--host", "--vipu-server-host", "--vipu-server-port", "--vipu-server-timeout", "--vipu-partition",
    "--vipu-cluster", "--vipu-allocation", "--update-partition", "--reset-partition", "--remove-partition",
    "--mpi-global-args", "--mpi-local-args", "--executable-cache-path", "--num-ilds", "--numa-aware",
    "--print-topology", "--offline-mode",
)  # fmt: skip
# Switches (no value) that only mean something on a pod: poprun's verbosity.
_POD_SWITCHES = ("-v", "-vv", "-vvv", "--vv", "--vvv", "--verbose")
_LONG = (*_READ, *_POD_VALUED, "--verbose", "--vv", "--vvv", "--help", "--version")

USAGE = """usage: poprun [--num-instances N] [--num-replicas R] [--ipus-per-replica K]
              [--only-output-from-instance I] [pod options] PROGRAM [ARGS...]

Launch N instances of PROGRAM on this machine (torchrun), each running R / N of the R replicas
(optimum-ipu's simulated IPU-POD). Example: poprun --num-instances 2 --num-replicas 4 python train.py

  --num-instances N             instances (processes) to launch (default 1)
  --num-replicas R              replicas of the whole run, a multiple of N (default N)
  --ipus-per-replica K          IPUs per replica, as popdist.getNumIpusPerReplica() reads it (default 1)
  --only-output-from-instance I show only instance I's output; the others' goes to log files
  pod options                   accepted, no effect here: --vipu-* (--vipu-server-host, --vipu-partition, ...),
                                --host, --mpi-global-args, --mpi-local-args, --executable-cache-path,
                                --num-ilds, --numa-aware, --print-topology, --offline-mode,
                                --update-partition, --reset-partition, --remove-partition, -v/-vv/-vvv

Any other option is an error. An option may be abbreviated (--num-inst 2) where no other one starts so.
"""


class PoprunError(Exception):
    """A launch poprun cannot make, with what to change; printed as one line, exit status 2 (127: no program)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


@dataclass
class Launch:
    """What a poprun command line asks for."""

    program: list[str]
    instances: int = 1
    replicas: int | None = None
    ipus_per_replica: int | None = None
    only_output_from: int | None = None
    ignored: list[str] = field(default_factory=list)  # options given that change nothing here, each once


def _expand(token: str) -> str:
    """A long option as written, or the one known option it abbreviates (as poprun's parser allows)."""
    if token in _LONG or token in _POD_SWITCHES:
        return token
    matches = [name for name in _LONG if name.startswith(token)]
    if len(matches) > 1:
        raise PoprunError(
            f"{token} is ambiguous: it could be {', '.join(matches)}. Write the option in full."
        )
    return matches[0] if matches else token


def _unknown(name: str) -> str:
    """The error for an option poprun does not know: the known one it is a misspelling of, if any, and the rest."""
    close = difflib.get_close_matches(name, [*_LONG, *_POD_SWITCHES], n=1, cutoff=0.75)
    hint = f" did you mean {close[0]}?" if close else ""
    return (
        f"unknown option {name}:{hint} optimum-ipu's poprun reads {', '.join(_READ)} and accepts the pod options "
        "(--vipu-*, --host, --mpi-global-args, --mpi-local-args, --executable-cache-path, --num-ilds, -vv, ...: "
        "poprun --help lists them); it launches nothing with an option it does not know."
    )


def _positive(option: str, value: str, allow_zero: bool = False) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0 or (number == 0 and not allow_zero):
        kind = "an integer >= 0" if allow_zero else "a positive integer"
        raise PoprunError(f"{option} takes {kind}, got {value!r}: e.g. {option} 2.")
    return number


def parse(argv: list[str]) -> Launch | None:
    """Split `argv` into poprun's options and the program with its arguments; None for --help / --version.

    The program starts at the first word that is not an option or an option's value; everything after
    it is the program's, never read by poprun.
    """
    launch = Launch(program=[])
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-") or token == "-":
            launch.program = argv[i:]
            break
        name, has_value, value = token.partition("=")
        name = _expand(name) if name.startswith("--") else name
        if name in ("-h", "--help"):
            print(USAGE, end="")
            return None
        if name == "--version":
            print(
                "poprun (optimum-ipu's stand-in for the Poplar SDK's poprun, instances launched by torchrun)"
            )
            return None
        if name in _POD_SWITCHES:
            if has_value:
                raise PoprunError(f"{name} takes no value (got {token!r}).")
            launch.ignored.append(name)
            i += 1
            continue
        if name not in _READ and name not in _POD_VALUED and not name.startswith("--vipu-"):
            raise PoprunError(_unknown(name))
        if not has_value:
            if i + 1 >= len(argv):
                raise PoprunError(f"{name} needs a value: e.g. {name}=VALUE, before the program.")
            value = argv[i + 1]
            i += 1
        i += 1
        if name in _READ:
            setattr(
                launch, _READ[name], _positive(name, value, allow_zero=name == "--only-output-from-instance")
            )
        else:
            launch.ignored.append(name)
    launch.ignored = list(dict.fromkeys(launch.ignored))
    if launch.replicas is None:
        launch.replicas = launch.instances
    _check(launch)
    return launch


def _check(launch: Launch) -> None:
    """The rules a launch must keep, each broken one named with the fix."""
    if not launch.program:
        raise PoprunError(
            "no program to run: write it after poprun's options, e.g. "
            "poprun --num-instances 2 --num-replicas 2 python train.py."
        )
    n, r = launch.instances, launch.replicas
    problem = contract.replicas_problem(r, n)
    if problem:
        raise PoprunError(
            f"--num-replicas {r} cannot run on --num-instances {n}: {problem}. Use --num-replicas "
            f"{' or '.join(map(str, contract.replica_counts(r, n)))}, or --num-instances "
            f"{' or '.join(map(str, contract.instance_counts(r)))}."
        )
    if launch.only_output_from is not None and launch.only_output_from >= n:
        raise PoprunError(
            f"--only-output-from-instance {launch.only_output_from} names no instance: the {n} instances are "
            f"0 ... {n - 1}."
        )
    program = launch.program[0]
    found = (
        shutil.which(program) if os.sep not in program else (program if os.access(program, os.X_OK) else None)
    )
    if found is None:
        hint = f" To run a Python file, write `python {program}`." if program.endswith(".py") else ""
        raise PoprunError(f"program {program!r} not found (or not executable): poprun runs PROGRAM [ARGS...].{hint}",
                          status=127)  # fmt: skip


def _say(message: str) -> None:
    sys.stdout.flush()
    print(f"poprun: {message}", file=sys.stderr, flush=True)


def _environment(launch: Launch) -> dict[str, str]:
    """The variables the instances get on top of poprun's own environment (torchrun adds RANK and the rest)."""
    env = contract.environment(launch.replicas, launch.ipus_per_replica)
    # torchrun would set 1 thread per instance (and say so in a banner); share this machine's cores instead.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(max(1, cores // launch.instances))
    served = [str(STAND_INS / f"for_{name}") for name in STAND_IN_PACKAGES if importlib.util.find_spec(name) is None]
    if served:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*served, os.environ.get("PYTHONPATH")) if p)
    return env


def _torchrun_args(launch: Launch, logs: str | None = None) -> list[str]:
    """torchrun's command line for `launch`; with `logs`, the instances' output but instance
    `--only-output-from-instance`'s goes to files under that folder."""
    args = ["--standalone", "--nnodes=1", f"--nproc_per_node={launch.instances}", "--monitor_interval=0.1"]
    others = [k for k in range(launch.instances) if k != launch.only_output_from]
    if logs is not None and others:
        args += [f"--log_dir={logs}", "--redirects=" + ",".join(f"{k}:3" for k in others)]
    return [*args, "--no_python", *launch.program]


def _output_of(instance: int, logs: str | None) -> str:
    """Where `instance`'s output went: its log files under `logs` (torchrun's `RUN/attempt_0/K/`), or here."""
    if logs is not None:
        found = sorted(Path(logs).glob(f"*/attempt_*/{instance}/stderr.log"))
        if found:
            return f"its output is in {found[-1].with_name('stdout.log')} and {found[-1]}"
    return "its output is above"


def launch_instances(launch: Launch) -> int:
    """Run the program's instances under torchrun; return the program's exit status.

    When an instance fails, torchrun stops the others (SIGTERM) and the launch ends with the status of
    the instance that failed first, named on stderr with where its output went. An instance never
    waits for a failed one at its exit (`runtime.distributed._close_process_group`), so a failure while
    the others wait for it in a collective ends the launch within seconds.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    for name in launch.ignored:
        _say(f"{name} has no effect here: {_POD}.")
    os.environ.update(_environment(launch))
    logs = None
    if launch.only_output_from is not None and launch.instances > 1:
        logs = tempfile.mkdtemp(prefix="poprun-logs-")
        _say(f"showing instance {launch.only_output_from}'s output only; the others' goes under {logs}")
    try:
        run(get_args_parser().parse_args(_torchrun_args(launch, logs)))
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()  # the first to fail; those torchrun then stopped come after
        if failure.exitcode >= 0:
            status, how = failure.exitcode or 1, f"exited with status {failure.exitcode}"
        else:
            status, how = 128 - failure.exitcode, f"was killed by signal {-failure.exitcode} (status {128 - failure.exitcode})"
        stopped = " The other instances were stopped." if launch.instances > 1 else ""
        _say(f"instance {rank} {how}; {_output_of(rank, logs if rank != launch.only_output_from else None)}.{stopped}")
        return status
    except SignalException as signal:
        return 128 + int(signal.sigval)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The `poprun` console command."""
    try:
        launch = parse(sys.argv[1:] if argv is None else list(argv))
    except PoprunError as error:
        _say(f"error: {error}")
        return error.status
    return 0 if launch is None else launch_instances(launch)


if __name__ == "__main__":
    sys.exit(main())
