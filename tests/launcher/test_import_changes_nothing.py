"""Importing optimum_ipu or optimum.graphcore (or the launcher itself) patches nothing in transformers,
datasets, evaluate or huggingface_hub: the shims exist only while `optimum-ipu run` runs a program."""

import json
import subprocess
import sys

_SNAPSHOT = r"""
import importlib, json, sys
import datasets, huggingface_hub, transformers, transformers.utils
try:
    import evaluate
except ImportError:
    evaluate = None
OWNERS = ["transformers:AutoConfig", "transformers:AutoTokenizer", "transformers:AutoImageProcessor",
          "transformers:AutoFeatureExtractor", "transformers.models.auto.auto_factory:_BaseAutoModelClass",
          "transformers.modeling_utils:PreTrainedModel", "transformers.configuration_utils:PretrainedConfig",
          "transformers.tokenization_utils_base:PreTrainedTokenizerBase"]

def state():
    seen = {}
    for target in OWNERS:
        module, _, name = target.partition(":")
        seen[target] = id(vars(getattr(importlib.import_module(module), name)).get("from_pretrained"))
    seen["load_dataset"] = id(datasets.load_dataset)
    seen["has load_metric"] = hasattr(datasets, "load_metric")
    seen["evaluate.load"] = id(getattr(evaluate, "load", None))
    seen["has send_example_telemetry"] = hasattr(transformers.utils, "send_example_telemetry")
    seen["notebook_login"] = id(vars(huggingface_hub).get("notebook_login"))
    seen["Audio coding"] = [id(vars(datasets.Audio).get(n)) for n in ("encode_example", "decode_example")]
    seen["has config.tokenizer_class"] = "tokenizer_class" in vars(transformers.PretrainedConfig)
    seen["Trainer.train"] = id(vars(transformers.Trainer).get("train"))
    seen["stand-in modules"] = [m for m in ("torchvision", "IPython") if m in sys.modules]
    return seen

before = state()
import optimum_ipu, optimum.graphcore, optimum_ipu.launcher
from optimum.graphcore import IPUConfig, IPUTrainer, IPUTrainingArguments, pipeline
from optimum.graphcore.data import pad_on_batch_axis
from optimum.graphcore.utils import check_min_version
print(json.dumps({"before": before, "after": state()}))
"""


def test_importing_optimum_ipu_and_optimum_graphcore_changes_nothing_in_the_hugging_face_libraries():
    done = subprocess.run([sys.executable, "-c", _SNAPSHOT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["after"] == seen["before"]
    assert seen["before"]["has send_example_telemetry"] is False  # what the shim would add is absent
