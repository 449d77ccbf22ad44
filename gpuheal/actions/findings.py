"""What a fix found on the way joins what was detected: the audit line and the alert carry it.

Rule 2: which process grew, or why none can be named (``attribution``); Rule 6.1: whether
llama-server was hung or down (``process``); Rule 4: its three checks' answers, and the mark for the
re-benchmark that will verify the fix (``rule4``). One place, so ``steps/heal`` names no rule.
"""

from __future__ import annotations

from dataclasses import replace

from gpuheal.actions.record import Subject


def with_findings(store, subject: Subject, ex, run_id: str, now_s: float) -> Subject:
    detected = dict(subject.detected)
    if "attribution" in ex.evidence:
        detected["attribution"] = ex.evidence["attribution"]
    if "process" in ex.evidence:
        detected["process"] = ex.evidence["process"]["case"]
    subject = replace(subject, detected=detected)
    if "rule4" in ex.evidence:
        from gpuheal.actions.rule4 import found

        subject = found(store, subject, ex, run_id, now_s)
    return subject
