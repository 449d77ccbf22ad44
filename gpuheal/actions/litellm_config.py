"""Perform a :class:`~gpuheal.core.actions.RewriteLiteLLM` (Rule 1.2 where LiteLLM keeps its models in
``config.yaml``; :mod:`gpuheal.core.litellm_config` decides): read the file where LiteLLM runs, keep the
original beside it (``<file>.gpuheal-orig``, once), write the changed file atomically (``tee`` to
``<file>.gpuheal-new``, then ``mv``), restart LiteLLM, wait for its liveliness, and read ``/v1/model/info``
back — the change counts only when LiteLLM shows the hot GPU's model groups served by the cooler GPU. A
read-back that does not show it puts the original back at once. The restore copies the original back,
restarts, reads back, and removes the copy. The file's content (it holds keys) is never kept in the
audit, the state or an alert: only what was done.
"""

from __future__ import annotations

import shlex
import time
from typing import Any, Protocol, cast

from gpuheal.config.model import Config
from gpuheal.core import litellm_config as lc
from gpuheal.core.actions import CommandOutcome, RewriteLiteLLM, StepResult
from gpuheal.redact import redact

WAIT_EVERY_S = 1.0


class Writer(Protocol):
    """A runner that can feed a command's standard input (the transports' ``input``)."""

    def __call__(self, target: str, argv: list[str], timeout_s: float, input: str | None = None) -> CommandOutcome:
        ...


class _Failed(Exception):
    def __init__(self, why: str, impossible: bool = True) -> None:
        super().__init__(why)
        self.why, self.impossible = why, impossible


def rewrite(step: RewriteLiteLLM, runner: Any, timeout_s: float, secrets: tuple[str, ...], cfg: Config) -> StepResult:
    """Redirect (or put back) through LiteLLM's config file; never raises for what the world does."""
    shown = f"{'ssh ' + step.target + ': ' if step.target != 'local' else ''}rewrite {step.path}; " \
            f"{' '.join(step.restart_argv)}; read back /v1/model/info"
    try:
        note, effect = _put_back(step, runner, timeout_s, cfg) if step.restore else _redirect(step, runner, timeout_s,
                                                                                              cfg)
    except _Failed as failed:
        return StepResult(step.action, [], step.target, ok=False, error=redact(failed.why, secrets), command=shown,
                          output=redact(failed.why, secrets), note=step.note, impossible=failed.impossible)
    return StepResult(step.action, [], step.target, ok=True, rc=0, output=note, note=note, command=shown,
                      effect=effect)  # fmt: skip


def _redirect(step: RewriteLiteLLM, runner: Any, timeout_s: float, cfg: Config) -> tuple[str, dict[str, Any]]:
    if step.to_alias is None or step.to_endpoint is None:
        raise _Failed("no cooler GPU to redirect to: every other GPU has an open thermal issue or is paused")
    key = _admin_key(cfg)
    doc = _read_doc(runner, step.target, step.path, timeout_s)
    plan = lc.redirect(doc, step.hot_endpoint, step.to_endpoint)
    if isinstance(plan, str):
        raise _Failed(f"LiteLLM's {step.path} cannot send this GPU's models elsewhere: {plan}")
    import yaml

    backup = step.path + lc.BACKUP_SUFFIX
    if runner(step.target, ["test", "-e", backup], timeout_s).rc != 0:  # keep the first original, never a later one
        _run(runner, step.target, ["cp", "-p", "--", step.path, backup], timeout_s, f"cannot keep {backup}")
    _write(runner, step.target, step.path, yaml.safe_dump(plan.doc, sort_keys=False), timeout_s)
    payload = _restarted(step, runner, timeout_s, cfg, key)
    if lc.routes(payload, plan.groups, step.to_endpoint) and not lc.routes(payload, plan.groups, step.hot_endpoint):
        groups = ", ".join(plan.groups)
        effect = {"kind": lc.CONFIG_EFFECT, "path": step.path, "groups": list(plan.groups), "to": step.to_alias}
        return f"LiteLLM sends {groups} to {step.to_alias} (config.yaml, LiteLLM restarted, read back)", effect
    _run(runner, step.target, ["cp", "-p", "--", backup, step.path], timeout_s, f"cannot put {backup} back")
    _restarted(step, runner, timeout_s, cfg, key)
    raise _Failed(f"LiteLLM does not show {', '.join(plan.groups)} served by {step.to_alias} after its restart: "
                  "the original file was put back", impossible=False)


