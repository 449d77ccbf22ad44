"""Configuration: YAML → strict checks → merged with the spec's defaults → frozen values.

The spec's numbers live in ``defaults.yaml``; the fleet config overrides them globally or per
GPU (``gpus[].rules.<issue-id>.<param>``). Every error names its key path in one line
(``gpus[1].vram_total_mb: must be > 0``) and becomes exit 3 at the CLI boundary.

Layers (issue 10, point 3): :mod:`.model` holds the pure records, :mod:`.load` reads the file, the
environment and ``.env``. Importing this package imports only the model; the loaders are looked up
on first use, so ``from gpuheal.config import Config`` in pure code pulls in no IO.
"""

from typing import Any

from gpuheal.config.model import Config, GpuConfig

_LOADERS = ("load_config", "load_config_dict", "resolve_config_path")

__all__ = ["Config", "GpuConfig", *_LOADERS]


def __getattr__(name: str) -> Any:
    if name in _LOADERS:
        from gpuheal.config import load

        return getattr(load, name)
    raise AttributeError(f"module 'gpuheal.config' has no attribute {name!r}")
