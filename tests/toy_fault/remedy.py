"""The toy rule's fix, as a rule's remedy hooks see the world: only through the run's context.

- ``track`` (the follow-through across cron runs): counts, in the rule's own record, the heal runs that
  saw each occurrence open;
- ``guard``: the fix waits until a second run has seen it (a dry run shows the wait too);
- ``before_step``: before the snapshot, a real completion on the GPU's llama-server and the pids
  listening on its port — what it found joins the issue's ``detected``;
- ``conclude``: the toy cannot fix anything: it escalates with what it found.
"""

from __future__ import annotations

from typing import Any

from gpuheal.core.actions import Action
from gpuheal.core.remedy import Execution, Guard, OpenIssue, Planning, RemedyContext, Result

STATE_FILE = "toy-fault.json"  # {ALIAS: {"since": ISO, "runs": n}}


def track(open_now: tuple[OpenIssue, ...], ctx: RemedyContext) -> None:
    book: dict[str, Any] = dict(ctx.record()) if isinstance(ctx.record(), dict) else {}
    kept = {o.gpu: book.get(o.gpu) or {"since": o.since, "runs": 0} for o in open_now}
    for o in open_now:
        entry = kept[o.gpu] if kept[o.gpu].get("since") == o.since else {"since": o.since, "runs": 0}
        kept[o.gpu] = {**entry, "runs": int(entry["runs"]) + 1}
    ctx.save_record(kept)


def guard(p: Planning) -> Guard:
    seen = (p.record or {}).get(p.gpu) or {}
    runs = seen.get("runs", 0) if seen.get("since") == p.since else 0
    return Guard(wait=None if runs >= 2 else f"toy: seen open in {runs} heal run(s), waiting for a second look",
                 seen={"toy_runs": runs})


def before_step(ex: Execution, step: Action, ctx: RemedyContext) -> bool:
    completion = ctx.complete()
    ex.found["toy_look"] = {"completion_ok": bool(completion.get("ok")), "llama_pids": sorted(ctx.llama_pids())}
    return False


def conclude(ex: Execution, ctx: RemedyContext) -> None:
    if ex.result is Result.ACTED:
        ok = ex.found["toy_look"]["completion_ok"]
        ex.ends(Result.ESCALATED, f"toy fault on {ctx.gpu}: nothing safe to change (completion ok: {ok})")
