"""The heal run's side of :class:`gpuheal.core.remedy.RemedyContext`: every capability a rule's remedy
hooks use (run a command where a GPU's commands run, a LiteLLM change, a real completion, LiteLLM's
model health, the rule's own record, the run's clock), bound to one GPU. The hooks live in ``rules/``
and import none of this: they get a :class:`Context`.

Also here, once: "which pids are this GPU's llama-server?" — ``pgrep -af llama-server`` where the GPU's
commands run, read by :func:`gpuheal.parse.llama_process.read_pgrep` on the endpoint's port (Rules 2
and 4 ask; Rule 6.1 reads the same command's answer for its look).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from gpuheal.actions.perform import LiteLLMCall, perform, values_for
from gpuheal.actions.runner import Runner, expand_argv
from gpuheal.config.model import Config
from gpuheal.core.actions import Action, NotRun, StepResult
from gpuheal.core.remedy import Ran
from gpuheal.parse.llama_process import PGREP_ARGV, read_pgrep
from gpuheal.state.store import StateDir

LOOK_TIMEOUT_S = 15.0  # a look (pgrep, systemctl is-active) is quick: at most this, or command_timeout_s if less
Check = Callable[[str], dict[str, Any]]  # (alias) -> a verdict document (model health, a completion)


def endpoint_port(endpoint: str) -> int | None:
    """The port of a GPU's endpoint URL (the scheme's default when none is written)."""
    try:
        parts = urlsplit(endpoint)
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


class Records:
    """The remedies' own records between runs (each rule's ``state_file``), by issue id: read once per
    run, written at once when saved. Without a state directory (a single attempt run in a test) the
    records given are used and nothing is written."""

    def __init__(self, store: StateDir | None, files: Mapping[str, str], given: Mapping[str, Any] | None = None):
        self._store, self._files = store, dict(files)
        self._docs: dict[str, Any] = dict(given or {})

    def get(self, issue: str) -> Any:
        if issue not in self._docs:
            name = self._files.get(issue)
            self._docs[issue] = self._store.read(name, {}) if self._store is not None and name else {}
        return self._docs[issue]

    def save(self, issue: str, doc: Any) -> None:
        self._docs[issue] = doc
        name = self._files.get(issue)
        if self._store is not None and name:
            self._store.write(name, doc)

    def all(self) -> dict[str, Any]:
        """Every declared record, as last saved (the planner's guards read them)."""
        return {issue: self.get(issue) for issue in self._files}


@dataclass
class Context:
    """One heal run's capabilities for the remedy hooks of one rule (``issue``), bound to ``gpu``."""

    cfg: Config
    gpu: str
    issue: str
    now_s: float
    runner: Runner
    secrets: tuple[str, ...]
    litellm: LiteLLMCall | None = None
    health: Check | None = None
    prove: Check | None = None
    records: Records = field(default_factory=lambda: Records(None, {}))

    def for_gpu(self, alias: str) -> Context:
        return replace(self, gpu=alias)

    def perform(self, step: Action, timeout_s: float | None = None, **values: str) -> StepResult:
        timeout = self.cfg.heal.command_timeout_s if timeout_s is None else timeout_s
        return perform(step, {**values_for(self.gpu, self.cfg), **values}, self.runner, self.litellm, timeout,
                       self.secrets, self.cfg)  # fmt: skip

    def run(self, argv: tuple[str, ...], target: str) -> Ran:
        try:
            expanded = expand_argv(argv, values_for(self.gpu, self.cfg))
        except Exception as exc:  # noqa: BLE001 — a bad template: what it would have told is not known
            return Ran(tuple(argv), NotRun(str(exc)))
        return Ran(tuple(expanded), self.runner(target, expanded, self._look_timeout_s))

    def llama_pids(self) -> frozenset[int]:
        """This GPU's llama-server by its endpoint's port; empty when not known (pgrep missing or
        failing, or the server runs under another name): the program's name decides then."""
        g = self.cfg.gpu(self.gpu)
        try:
            outcome = self.runner(g.host if g.transport == "ssh" else "local", list(PGREP_ARGV), self._look_timeout_s)
        except Exception:  # noqa: BLE001 — a runner that trips is "not known", never a crash
            return frozenset()
        if outcome.error or outcome.timed_out or outcome.rc != 0:
            return frozenset()
        return frozenset(read_pgrep(outcome.stdout or "", self.llama_port))

    @property
    def llama_port(self) -> int | None:
        return endpoint_port(self.cfg.gpu(self.gpu).endpoint)

    def complete(self) -> Mapping[str, Any]:
        return self.prove(self.gpu) if self.prove is not None else {"ok": False, "error": "no completion asked"}

    def model_health(self) -> Mapping[str, Any]:
        return self.health(self.gpu) if self.health is not None else {"litellm": "not asked"}

    def until(self, seen: Callable[[], bool], within_s: float, every_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while True:
            if seen():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(every_s)

    def record(self) -> Any:
        return self.records.get(self.issue)

    def save_record(self, doc: Any) -> None:
        self.records.save(self.issue, doc)

    @property
    def _look_timeout_s(self) -> float:
        return min(self.cfg.heal.command_timeout_s, LOOK_TIMEOUT_S)
