"""PopTorch Geometric's import name, provided by optimum-ipu: this package *is* `optimum_ipu.poptorch_geometric`.

`import poptorch_geometric`, `from poptorch_geometric.dataloader import FixedSizeDataLoader` and the like reach
the same module objects as `optimum_ipu.poptorch_geometric` (one implementation, two names). It needs
torch-geometric (`pip install torch-geometric`).
"""

import sys

import optimum_ipu.poptorch_geometric  # noqa: F401 - imports the implementation, whose modules are aliased below

for _name, _module in list(sys.modules.items()):
    if _name == "optimum_ipu.poptorch_geometric" or _name.startswith("optimum_ipu.poptorch_geometric."):
        sys.modules["poptorch_geometric" + _name[len("optimum_ipu.poptorch_geometric") :]] = _module
