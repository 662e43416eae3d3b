"""The Optimum Graphcore version whose API `optimum.graphcore` provides, and its version check."""

from __future__ import annotations

from packaging import version

__all__ = ["OPTIMUM_GRAPHCORE_API_VERSION", "check_min_version"]

# Scripts written for Optimum Graphcore check its version (`check_min_version("0.6.0.dev0")`); they
# need the version of the API they were written against, which is 0.7.1's, not optimum-ipu's own.
OPTIMUM_GRAPHCORE_API_VERSION = "0.7.1"


def check_min_version(min_version: str) -> None:
    """Raise `ImportError` if a script needs a newer Optimum Graphcore API than the one provided here.

    Optimum Graphcore's last release was 0.7.1, so a script asking for more was written for a
    development version that optimum-ipu does not mirror.
    """
    if version.parse(OPTIMUM_GRAPHCORE_API_VERSION) < version.parse(min_version):
        raise ImportError(
            f"This script needs Optimum Graphcore >= {min_version}, but optimum-ipu provides the API of "
            f"Optimum Graphcore {OPTIMUM_GRAPHCORE_API_VERSION} (its last release). Lower the version in the "
            "script's check_min_version call if it runs on 0.7.1."
        )