def _put_back(step: RewriteLiteLLM, runner: Any, timeout_s: float, cfg: Config) -> tuple[str, dict[str, Any] | None]:
    key = _admin_key(cfg)
    backup = step.path + lc.BACKUP_SUFFIX
    _run(runner, step.target, ["test", "-e", backup], timeout_s, f"the original {backup} is not there")
    _run(runner, step.target, ["cp", "-p", "--", backup, step.path], timeout_s, f"cannot put {backup} back")
    payload = _restarted(step, runner, timeout_s, cfg, key)
    if not lc.serves(payload, step.hot_endpoint):
        raise _Failed(f"LiteLLM does not route to {step.hot_endpoint} again after its restart", impossible=False)
    _run(runner, step.target, ["rm", "-f", "--", backup], timeout_s, f"cannot remove {backup}")
    return "LiteLLM's config file put back; it routes to this GPU again (LiteLLM restarted, read back)", None


def _read_doc(runner: Any, target: str, path: str, timeout_s: float) -> Any:
    from gpuheal.config.yamlsafe import load_yaml
    from gpuheal.errors import ConfigError

    text = _run(runner, target, ["cat", "--", path], timeout_s, f"cannot read {path}").stdout
    try:
        return load_yaml(text or "", path)
    except ConfigError as exc:
        raise _Failed(f"LiteLLM's {path} cannot be read as YAML ({exc})") from None


def _admin_key(cfg: Config) -> str:
    from gpuheal.credentials import env_or_dotenv

    key = env_or_dotenv(cfg.litellm.admin_key_env, cfg.path)
    if not key:
        raise _Failed(f"no LiteLLM admin key (${cfg.litellm.admin_key_env}): the change could not be read back")
    return key


def _run(runner: Any, target: str, argv: list[str], timeout_s: float, why: str) -> CommandOutcome:
    out: CommandOutcome = runner(target, argv, timeout_s)
    if out.error or out.timed_out or out.rc != 0:
        detail = out.error or ("timed out" if out.timed_out else f"exit status {out.rc}")
        raise _Failed(f"{why} ({detail}: {(out.stderr or '').strip()[:160]})", impossible=not out.timed_out)
    return out


def _write(runner: Any, target: str, path: str, text: str, timeout_s: float) -> None:
    """The new file beside the old, then renamed over it: LiteLLM never reads half a file."""
    new = path + lc.NEW_SUFFIX
    try:
        out = cast(Writer, runner)(target, ["tee", "--", new], timeout_s, text)
    except TypeError:  # a runner that cannot feed standard input (a test's)
        raise _Failed("this runner cannot write a file") from None
    if out.error or out.timed_out or out.rc != 0:
        raise _Failed(f"cannot write {new} ({out.error or out.rc})")
    _run(runner, target, ["mv", "-f", "--", new, path], timeout_s, f"cannot replace {path}")


def _restarted(step: RewriteLiteLLM, runner: Any, timeout_s: float, cfg: Config, key: str) -> object:
    """Restart LiteLLM, wait until it is alive (``litellm.reload_wait_s``), then read its deployments."""
    from gpuheal.sources import litellm_admin as la

    _run(runner, step.target, list(step.restart_argv), timeout_s, "LiteLLM's restart_command failed")
    url, deadline = str(cfg.litellm.url), time.monotonic() + cfg.litellm.reload_wait_s
    while la.liveliness(url, min(5.0, cfg.litellm.timeout_s)) is not None:
        if time.monotonic() >= deadline:
            raise _Failed(f"LiteLLM not alive {cfg.litellm.reload_wait_s:g} s after its restart", impossible=False)
        time.sleep(WAIT_EVERY_S)
    payload = la.read_model_info(url, key, float(cfg.litellm.timeout_s) * 2)
    if isinstance(payload, la.AdminProblem):
        raise _Failed(f"LiteLLM's deployments not read back: {payload.line()}", impossible=False)
    return payload


