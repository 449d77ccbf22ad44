"""Is each llama-server's task loop answering, poll over poll? Pure (issue 20; contract "Rule timing",
Rule 3 from a hung task loop).

llama-server answers ``/health`` and ``/props`` on its HTTP threads, but ``/metrics``, ``/slots`` and
every completion go through its task loop (the main thread). A deadlocked decode or a stuck CUDA
kernel (llama.cpp#27388) leaves ``/health`` saying ok while those hang: measured on b11312 with the
main thread stopped by ptrace, ``/health`` 200 in 10 ms, ``/metrics`` and ``/slots`` no answer.
With no ``/metrics`` answer there is no ``n_decode_total`` either, so Rule 3's decode progress
(``rules/model_stuck/memory.py``) cannot see it.

A **stalled poll**: ``/health`` ok, at least one task-loop endpoint asked and not answered within
the probe deadline (``timeout``), and none answered. A busy server is not a hung one: it answers
``/metrics`` between decode steps (measured: every slot busy, requests deferred, ``/metrics`` in
milliseconds), so one answer ends the run. A poll that says neither (``/health`` failing is Rule 6's;
``/metrics`` disabled and nothing else asked; a 401) neither advances nor resets it — as for
``n_decode_total``, ``model-stuck`` fires at the rule's hold, the 3rd consecutive stalled poll.

The run is Rule 3's to remember (``rules/model_stuck/memory.py``, ``taskloop``), so cron's one-shot
runs and ``replay`` see the same sequence.
"""

from __future__ import annotations

from typing import Any

HEALTH_OK = "ok"
ANSWERED = frozenset({"ok", "idle"})  # /slots "idle": not asked because /metrics answered "nothing in flight"
SILENT = "timeout"
# the GpuSample field of each task-loop endpoint, and the path people know it by
ENDPOINTS = (("metrics", "/metrics"), ("slots", "/slots"), ("canary", "/completion"))


def classify(sample: Any) -> tuple[bool | None, list[str], list[str]]:
    """(stalled?, answered paths, silent paths) of one GPU's poll; ``None``: this poll cannot say."""
    if getattr(sample, "endpoint", None) != HEALTH_OK:
        return None, [], []
    answered, silent = ["/health"], []
    for field, path in ENDPOINTS:
        state = getattr(sample, field, None)
        if not isinstance(state, str):
            continue
        if state in ANSWERED:
            answered.append(path)
        elif state == SILENT:
            silent.append(path)
    if len(answered) > 1:
        return False, answered, silent
    if silent:
        return True, answered, silent
    return None, answered, silent

