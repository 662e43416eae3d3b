"""The Poplar SDK's `popdist` import name, provided by optimum-ipu: this package *is* `optimum_ipu.sdk.popdist`.

`import popdist`, `import popdist.poptorch` and `from popdist import ...` all reach the same module
objects as `optimum_ipu.sdk.popdist` (one implementation, two names): what a PopTorch program
launched by `poprun` asks about its launch (`isPopdistEnvSet`, `getInstanceIndex`, ...), and
`popdist.poptorch.Options` for its instance.
"""

import sys

import optimum_ipu.sdk.popdist  # noqa: F401 - imports the implementation, whose modules are aliased below

for _name, _module in list(sys.modules.items()):
    if _name == "optimum_ipu.sdk.popdist" or _name.startswith("optimum_ipu.sdk.popdist."):
        sys.modules["popdist" + _name[len("optimum_ipu.sdk.popdist") :]] = _module
