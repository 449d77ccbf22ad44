"""What a rule needs and what a source gives, written down where the code can check it (issue 19).

A :class:`Signal` is one thing the rules read (a temperature, a failure ratio, decode progress…).
Each GPU source declares the signals it provides (:data:`gpuheal.source_kinds.SOURCES`); each rule
declares the signals it needs (``NEEDS``: a tuple of :class:`Need`, each satisfied by any one of its
alternatives — Rule 3 needs a failure ratio *or* decode progress). Two things follow from the two
declarations and from nothing else — never from which config section exists:

- **coverage** (:func:`unmet`, used by ``core/coverage``): a rule whose needs the configured source
  cannot meet is listed in ``rules_off`` with the reason and the fix, so a rule that silently never
  judges cannot exist;
- **the per-poll gate** (``core/engine``): a signal the source did not deliver *this poll* (gpu-monitor
  down, the fallback answered) makes the rule "not known" for the poll — its hold neither advances
  nor resets, and it is not listed off.

Each source declares itself in its own module under :mod:`gpuheal.source_kinds` (its
:class:`SourceSpec`, config section, reader and doctor probes); that package's ``REGISTRY`` is the one
list of them. How a trend is computed follows from :attr:`SourceSpec.computes_trends`: a source that
keeps its own history (Prometheus: PromQL over the rule's window) gives the trend with each reading; a
per-poll source (gpu-monitor, nvidia-smi / rocm-smi, the Rule 7 fallback) gives readings that gpuheal records
in its own history, the same way whatever the source, and the trend is fitted there.

Pure: no IO, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Signal(StrEnum):
    """A signal the rules read. Values are stable names (``rules_off`` and doctor print them)."""

    TEMP = "temperature"
    TEMP_TREND = "temperature trend"
    VRAM = "VRAM used"
    VRAM_TREND = "VRAM trend"
    UTIL = "utilisation"
    POWER = "power"
    FAILURE_RATIO = "request failure ratio"
    DECODE_PROGRESS = "decode progress (/metrics)"
    TASK_LOOP = "task loop answers (/metrics, /slots)"  # issue 20: /health ok, the task loop silent
    BREAKERS = "LiteLLM circuit breakers"
    REQUEST_SHARE = "per-GPU request counts"
    SOURCE_HEALTH = "GPU data source availability"
    ENDPOINT = "llama-server direct probe"
    BENCHMARK = "benchmark results"


class Source(StrEnum):
    """The built-in GPU sources' names: where one poll's GPU readings came from (the ``source`` of an
    observation and a trace). A source's name is declared in its module (:mod:`gpuheal.source_kinds`);
    a new source needs no member here."""

    MONITOR = "monitor"
    SMI = "smi"
    PROMETHEUS = "prometheus"
    FALLBACK = "smi-fallback"  # Rule 7.3: nvidia-smi / rocm-smi while gpu-monitor is unusable


@dataclass(frozen=True)
class Window:
    """How a rule reads a trend signal: the fit's window and what it must show, each named by the rule's
    ``Params`` field (so each GPU's value comes from the config). A source that computes trends where
    the data lives (Prometheus: PromQL) asks what these say, and nothing else names a rule's window
    (issue 26 item 5).

    - ``window``: the field holding the window the fit runs over; ``unit_s``: seconds per unit of it
      and of the spans (3600 for a field in hours);
    - ``spans``: fields holding the spans the fit must be proven to cover (judging, recovering);
    - ``sustained``: (rate field, ratio field): each half of the window must grow at rate × ratio too;
    - ``above``: the field of a threshold the rule judges the trend only above (the reading now);
    - ``restarts``: the window starts again after gpuheal restarted the GPU (plus its startup grace)."""

    window: str
    unit_s: float = 1.0
    spans: tuple[str, ...] = ()
    sustained: tuple[str, str] | None = None
    above: str | None = None
    restarts: bool = False


@dataclass(frozen=True)
class Need:
    """One need of a rule: any one of ``any_of`` satisfies it; a trend signal's need says how the rule
    reads it (``window``)."""

    any_of: tuple[Signal, ...]
    window: Window | None = None

    def met(self, provided: frozenset[Signal]) -> bool:
        return any(s in provided for s in self.any_of)

    def describe(self) -> str:
        return " or ".join(s.value for s in self.any_of)


def needs(*groups: Signal | tuple[Signal, ...] | Need) -> tuple[Need, ...]:
    """``needs(Signal.TEMP, (Signal.FAILURE_RATIO, Signal.DECODE_PROGRESS), trend(...))``: each argument
    one need, a tuple being alternatives, a :class:`Need` as it is."""
    return tuple(g if isinstance(g, Need) else Need(g if isinstance(g, tuple) else (g,)) for g in groups)


def trend(signal: Signal, window: str, **how: object) -> Need:
    """The need of a trend ``signal`` read over the rule's ``window`` field (:class:`Window`'s other
    fields as keywords): ``trend(Signal.TEMP_TREND, "window_s", spans=("min_span_s",), above="temp_c")``."""
    return Need((signal,), Window(window, **how))  # type: ignore[arg-type]


# The GPU readings every GPU source gives (gpuheal.source_kinds: each source's declaration adds its extras).
READINGS = frozenset({Signal.TEMP, Signal.VRAM, Signal.UTIL, Signal.POWER, Signal.TEMP_TREND, Signal.VRAM_TREND})
# Signals every mode has: gpuheal's own direct probe, its own benchmarks, llama-server's /metrics
# (whether a GPU's server serves it is per GPU, see :func:`per_gpu`).
ALWAYS = frozenset({Signal.ENDPOINT, Signal.BENCHMARK, Signal.DECODE_PROGRESS, Signal.TASK_LOOP})


@dataclass(frozen=True)
class SourceSpec:
    """A GPU source's declaration: what it provides, whether it computes trends itself, and what
    an operator does to get what it lacks. Each source makes it in its own module
    (:mod:`gpuheal.source_kinds`); ``source`` is its name (a :class:`Source` for the built-in ones)."""

    source: str
    provides: frozenset[Signal]
    computes_trends: bool
    lacks_why: str
    lacks_fix: str
    # a service of the operator's that Rule 7 may restart when the source is unusable (gpu-monitor's
    # restart command); False: nothing of ours to restart (Prometheus, smi): Rule 7 escalates
    restartable: bool = False
    label: str = ""  # how messages name it ("gpu-monitor", "Prometheus"); "" = its name


def per_gpu(base: frozenset[Signal], *, serves_metrics: bool | None, reachable: bool | None,
            serves_task_loop: bool | None = None) -> frozenset[Signal]:
    """What one GPU has this poll: the source's signals, less decode progress when its llama-server
    serves no ``/metrics`` (``False``; ``None`` = not known yet, assumed), less the task-loop signal
    when it serves neither ``/metrics`` nor ``/slots`` (:func:`serves_task_loop`), less the direct
    probe when it did not answer (``reachable`` not ``True``)."""
    out = set(base | ALWAYS)
    if serves_metrics is False:
        out.discard(Signal.DECODE_PROGRESS)
    if serves_task_loop is False:
        out.discard(Signal.TASK_LOOP)
    if reachable is not True:
        out.discard(Signal.ENDPOINT)
    return frozenset(out)


def serves_task_loop(metrics: str | None, slots: str | None, canary: str | None = None) -> bool | None:
    """Whether a llama-server's task loop shows itself this poll (issue 20): a canary completion ran,
    or it serves ``/metrics`` or ``/slots`` — ``False`` only when both answered 501 (disabled) and no
    canary ran; ``None`` when nothing is known."""
    if canary is not None:
        return True
    if metrics is None and slots is None:
        return None
    return not (metrics == "disabled" and slots in ("disabled", None))


def unmet(rule_needs: tuple[Need, ...], provided: frozenset[Signal]) -> tuple[Need, ...]:
    """The needs ``provided`` does not meet (empty: the rule can judge)."""
    return tuple(n for n in rule_needs if not n.met(provided))
