"""What a script sees and how it ends, for the launcher's runner tests: `behaviour.py ACTION [ARGS...]`.

- `describe OUT.json`: writes sys.argv, __name__, __file__ and sys.path[0].
- `exit CODE`: sys.exit(int(CODE)); `exit-message TEXT`: sys.exit(TEXT).
- `raise`: raises ValueError from a function of the script.
- `offline-data`: loads GLUE from the Hub (fails offline); its flags name local files.
- `unknown-metric`: evaluate.load of a metric the launcher does not serve.
"""

import json
import sys
from dataclasses import dataclass, field


@dataclass
class DataTrainingArguments:
    train_file: str = field(default=None, metadata={"help": "local training data"})
    validation_file: str = field(default=None, metadata={"help": "local validation data"})


def fail():
    raise ValueError("the script's own error")


def main(action, *args):
    if action == "describe":
        with open(args[0], "w") as file:
            json.dump({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0]}, file)
    elif action == "exit":
        sys.exit(int(args[0]))
    elif action == "exit-message":
        sys.exit(args[0])
    elif action == "raise":
        fail()
    elif action == "offline-data":
        from datasets import load_dataset

        load_dataset("glue", "mrpc")
    elif action == "unknown-metric":
        import evaluate

        evaluate.load("bleu")


if __name__ == "__main__":
    main(*sys.argv[1:])
