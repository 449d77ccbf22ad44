"""Rule 6's fix, beyond the restart every GPU issue of this kind gets. The hooks of ``REMEDY``
(:mod:`gpuheal.core.remedy`):

- ``before_step`` (Rule 6.1, "SSH to .15 → check llama-server process"; 6.2 "restart llama-server if not
  running"): before the restart, look whether llama-server runs (:mod:`~gpuheal.rules.host_unreachable.look`).
  Not running (down): it is *started* (``gpus[].start_command``; by default ``systemctl start`` of the
  restart's unit) in the restart's place. Running but not answering (hung), or not known: it is
  restarted (a hung server is only cured by a restart). A look that got no answer at all from a host whose
  look in the previous run got none either (two silent SSH looks a cron run apart,
  :class:`~gpuheal.rules.host_unreachable.reach.SilentLooks`) is Rule 6's "host itself unreachable →
  infrastructure alert": escalated, with no restart sent down the same dead connection (``ran``: none). One
  silent look is restarted as before: a crash whose host's SSH blips at that moment is still healed.
  ``detected.process`` and the evidence say which case it was and which command ran (``ran``: start |
  restart | none); the step's note says it too;
- ``conclude``: Rule 6's verify, second half — after a start or restart that proved itself with a real
  completion, "LiteLLM reports model healthy": an unhealthy verdict fails the attempt. LiteLLM not
  configured or not answering is "not known", never "passed": the attempt says so, and it is judged on the
  direct probe and a real completion alone. And Rule 6's escalation: a step that could not reach the host
  over SSH (host key, refused, auth, timeout) is an infrastructure alert now, not a failed attempt to retry;
- ``verify`` (a later run, when the issue cleared): the same two halves before the attempt is resolved —
  a real completion, and LiteLLM's health: unhealthy waits for the next poll; not known resolves on the
  completion alone, and the resolved record says so;
- ``drain`` (issue 28 item 2, drain first): every finding of this rule is a hard fault — the direct
  ``/health`` probe refused or timed out — so the GPU leaves LiteLLM's routing at the first bad poll
  (:mod:`gpuheal.core.drain` decides whether a healthy twin keeps its groups served).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuheal.core.actions import Action, CommandOutcome, RunCommand
from gpuheal.core.catalog import ACTIONS
from gpuheal.core.confirm import host_silent
from gpuheal.core.remedy import Execution, Proving, RemedyContext, Result, completion_proof
from gpuheal.model import ENDPOINT_REFUSED, ENDPOINT_TIMEOUT
from gpuheal.rules.host_unreachable import look, reach

UNREACHABLE = ("host key", "refused", "auth", "timeout")  # words of a transport error: the host is not reached
KNOWN = ("healthy", "unhealthy")
NOT_KNOWN_MEANS = ("LiteLLM's health of this deployment is not known, which is not a pass: this attempt is judged on "
                   "the direct /health probe and a real completion alone, never resolved on LiteLLM's answer")


def before_step(ex: Execution, step: Action, ctx: RemedyContext) -> bool:
    """Rule 6.1's look, once, before the restart; a llama-server that is not running is started instead.
    Never ends the attempt."""
    if not (isinstance(step, RunCommand) and ACTIONS[step.action].restarts) or "process" in ex.evidence:
        return False
    ran = ctx.run(look.check_argv(step.argv), step.target)
    check = look.judge(list(ran.argv), ran.outcome, ctx.llama_port)
    record = check.record()
    if lost_host(ex, ran.outcome, record, ctx):
        return True
    if check.state == look.NOT_RUNNING:
        argv, source = look.start_argv(ctx.cfg.gpu(ctx.gpu).command("start_command"), step.argv)
        ex.instead = replace(step, argv=argv, note=f"start: llama-server is not running ({source})")
        record["ran"], ex.found["process"] = "start", f"{check.case()} → started"
    else:
        record["ran"], ex.found["process"] = "restart", f"{check.case()} → restarted"
    ex.evidence["process"] = record
    return False


def lost_host(ex: Execution, outcome: CommandOutcome, record: dict[str, Any], ctx: RemedyContext) -> bool:
    """Whether this look's host is lost — silent now (:func:`gpuheal.core.confirm.host_silent`) and in the
    previous run's look (the rule's record, :meth:`~gpuheal.rules.host_unreachable.reach.SilentLooks.lost`):
    then the attempt ends escalated, nothing sent after the look (issue 29: the chaos week's 4 restarts per
    lost host and 12 per partitioned rack, each down a dead connection). A look that answered ends the
    host's remembered silence."""
    host = ctx.cfg.gpu(ctx.gpu).host
    looks = reach.SilentLooks.from_json(ctx.record())
    if not host_silent(outcome.error, outcome.timed_out):
        if host in looks.hosts:
            ctx.save_record(looks.after({host: False}, ctx.now_s).to_json())
        return False
    if not looks.lost(host, ctx.now_s):
        return False  # one silent look: restarted as before (a crash whose host's SSH blips right now)
    record["ran"] = "none"
    ex.evidence["process"] = record
    ex.found["process"] = "host silent in this run's look and the last → not restarted"
    ex.ends(Result.ESCALATED, f"cannot reach host {host} over SSH in this run's look nor the previous run's "
                              f"({outcome.error}) — infrastructure alert (Rule 6)")  # fmt: skip
    return True


def litellm_seen(ctx: RemedyContext) -> dict[str, Any]:
    """LiteLLM's verdict on this GPU's deployment; "not known" (not configured, not answering, no
    deployment found) carries what that means for the attempt."""
    seen = dict(ctx.model_health())
    if seen.get("litellm") not in KNOWN:
        seen["litellm_means"] = NOT_KNOWN_MEANS
    return seen


def conclude(ex: Execution, ctx: RemedyContext) -> None:
    last = ex.steps[-1] if ex.steps else None
    if ex.result is Result.FAILED and last is not None and not last.ok:
        if last.error and any(w in last.error for w in UNREACHABLE):
            ex.ends(Result.ESCALATED, f"cannot reach host over SSH ({last.error}) — infrastructure alert (Rule 6)")
        return
    if ex.result is not Result.ACTED or not any(isinstance(s, RunCommand) and s.then for s in ex.item.steps):
        return
    seen = litellm_seen(ctx)
    ex.verification = {**ex.verification, **seen}
    if seen.get("litellm") == "unhealthy":
        ex.result = Result.FAILED
        ex.verification["error"] = f"LiteLLM reports the deployment unhealthy: {seen.get('litellm_detail', '')}"


def verify(p: Proving, ctx: RemedyContext) -> Mapping[str, Any]:
    """Rule 6's verify before the attempt is resolved: "direct health probe returns 200" (the issue
    cleared on it) and a real completion, "LiteLLM reports model healthy" (unhealthy: not yet)."""
    proof = completion_proof(ctx)
    if not proof["ok"]:
        return proof
    seen = litellm_seen(ctx)
    if seen.get("litellm") == "unhealthy":
        return {**proof, **seen, "ok": False, "error": "LiteLLM reports the deployment unhealthy"}
    return {**proof, **seen}


HARD_FAULTS = {ENDPOINT_REFUSED: "connection refused", ENDPOINT_TIMEOUT: "/health timing out"}


def hard_fault(detected: Mapping[str, Any]) -> str | None:
    """Drain first: the direct probe's answer, as the hard fault it is (``None``: any other, e.g. garbage)."""
    return HARD_FAULTS.get(str(detected.get("endpoint")))
