"""gpu-monitor's ``/gpu-data`` (contract "gpu-monitor /gpu-data"): the readings and LiteLLM's request
counts and breakers; when it is unusable, nvidia-smi / rocm-smi over each GPU's transport (Rule 7.3, the
fallback), so the same rules keep judging. Rule 7 may restart it (``heal.gpu_monitor_restart_command``).
The reader is :func:`gpuheal.sources.monitor.read_poll`; the doctor check
:func:`gpuheal.doctor.checks.monitor_check`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuheal.signals import READINGS, Signal, Source, SourceSpec
from gpuheal.source_kinds.base import DoctorProbe, SectionInput, SourceKind


@dataclass(frozen=True)
class MonitorConfig:
    """``monitor:`` — where gpu-monitor serves ``/gpu-data`` and how long a poll of it may take."""

    url: str
    timeout_s: float
    connect_timeout_s: float
    max_response_bytes: int
    fallback_smi: bool = True  # Rule 7.3: smi over each GPU's transport while the monitor is unusable


def build(given: SectionInput) -> MonitorConfig | None:
    """``monitor:`` may be absent (contract "Direct sensing"): then there is no gpu-monitor, and GPU
    readings come from nvidia-smi / rocm-smi over each GPU's transport. Present, its missing keys
    take the defaults (``url``: gpu-monitor's usual ``http://localhost:9100/gpu-data``)."""
    if given.data.get("monitor") is None:
        return None
    mon = given.merged
    return MonitorConfig(
        url=mon["url"],
        timeout_s=float(mon["timeout_s"]),
        connect_timeout_s=float(mon["connect_timeout_s"]),
        max_response_bytes=int(mon["max_response_bytes"]),
        fallback_smi=bool(mon["fallback_smi"]),
    )


def probes(section: Any) -> tuple[DoctorProbe, ...]:
    if not getattr(section, "url", None):
        return ()
    return (DoctorProbe("monitor", "gpu-monitor", float(section.timeout_s), "gpuheal.doctor.checks:monitor_check"),)


KIND = SourceKind(
    spec=SourceSpec(
        Source.MONITOR,
        READINGS | {Signal.FAILURE_RATIO, Signal.BREAKERS, Signal.REQUEST_SHARE, Signal.SOURCE_HEALTH},
        computes_trends=False, lacks_why="", lacks_fix="", restartable=True, label="gpu-monitor",
    ),
    section="monitor",
    build=build,
    reader="gpuheal.sources.monitor:read_poll",
    probes=probes,
    # While gpu-monitor is unusable: the GPU readings only (Rule 7.3), and that the monitor is down (Rule 7
    # keeps judging it). Never a configured mode: such a poll stands for gpu-monitor.
    fallback=SourceSpec(
        Source.FALLBACK, READINGS | {Signal.SOURCE_HEALTH}, computes_trends=False,
        lacks_why="gpu-monitor is unusable this poll", lacks_fix="", restartable=True,
        label="the Rule 7.3 fallback (nvidia-smi / rocm-smi)",
    ),
)
