"""PopTorch's import name, provided by optimum-ipu: this package *is* `optimum_ipu.poptorch`.

`import poptorch`, `import poptorch.optim` and `from poptorch import ...` all reach the same module
objects as `optimum_ipu.poptorch` (one implementation, two names), so `isinstance` checks and option
objects agree whichever name a program uses.
"""

import sys

import optimum_ipu.poptorch  # noqa: F401 - imports the implementation, whose modules are aliased below

for _name, _module in list(sys.modules.items()):
    if _name == "optimum_ipu.poptorch" or _name.startswith("optimum_ipu.poptorch."):
        sys.modules["poptorch" + _name[len("optimum_ipu.poptorch") :]] = _module
