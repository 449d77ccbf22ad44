"""``gpuheal pause``: an operator pauses healing for one GPU or the whole fleet (maintenance).

While paused, ``heal`` still checks, reports and plans, but every plan item for the paused scope
is ``blocked`` with the reason, and ``heal`` says so. ``--resume`` lifts the pause.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuheal.clock import format_iso
from gpuheal.core.heal_state import HealState, Pause
from gpuheal.errors import GpuhealError
from gpuheal.state import files

if TYPE_CHECKING:
    from gpuheal.runtime import CommandResult, Runtime
    from gpuheal.state.store import StateDir



def command(
    rt: Runtime, store: StateDir, gpu: str | None = None, reason: str = "maintenance", resume: bool = False
) -> CommandResult:
    from gpuheal import exit_codes
    from gpuheal.render.human import clean, print_line
    from gpuheal.runtime import CommandResult

    if gpu is not None and gpu not in rt.cfg.aliases:
        raise GpuhealError(f"--gpu {gpu!r}: no such alias (known: {', '.join(rt.cfg.aliases)})")
    state = HealState.from_json(store.read(files.HEAL, {}))
    scope = gpu or "fleet"
    if resume:
        state = state.with_pause(gpu, None)
        message = f"healing resumed for {scope}"
    else:
        state = state.with_pause(gpu, Pause(reason[:200], format_iso(rt.now)))
        message = f"healing paused for {scope}: {reason[:200]}"
    store.write(files.HEAL, state.to_json())
    doc = {"paused": state.paused_to_json(), "message": message}
    return CommandResult(doc, exit_codes.OK, lambda: print_line(clean(message, 300)))
