"""optimum-ipu's stand-in for Graphcore's `examples_utils` (graphcore/examples-utils), served by `poprun` to
the instances it launches only when no real `examples_utils` is installed: `load_lib` only.

Graphcore's applications call `load_lib(path)` to build (with make, against the Poplar SDK) and load
the C++ custom operations they ship. Here those operations run by name through `poptorch.custom_op`
(`RemapCE`, `CopyTensor`, `Ctc`, `ExpMovAvg`, `Nms`), so nothing is built or loaded: `load_lib` checks
that the source exists and says once that it loads nothing.
"""

from optimum_ipu.sdk.examples_utils import load_lib

__all__ = ["load_lib"]
__version__ = "0.0.0+optimum_ipu"
