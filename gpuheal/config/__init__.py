"""Configuration: YAML → JSON Schema → merged with the spec's defaults → frozen values.

The spec's numbers live in ``defaults.yaml``; the fleet config overrides them globally or per
GPU (``gpus[].rules.<issue-id>.<param>``). Every error names its key path in one line
(``gpus[1].vram_total_mb: must be > 0``) and becomes exit 3 at the CLI boundary.
"""

from gpuheal.config.load import (
    Config,
    GpuConfig,
    load_config,
    load_config_dict,
    resolve_config_path,
)

__all__ = ["Config", "GpuConfig", "load_config", "load_config_dict", "resolve_config_path"]