# --------------------------------------------------------------------------- drain first (issue 28 item 2)
def drain(step: RewriteLiteLLM, alias: str, runner: Any, timeout_s: float, secrets: tuple[str, ...],
          cfg: Config) -> StepResult:  # fmt: skip
    """Take ``alias``'s deployments (``step.hot_endpoint``) out of LiteLLM's config file, or put them back
    (``step.restore``); counted only when LiteLLM's ``/v1/model/info`` read back after its restart shows it.
    Never raises for what the world does."""
    shown = describe_drain(step, alias)
    try:
        note = _undrain(step, alias, runner, timeout_s, cfg) if step.restore else _drain(step, alias, runner,
                                                                                          timeout_s, cfg)
    except _Failed as failed:
        return StepResult(step.action, [], step.target, ok=False, error=redact(failed.why, secrets), command=shown,
                          output=redact(failed.why, secrets), note=step.note, impossible=failed.impossible)
    return StepResult(step.action, [], step.target, ok=True, rc=0, output=note, note=note, command=shown)


def describe_drain(step: RewriteLiteLLM, alias: str) -> str:
    """How a drain (or its undoing) is shown: the file, the restart, the read-back (never the file's keys)."""
    where = f"ssh {step.target}: " if step.target != "local" else ""
    return f"{where}rewrite {step.path} ({'put back' if step.restore else 'drain'} {alias}); " \
           f"{shlex.join(step.restart_argv)}; read back /v1/model/info"


def _drain(step: RewriteLiteLLM, alias: str, runner: Any, timeout_s: float, cfg: Config) -> str:
    key = _admin_key(cfg)
    plan = lc.drain(_read_doc(runner, step.target, step.path, timeout_s), step.hot_endpoint)
    if isinstance(plan, str):
        raise _Failed(f"LiteLLM's {step.path} cannot drain {alias}: {plan}")
    import yaml

    backup = step.path + lc.DRAIN_SUFFIX + alias
    if runner(step.target, ["test", "-e", backup], timeout_s).rc != 0:  # an earlier drain's copy has the entries
        _run(runner, step.target, ["cp", "-p", "--", step.path, backup], timeout_s, f"cannot keep {backup}")
    _write(runner, step.target, step.path, yaml.safe_dump(plan.doc, sort_keys=False), timeout_s)
    payload = _restarted(step, runner, timeout_s, cfg, key)
    if not lc.serves(payload, step.hot_endpoint) and all(lc.routes(payload, (g,), step.hot_endpoint) is False
                                                         for g in plan.groups):  # fmt: skip
        return f"LiteLLM routes {', '.join(plan.groups)} to the others only (config.yaml, LiteLLM restarted, read back)"
    _run(runner, step.target, ["cp", "-p", "--", backup, step.path], timeout_s, f"cannot put {backup} back")
    _restarted(step, runner, timeout_s, cfg, key)
    raise _Failed(f"LiteLLM does not show {alias} out of {', '.join(plan.groups)} (with the others serving them) "
                  "after its restart: the file was put back", impossible=False)


def _undrain(step: RewriteLiteLLM, alias: str, runner: Any, timeout_s: float, cfg: Config) -> str:
    key = _admin_key(cfg)
    backup = step.path + lc.DRAIN_SUFFIX + alias
    original = _read_doc(runner, step.target, backup, timeout_s)
    merged = lc.undrain(_read_doc(runner, step.target, step.path, timeout_s), original, step.hot_endpoint)
    if isinstance(merged, str):
        raise _Failed(f"LiteLLM's {step.path}: {merged}")
    if merged == original:  # nothing else changed meanwhile: the operator's file comes back byte for byte
        _run(runner, step.target, ["cp", "-p", "--", backup, step.path], timeout_s, f"cannot put {backup} back")
    else:
        import yaml

        _write(runner, step.target, step.path, yaml.safe_dump(merged, sort_keys=False), timeout_s)
    payload = _restarted(step, runner, timeout_s, cfg, key)
    if not lc.serves(payload, step.hot_endpoint):
        raise _Failed(f"LiteLLM does not route to {alias} again after its restart", impossible=False)
    _run(runner, step.target, ["rm", "-f", "--", backup], timeout_s, f"cannot remove {backup}")
    return f"{alias} is back in LiteLLM's routing (config.yaml, LiteLLM restarted, read back)"
