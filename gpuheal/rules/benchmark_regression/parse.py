"""What Rule 4's checks read from the GPU's own tools (issue 22, item 2). Pure; nothing here raises on
input: a field that is a sentinel (``[N/A]``, ``[Not Supported]``), junk, negative or beyond any
board's power is "not known" (``None``), never zero.

- ``nvidia-smi --query-gpu=power.limit,power.default_limit,power.max_limit --format=csv,noheader,nounits``
  → :class:`PowerLimits` (positional, formats.md §2.1; real rows in ../shared/fixtures/smi: an RTX
  2080 Super prints ``250.00, 250.00, 350.00``, an H200 ``700.00, 700.00, 700.00``);
- ``rocm-smi --showmaxpower --json`` → the current power cap only: rocm-smi's "Max Graphics Package
  Power (W)" is the cap in force (hwmon ``power1_cap``), and rocm-smi prints no default cap, so
  whether an AMD GPU is throttled is "not known" from it (formats.md §3, the cap table);

The parsers live in :mod:`gpuheal.parse.power` (the thermal power cap reads the same answers); this
module names them for Rule 4. The process lists (``nvidia-smi --query-compute-apps``, ``rocm-smi
--showpids``) are read by :mod:`gpuheal.parse.smi`, which Rule 2's attribution reads them with too.
"""

from __future__ import annotations

from gpuheal.parse.power import MAX_WATTS, PowerLimits, parse_power_limits, parse_rocm_power_cap

__all__ = ["MAX_WATTS", "PowerLimits", "parse_power_limits", "parse_rocm_power_cap"]
