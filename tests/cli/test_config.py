"""`optimum-ipu config show`: the resolved config, its batch arithmetic and its origin."""

import argparse
import json
import os
import shutil
import subprocess
import sys

from optimum_ipu.commands import config as config_command
from optimum_ipu.configuration import IPUConfig


def _show(capsys, *argv):
    parser = argparse.ArgumentParser(prog="optimum-ipu")
    config_command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["config", "show", *argv])
    code = args.run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_show_bert_large(capsys):
    code, out, _ = _show(capsys, "Graphcore/bert-large-ipu")
    assert code == 0
    assert out.startswith("IPU config: Graphcore/bert-large-ipu\n")
    assert "Source: copy bundled with optimum-ipu" in out
    assert "File: " in out and "bert-large-ipu/ipu_config.json" in out
    assert '"embedding_serialization_factor": 2' in out
    assert (
        "pipeline: 4 IPUs per replica, layers_per_ipu [3, 7, 7, 7], matmul_proportion [0.15, 0.18, 0.2, 0.25]"
        in out
    )
    assert (
        "combined batch: micro-batch 1 × gradient accumulation 16 × replicas 1 × device iterations 1 = 16"
        in out
    )
    assert "combined batch: micro-batch 1 × replicas 1 × device iterations 5 = 5" in out
    assert "IPUs: 1 replicas × 4 = 4" in out


def test_show_with_micro_batch_pod_and_overrides(capsys):
    code, out, _ = _show(
        capsys,
        "Graphcore/bert-base-ipu",
        "--micro-batch",
        "2",
        "--pod-type",
        "pod16",
        "--overrides",
        "embedding_serialization_factor=2",
    )
    assert code == 0
    assert "micro-batch 2 × gradient accumulation 16 × replicas 4 × device iterations 1 = 128" in out
    assert "IPUs: 4 replicas × 4 = 16" in out
    assert '"embedding_serialization_factor": 2' in out


def test_show_a_local_file(capsys, tmp_path):
    IPUConfig(layers_per_ipu=[-1, -1], device_iterations=3).save_pretrained(tmp_path)
    code, out, _ = _show(capsys, str(tmp_path))
    assert code == 0
    assert "Source: local file" in out
    assert "micro-batch 1 × gradient accumulation 1 × replicas 1 × device iterations 3 = 3" in out


def test_show_an_unknown_name_lists_the_bundled_ones(capsys):
    code, out, err = _show(capsys, "Graphcore/no-such-ipu")
    assert code == 1 and out == ""
    assert "error: No ipu_config.json for 'Graphcore/no-such-ipu'" in err
    assert "Graphcore/bert-base-ipu" in err


def test_show_reports_bad_arguments(capsys):
    code, _, err = _show(capsys, "Graphcore/bert-base-ipu", "--n-ipu", "6")
    assert code == 1 and "n_ipu=6 is not a multiple of ipus_per_replica=4" in err
    code, _, err = _show(capsys, "Graphcore/bert-base-ipu", "--micro-batch", "0")
    assert code == 2 and "--micro-batch must be >= 1" in err


def test_config_without_an_action_exits_2_with_the_usage(capsys):
    from optimum_ipu.cli import main

    assert main(["config"]) == 2
    assert "usage: optimum-ipu config" in capsys.readouterr().err


def test_main_dispatches_config_show(capsys):
    from optimum_ipu.cli import main

    assert main(["config", "show", "Graphcore/bert-large-ipu"]) == 0
    assert "layers_per_ipu [3, 7, 7, 7]" in capsys.readouterr().out


def test_the_console_command(tmp_path):
    executable = shutil.which("optimum-ipu", path=os.path.dirname(sys.executable))
    command = [executable] if executable else [sys.executable, "-m", "optimum_ipu.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    done = subprocess.run(
        [*command, "config", "show", "Graphcore/bert-large-ipu", "--micro-batch", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "= 32" in done.stdout
    body = done.stdout.split("\n\n")[1]
    assert json.loads(body)["layers_per_ipu"] == [3, 7, 7, 7]
