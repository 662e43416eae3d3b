"""The Poplar SDK's `popart` import name, provided by optimum-ipu: this package *is* `optimum_ipu.poptorch.sdk_popart`.

PopTorch programs import `popart` for its session-option enums (`int(popart.SyntheticDataMode.RandomNormal)`);
`import popart` reaches the same module object as `optimum_ipu.poptorch.sdk_popart`, so the enums are
one set of classes whichever name a program uses. (PyPI's `popart` is an unrelated project.)
"""

import sys

import optimum_ipu.poptorch.sdk_popart as _sdk_popart

sys.modules[__name__] = _sdk_popart
