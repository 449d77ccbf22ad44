"""Prometheus textfile export (``--metrics-file PATH`` or ``metrics_file:``), for node_exporter's
textfile collector (formats.md §6): gpuheal's own state in the text exposition format 0.0.4.

Written after any command from what the state directory holds, atomically (a temp file in the
same directory, fsync, rename), with no timestamps (the collector refuses them), every family's
HELP and TYPE once, label values escaped, and aliases as the only GPU identifier (L6). A value
that is not known is left out, never written as 0 ("not known is not zero"). Mode 0644: the
collector must read it, and nothing in it is secret.

Families::

    gpuheal_up 1
    gpuheal_last_run_timestamp_seconds            when this command ran
    gpuheal_health_timestamp_seconds              when gpu-health.json was last written
    gpuheal_fleet_status{status="healthy|degraded|down"}      1 for the current one, else 0
    gpuheal_fleet_status_code                     0 healthy, 1 degraded, 2 down
    gpuheal_issues_open{issue=ID}                 open (firing or verifying) issues per issue id
    gpuheal_issue_active{gpu,issue,severity,state}            1 per open or pending issue
    gpuheal_remediation_attempts{gpu,issue}       attempts on the open occurrence of an issue
    gpuheal_restarts_last_hour{gpu}, gpuheal_restart_budget_remaining{gpu}
    gpuheal_gpu_paused{gpu}                       1 while healing is paused for it
    gpuheal_gpu_endpoint_up{gpu}                  1 when its llama-server answered ok
    gpuheal_gpu_temperature_celsius{gpu}, gpuheal_gpu_vram_used_bytes{gpu},
    gpuheal_gpu_vram_total_bytes{gpu}, gpuheal_gpu_utilization_ratio{gpu}, gpuheal_gpu_power_watts{gpu}
    gpuheal_gpu_tokens_per_second{gpu}            latest successful benchmark
    gpuheal_gpu_baseline_tokens_per_second{gpu}   the baseline in force
    gpuheal_alerts_queued, gpuheal_clean_cycles
    gpuheal_rule_off{rule,gpu}                    1 per rule that cannot judge a GPU ("fleet": any) with
                                                  the configured source, as check's rules_off (issue 19)
    gpuheal_time_to_resolve_seconds{issue}        histogram: onset → proven fix, from the audit trail (issue 20)
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuheal.core.issue import FIRED_STATES, FIRING
from gpuheal.ids import ISSUE_IDS

if TYPE_CHECKING:
    from gpuheal.core.mttr import Histogram
    from gpuheal.runtime import Runtime
    from gpuheal.state.store import StateDir

log = logging.getLogger("gpuheal")

STATUS_CODE = {"healthy": 0, "degraded": 1, "down": 2}

# ``gpuheal_issues_open`` counts an issue from firing until resolved (core/issue.FIRED_STATES); being
# verified after a remediation it still counts (contract "Issue state after a remediation"); ``pending``
# (its hold not yet run) does not count yet.

MB = 1024 * 1024


class Exposition:
    """Families in insertion order; one HELP/TYPE per family; samples contiguous."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def add(
        self, name: str, help_text: str, value: Any, labels: dict[str, Any] | None = None, kind: str = "gauge"
    ) -> None:
        if isinstance(value, bool):
            value = 1 if value else 0
        if not isinstance(value, int | float):
            return
        family = self._families.setdefault(name, (help_text, kind, []))
        label_text = ""
        if labels:
            label_text = "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"
        family[2].append(f"{name}{label_text} {_format_value(value)}")

    def add_histogram(self, name: str, help_text: str, hist: Histogram, labels: dict[str, Any]) -> None:
        """One labelled histogram (:class:`gpuheal.core.mttr.Histogram`): ``_bucket``s, ``_sum``, ``_count``."""
        family = self._families.setdefault(name, (help_text, "histogram", []))
        base = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
        for le, count in hist.buckets:
            family[2].append(f'{name}_bucket{{{base},le="{_format_value(float(le))}"}} {count}')
        family[2].append(f"{name}_sum{{{base}}} {_format_value(float(hist.sum_s))}")
        family[2].append(f"{name}_count{{{base}}} {hist.count}")

    def declare(self, name: str, help_text: str, kind: str = "gauge") -> None:
        self._families.setdefault(name, (help_text, kind, []))

    def text(self) -> str:
        out = []
        for name, (help_text, kind, samples) in self._families.items():
            out.append(f"# HELP {name} {_escape_help(help_text)}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(samples)
        return "\n".join(out) + "\n"


def _escape_label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def render(rt: Runtime, store: StateDir) -> str:
    """The whole exposition: gpuheal itself, the fleet status, the issues, the GPUs, the alerts."""
    from gpuheal import benchdata
    from gpuheal.state import files
    from gpuheal.steps.report import build_summary

    summary = build_summary(rt.cfg, store, rt.now)
    health = store.read_raw(files.GPU_HEALTH) or {}
    bench = benchdata.normalise(store.read(files.BENCH, None))
    ex = Exposition()
    _add_run(ex, rt.now.timestamp(), health)
    _add_status(ex, summary["status"])
    _add_issues(ex, summary["issues"])
    _add_gpus(ex, summary["gpus"], bench)
    _add_rules_off(ex, health.get("rules_off"))
    ex.add("gpuheal_alerts_queued", "Alerts waiting in the queue for escalate.", summary["alerts"]["queued"])
    ex.add(
        "gpuheal_clean_cycles",
        "Consecutive clean heal cycles (All Clear every alerts.all_clear_every).",
        summary["alerts"]["clean_cycles"],
    )
    _add_mttr(ex, store)
    return ex.text()


def _add_mttr(ex: Exposition, store: StateDir) -> None:
    """``gpuheal_time_to_resolve_seconds`` per issue, from the resolved records of the audit trail."""
    from gpuheal.core.mttr import histogram, resolve_times
    from gpuheal.state.audit import audit_records

    for issue, values in sorted(resolve_times(audit_records(store)).items()):
        ex.add_histogram("gpuheal_time_to_resolve_seconds",
                         "Seconds from an issue's onset to the poll that proved its fix, per resolved attempt.",
                         histogram(values), {"issue": issue})


def _add_run(ex: Exposition, now_s: float, health: dict[str, Any]) -> None:
    from gpuheal.clock import to_datetime

    ex.add(
        "gpuheal_up", "Whether gpuheal wrote this file (always 1; use node_textfile_mtime_seconds for staleness).", 1
    )
    ex.add(
        "gpuheal_last_run_timestamp_seconds", "Unix time of the gpuheal command that wrote this file.", round(now_s, 3)
    )
    health_at = to_datetime(health.get("generated_at"))
    if health_at is not None:
        ex.add(
            "gpuheal_health_timestamp_seconds",
            "Unix time of the last check or heal (gpu-health.json).",
            round(health_at.timestamp(), 3),
        )


def _add_rules_off(ex: Exposition, rules_off: Any) -> None:
    """``rules_off`` of the last check (gpu-health.json): one sample per rule and GPU it cannot judge,
    so a dashboard sees a rule that is off rather than a quiet one. Damaged entries are skipped."""
    ex.declare("gpuheal_rule_off", "1 for each rule that cannot judge a GPU (gpu=\"fleet\": every GPU) "
               "with the configured source; why and fix in gpu-health.json rules_off.")
    for entry in rules_off if isinstance(rules_off, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("rule"), str):
            continue
        gpus = entry.get("gpus")
        for gpu in gpus if isinstance(gpus, list) else ["fleet"]:
            if isinstance(gpu, str):
                ex.add("gpuheal_rule_off", "", 1, {"rule": entry["rule"], "gpu": gpu})


def _add_status(ex: Exposition, status: str) -> None:
    ex.declare("gpuheal_fleet_status", "Fleet status from the last check: 1 for the current status, 0 for the others.")
    if status not in STATUS_CODE:
        return
    for name in STATUS_CODE:
        ex.add("gpuheal_fleet_status", "", 1 if name == status else 0, {"status": name})
    ex.add(
        "gpuheal_fleet_status_code",
        "Fleet status from the last check: 0 healthy, 1 degraded, 2 down.",
        STATUS_CODE[status],
    )


def _add_issues(ex: Exposition, issues: list[dict[str, Any]]) -> None:
    """Open (firing or verifying) issues counted per id (every known id, 0 included), then one sample
    per open or pending issue."""
    counts = Counter(dict.fromkeys(ISSUE_IDS, 0))
    for issue in issues:
        if issue.get("state", FIRING) in FIRED_STATES:
            counts[str(issue["issue"])] += 1
    ex.declare("gpuheal_issues_open", "Open (firing or verifying) issues per issue id.")
    for issue_id, n in counts.items():
        ex.add("gpuheal_issues_open", "", n, {"issue": issue_id})
    ex.declare("gpuheal_issue_active", "1 for each open or pending issue.")
    ex.declare("gpuheal_remediation_attempts", "Remediation attempts on the open occurrence of an issue.")
    for issue in issues:
        labels = {"gpu": issue["gpu"], "issue": issue["issue"]}
        ex.add(
            "gpuheal_issue_active",
            "",
            1,
            {**labels, "severity": issue.get("severity", "unknown"), "state": issue.get("state", "firing")},
        )
        ex.add("gpuheal_remediation_attempts", "", int(issue.get("attempts") or 0), labels)


GPU_FAMILIES = (
    ("gpuheal_restarts_last_hour", "llama-server restarts by gpuheal in the last 60 minutes."),
    ("gpuheal_restart_budget_remaining", "Restarts left in the sliding 60-minute budget."),
    ("gpuheal_gpu_paused", "1 while healing is paused for this GPU (or the fleet)."),
    ("gpuheal_gpu_endpoint_up", "1 when the GPU's llama-server answered its last /health probe with ok."),
    ("gpuheal_gpu_temperature_celsius", "GPU temperature at the last check."),
    ("gpuheal_gpu_vram_used_bytes", "VRAM in use at the last check."),
    ("gpuheal_gpu_vram_total_bytes", "VRAM size."),
    ("gpuheal_gpu_utilization_ratio", "GPU utilisation at the last check (0-1)."),
    ("gpuheal_gpu_power_watts", "GPU power draw at the last check."),
    ("gpuheal_gpu_tokens_per_second", "Generation speed of the latest successful benchmark."),
    (
        "gpuheal_gpu_baseline_tokens_per_second",
        "The benchmark baseline in force (rolling 30-day average or config seed).",
    ),
)


def _add_gpus(ex: Exposition, gpus: dict[str, dict[str, Any]], bench: dict[str, Any]) -> None:
    """The per-GPU families, declared even with no GPU so that their HELP is always there."""
    from gpuheal import benchdata

    for name, help_text in GPU_FAMILIES:
        ex.declare(name, help_text)
    for alias, g in gpus.items():
        lab = {"gpu": alias}
        ex.add("gpuheal_restarts_last_hour", "", g["restarts_last_hour"], lab)
        ex.add("gpuheal_restart_budget_remaining", "", g["restart_budget_left"], lab)
        ex.add("gpuheal_gpu_paused", "", 1 if g["paused"] else 0, lab)
        if g["endpoint"] is not None:
            ex.add("gpuheal_gpu_endpoint_up", "", 1 if g["endpoint"] == "ok" else 0, lab)
        ex.add("gpuheal_gpu_temperature_celsius", "", _num(g["temp_c"]), lab)
        used, total = _num(g["vram_used_mb"]), _num(g["vram_total_mb"])
        ex.add("gpuheal_gpu_vram_used_bytes", "", None if used is None else round(used * MB), lab)
        ex.add("gpuheal_gpu_vram_total_bytes", "", None if total is None else round(total * MB), lab)
        util = _num(g["util_pct"])
        ex.add("gpuheal_gpu_utilization_ratio", "", None if util is None else round(util / 100.0, 4), lab)
        ex.add("gpuheal_gpu_power_watts", "", _num(g["power_w"]), lab)
        ok = benchdata.ok_results(bench, alias)
        ex.add("gpuheal_gpu_tokens_per_second", "", _num(ok[-1]["gen_tok_s"]) if ok else None, lab)
        ex.add("gpuheal_gpu_baseline_tokens_per_second", "", _num(g["baseline_tok_s"]), lab)


def write_metrics(rt: Runtime, store: StateDir, path: Path) -> None:
    """Write the textfile; a failure is a warning on stderr, never the command's failure."""
    from gpuheal.credentials import secrets_for
    from gpuheal.redact import redact_text

    try:
        text = redact_text(render(rt, store), secrets_for(rt.cfg))
        from gpuheal.atomic import write_atomic

        write_atomic(Path(path), [text], mode=0o644)  # node_exporter's collector reads it
    except OSError as exc:
        log.warning("metrics file %s not written: %s", path, exc.strerror or exc)
