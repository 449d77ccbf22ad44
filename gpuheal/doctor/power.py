"""The doctor's proof of the thermal power cap (issue 27 item 7): on each GPU whose ``shed-load`` is the
built-in power cap (no command and no LiteLLM deployment: the spec's own fleet), read the board's limits
with the same read-only query the cap starts with, say the cap it would set and that it is within the
board's range, and whether the commands run as root (``nvidia-smi -pl`` and ``rocm-smi
--setpoweroverdrive`` need it). Nothing is set.
"""

from __future__ import annotations

import shlex
from typing import Any

from gpuheal.core import power
from gpuheal.core.actions import CapPower
from gpuheal.doctor import FAIL, OK, WARN, Check
from gpuheal.parse.values import printable

CHECK = "load shedding (power cap)"


def cap_of(cfg: Any, alias: str) -> CapPower | None:
    """The power cap ``shed-load`` uses on ``alias``; ``None`` when another path comes first (a command,
    or LiteLLM's, whose own checks say whether it can shed — the cap is then only its fallback)."""
    from gpuheal.core.plan import resolve_action

    step = resolve_action("shed-load", alias, cfg)
    return step if isinstance(step, CapPower) else None


def power_cap_checks(transport: Any, cfg: Any, alias: str, timeout_s: float) -> list[Check]:
    """One GPU's proof, over the transport its commands run on (read-only: the limits and ``id -u``)."""
    cap = cap_of(cfg, alias)
    if cap is None or cap.ratio is None:
        return []
    query = power.query_argv(cap.vendor, cap.gpu_index)
    out = transport.run(list(query), timeout_s)
    shown = shlex.join(query)
    if not out.ok:
        why = printable(out.stderr or out.describe(), 160)
        return [Check(alias, CHECK, FAIL, f"{shown}: {why}",
                      f"install {query[0]} on {cap.target}, check gpus[].gpu_index, or set a shed_load_command")]
    plan = power.cap_plan(cap.vendor, power.read_limits(cap.vendor, out.stdout, cap.gpu_index), cap.ratio)
    if plan.before_w is None:
        return [Check(alias, CHECK, FAIL, f"{shown} answered no power limit ({printable(out.stdout, 80)!r})",
                      "check gpus[].gpu_index and the vendor, or set a shed_load_command")]
    if plan.target_w is None:
        rows = [Check(alias, CHECK, WARN, f"{plan.why}: a cap would lower nothing",
                      "set a shed_load_command, or give the GPU a LiteLLM deployment to shed")]
    else:
        setter = shlex.join(power.set_argv(cap.vendor, cap.gpu_index, plan.target_w))
        rows = [Check(alias, CHECK, OK, f"would run {setter}: {plan.why}, read back; put back after the "
                      "cool-down (restore-power-limit)")]  # fmt: skip
    who = transport.run(["id", "-u"], timeout_s)
    uid = who.stdout.strip() if who.ok else ""
    if uid != "0":
        seen = f"uid {printable(uid, 12)}" if uid else printable(who.stderr or who.describe(), 80)
        rows.append(Check(alias, "power cap: root", WARN, f"{query[0]} sets a power limit only as root; commands "
                          f"run as {seen}", "connect as root there (heal.ssh_user / gpus[].ssh_user)"))  # fmt: skip
    return rows


def kfd_checks(transport: Any, cfg: Any, alias: str, timeout_s: float) -> list[Check]:
    """On a host with several AMD GPUs (a ``gpu_index``): whether Rules 2 and 4 can tell which processes use
    this GPU — its KFD ``gpu_id`` (rocm-smi's ``GUID``) and the KFD's process directory (issue 27 item 12)."""
    from gpuheal.core import kfd

    g = cfg.gpu(alias)
    if g.vendor != "amd" or g.gpu_index is None:
        return []
    argv = kfd.guid_argv(g.gpu_index)
    out = transport.run(list(argv), timeout_s)
    gpu_id = kfd.parse_guid(out.stdout, g.gpu_index) if out.ok else None
    if gpu_id is None:
        return [Check(alias, "processes per GPU (KFD)", WARN,
                      f"{shlex.join(argv)} printed no GUID: Rules 2 and 4 cannot tell this GPU's processes from the "
                      "host's other GPUs' (rocm-smi --showpids sums over all of them)",
                      "update rocm-smi (its --showproductname prints GUID), or check gpus[].gpu_index")]  # fmt: skip
    seen = transport.run(["test", "-d", kfd.KFD_PROC], timeout_s)
    if not seen.ok:
        return [Check(alias, "processes per GPU (KFD)", WARN, f"{kfd.KFD_PROC} is not there: Rules 2 and 4 cannot "
                      "tell this GPU's processes from the host's other GPUs'", "load the amdgpu/KFD driver")]
    return [Check(alias, "processes per GPU (KFD)", OK, f"gpu_id {gpu_id}: each process's VRAM on this GPU from "
                  f"{kfd.KFD_PROC}/<pid>/vram_{gpu_id}")]


def config_redirect_checks(transport: Any, cfg: Any, timeout_s: float) -> list[Check]:
    """Rule 1.2 through LiteLLM's config file (``litellm.config_file``), proven read-only where LiteLLM runs:
    the file reads as LiteLLM's config, each GPU has a deployment there to redirect, and its directory
    takes the original's copy and the new file (issue 27 item 7). Nothing is written, nothing restarted."""
    import os

    from gpuheal.config.yamlsafe import load_yaml
    from gpuheal.core import litellm_config as lc
    from gpuheal.errors import ConfigError

    path = cfg.litellm.config_file
    if not path or not cfg.litellm.restart_command or not cfg.litellm.url:
        return []
    out = transport.run(["cat", "--", path], timeout_s)
    if not out.ok:
        return [Check("litellm", "redirect (config.yaml)", FAIL, f"cannot read {path}: "
                      f"{printable(out.stderr or out.describe(), 120)}", "fix litellm.config_file")]
    try:
        doc = load_yaml(out.stdout, path)
    except ConfigError as exc:
        return [Check("litellm", "redirect (config.yaml)", FAIL, printable(exc, 200), "fix litellm.config_file")]
    rows = []
    for g in cfg.gpus:
        other = next((o for o in cfg.gpus if o.alias != g.alias), None)
        plan = lc.redirect(doc, g.endpoint, other.endpoint) if other is not None else "no other GPU"
        rows.append(Check(g.alias, "redirect (config.yaml)", WARN, f"{path}: {plan}", "add its deployment to the "
                          "file, or a redirect_command") if isinstance(plan, str) else  # fmt: skip
                    Check(g.alias, "redirect (config.yaml)", OK, f"{path} sends {', '.join(plan.groups)} here: when "
                          "hot, sent to a cooler GPU, LiteLLM restarted, read back; put back after the cool-down"))
    writable = transport.run(["test", "-w", os.path.dirname(path) or "/"], timeout_s)
    if not writable.ok:
        rows.append(Check("litellm", "redirect (config.yaml)", FAIL, f"{os.path.dirname(path)} is not writable "
                          "where LiteLLM runs", "let gpuheal's user write the config file's directory"))
    return rows
