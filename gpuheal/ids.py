"""The contract's stable issue ids (alerts, the audit trail and dashboards key on them)."""

ISSUE_IDS = (
    "thermal-critical",
    "vram-leak",
    "model-stuck",
    "benchmark-regression",
    "circuit-breaker-stuck",
    "host-unreachable",
    "data-source-unreachable",
    "thermal-warning",
    "thermal-rising",
    "context-window",
    "workload-misrouted",
    "api-key-mismatch",
    "cooling-infrastructure",
)
