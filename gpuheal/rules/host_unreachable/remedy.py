"""Rule 6's fix, beyond the restart every GPU issue of this kind gets. The hooks of ``REMEDY``
(:mod:`gpuheal.core.remedy`):

- ``before_step`` (Rule 6.1, "SSH to .15 → check llama-server process"): before the restart, look
  whether llama-server runs (:mod:`~gpuheal.rules.host_unreachable.look`): hung or down goes into the
  audit's ``detected``. Only evidence: the restart is right either way (a hung server is only cured by
  one);
- ``conclude``: Rule 6's verify, second half — after a restart that proved itself with a real
  completion, "LiteLLM reports model healthy": an unhealthy verdict fails the attempt; LiteLLM not
  configured, or not answering, is recorded as such and does not. And Rule 6's escalation: a step that
  could not reach the host over SSH (host key, refused, auth, timeout) is an infrastructure alert now,
  not a failed attempt to retry.
"""

from __future__ import annotations

from gpuheal.core.actions import Action, RunCommand
from gpuheal.core.catalog import ACTIONS
from gpuheal.core.remedy import Execution, RemedyContext, Result
from gpuheal.rules.host_unreachable import look

UNREACHABLE = ("host key", "refused", "auth", "timeout")  # words of a transport error: the host is not reached


def before_step(ex: Execution, step: Action, ctx: RemedyContext) -> bool:
    """Rule 6.1's look, once, before the restart. Never ends the attempt."""
    if not (isinstance(step, RunCommand) and ACTIONS[step.action].restarts) or "process" in ex.evidence:
        return False
    ran = ctx.run(look.check_argv(step.argv), step.target)
    check = look.judge(list(ran.argv), ran.outcome, ctx.llama_port)
    ex.evidence["process"] = check.record()
    ex.found["process"] = check.case()
    return False


def conclude(ex: Execution, ctx: RemedyContext) -> None:
    last = ex.steps[-1] if ex.steps else None
    if ex.result is Result.FAILED and last is not None and not last.ok:
        if last.error and any(w in last.error for w in UNREACHABLE):
            ex.ends(Result.ESCALATED, f"cannot reach host over SSH ({last.error}) — infrastructure alert (Rule 6)")
        return
    if ex.result is not Result.ACTED or not any(isinstance(s, RunCommand) and s.then for s in ex.item.steps):
        return
    seen = dict(ctx.model_health())
    ex.verification = {**ex.verification, **seen}
    if seen.get("litellm") == "unhealthy":
        ex.result = Result.FAILED
        ex.verification["error"] = f"LiteLLM reports the deployment unhealthy: {seen.get('litellm_detail', '')}"
