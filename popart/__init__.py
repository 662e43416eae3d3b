"""The Poplar SDK's `popart` import name, provided by optimum-ipu: this package *is* `optimum_ipu.sdk.popart`.

PopTorch programs import `popart` for its session-option enums (`int(popart.SyntheticDataMode.RandomNormal)`);
`import popart` reaches the same module objects as `optimum_ipu.sdk.popart` (one implementation, two
names), so the enums are one set of classes whichever name a program uses. (PyPI's `popart` is an
unrelated project.)
"""

import sys

import optimum_ipu.sdk.popart  # noqa: F401 - imports the implementation, whose modules are aliased below

for _name, _module in list(sys.modules.items()):
    if _name == "optimum_ipu.sdk.popart" or _name.startswith("optimum_ipu.sdk.popart."):
        sys.modules["popart" + _name[len("optimum_ipu.sdk.popart") :]] = _module
