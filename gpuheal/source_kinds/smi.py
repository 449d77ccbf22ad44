"""nvidia-smi / rocm-smi on each host, over each GPU's own transport (issue 12): the GPU source when the
config names no other. It needs no config section of its own (``heal:``'s SSH settings and each GPU's
``smi_command`` serve it). The reader is :func:`gpuheal.sources.smi_sense.read_poll`."""

from __future__ import annotations

from gpuheal.signals import READINGS, Source, SourceSpec
from gpuheal.source_kinds.base import SourceKind

NO_MONITOR_FIX = "configure monitor.url to read them from gpu-monitor"

KIND = SourceKind(
    spec=SourceSpec(
        Source.SMI, READINGS, computes_trends=False,
        lacks_why="no gpu-monitor configured (monitor:); GPU readings come from nvidia-smi / rocm-smi per host",
        lacks_fix=NO_MONITOR_FIX, label="nvidia-smi / rocm-smi",
    ),
    reader="gpuheal.sources.smi_sense:read_poll",
)
