"""IPU configs: `IPUConfig` (Optimum Graphcore's `ipu_config.json`), where a name is found, how a run loads one.

One room for configuration, read from the bottom: `schema.py` (the attributes, their defaults and
the rules of what is valid), `parsing.py` (the `--ipu_config_overrides` syntax), `legacy.py`
(Optimum Graphcore 0.x files: pod-keyed values, renamed keys), `hub.py` (a Hub id, its cache, or the
configs bundled with the package), `ipu_config.py` (the `IPUConfig` class and its mode), and
`loading.py` (the sequence a run applies: name, the caller's options, overrides, IPU count).
"""

from optimum_ipu.configuration.ipu_config import CONFIG_NAME, IPUConfig, IPUConfigError, n_ipu_from_pod_type
from optimum_ipu.configuration.loading import load_ipu_config, total_ipus

__all__ = [
    "CONFIG_NAME",
    "IPUConfig",
    "IPUConfigError",
    "load_ipu_config",
    "n_ipu_from_pod_type",
    "total_ipus",
]
