"""The one sequence that turns a config name and a run's options into the IPU config the run uses.

IPUTrainingArguments (`resolve_ipu_config`), `optimum-ipu config show` and `optimum-ipu plan` all
call `load_ipu_config`, so a name, the IPU count (`n_ipu` or the older `pod_type`) and overrides mean
the same thing everywhere.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from optimum_ipu._quoting import shown
from optimum_ipu.configuration.ipu_config import IPUConfig
from optimum_ipu.configuration.legacy import n_ipu_from_pod_type
from optimum_ipu.configuration.parsing import split_overrides
from optimum_ipu.configuration.schema import IPUConfigError

logger = logging.getLogger(__name__)


def total_ipus(
    pod_type: str | None, n_ipu: int | None, flags: tuple[str, str] = ("--pod_type", "--n_ipu")
) -> int | None:
    """The number of IPUs a run asks for by `pod_type` (podN, the older spelling) and/or `n_ipu`.

    None when neither is given. `flags` are the option names the caller's user typed, for the message.

    Raises:
        IPUConfigError: for a pod type that is not podN with N a power of two, an `n_ipu` below 1, or
            the two disagreeing.
    """
    if n_ipu is not None and (isinstance(n_ipu, bool) or int(n_ipu) < 1):
        raise IPUConfigError(f"{flags[1]} must be an integer >= 1, got {shown(n_ipu)}.")
    if pod_type is None:
        return n_ipu
    pod_ipus = n_ipu_from_pod_type(pod_type)
    if n_ipu is not None and n_ipu != pod_ipus:
        raise IPUConfigError(
            f"{flags[0]} {pod_type} means {pod_ipus} IPUs but {flags[1]} is {n_ipu}: give one of them, or "
            "make them agree."
        )
    return pod_ipus


def load_ipu_config(
    name_or_config: str | os.PathLike | IPUConfig,
    *,
    n_ipu: int | None = None,
    pod_type: str | None = None,
    changes: dict[str, Any] | None = None,
    overrides: str | None = None,
    revision: str | None = None,
    strict: bool = False,
    mode: str | None = None,
    flags: tuple[str, str] = ("--pod_type", "--n_ipu"),
) -> IPUConfig:
    """The IPU config a run uses: the one sequence IPUTrainer's arguments and both CLI commands apply.

    1. `name_or_config`: a copy of a given `IPUConfig`, else `IPUConfig.from_pretrained` (a Hub id,
       its cache, a folder or file, or the bundled copy; pod-keyed values picked by the IPU count);
    2. `changes`: values the caller's own options set (IPUTrainingArguments' `--seed`,
       `--gradient_accumulation_steps`, ...);
    3. `overrides` ("k1=v1,k2=[0.1 0.2]"), which win over both;
    4. the IPU count (`n_ipu`, or `pod_type`'s) sets the replication factors from the final
       `ipus_per_replica`, unless an override set a replication factor itself (kept, with a warning).

    `mode` ("training" / "inference") puts the result in that mode; None leaves it as loaded. `flags`
    are the caller's names for `pod_type` and `n_ipu`, used in the messages.

    Raises:
        IPUConfigError: for an invalid value, override or pod type, or an IPU count that is not a
            multiple of `ipus_per_replica`.
        FileNotFoundError: when no config can be found under that name.
    """
    n_ipu = total_ipus(pod_type, n_ipu, flags)
    if isinstance(name_or_config, IPUConfig):
        config = name_or_config.copy()
    else:
        config = IPUConfig.from_pretrained(
            name_or_config, revision=revision, pod_type=pod_type, n_ipu=n_ipu, strict=strict
        )
    if mode is not None:
        config.mode = mode
    if changes:
        config.update(**changes)
    overridden: set[str] = set()
    if overrides:
        overridden = {item.partition("=")[0].strip() for item in split_overrides(overrides)}
        config.update_from_string(overrides)
    if n_ipu:
        kept = {
            k: v for k, v in config.to_dict().items() if k in overridden and k.endswith("replication_factor")
        }
        config.for_n_ipu(n_ipu)
        if kept:
            config.update(**kept)
            logger.warning("The overrides set %s; n_ipu=%d does not change it.", kept, n_ipu)
    return config
