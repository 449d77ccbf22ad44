"""What ``heal --apply`` touches the world with, built from the config: the command runner (SSH
through one transport pool, or local), the LiteLLM admin client and the restart verifier.

The heal step holds one :class:`Effects` per run and closes it at the end; a test hands
:class:`gpuheal.steps.heal.Heal` its own ``runner`` / ``verify`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuheal.actions.perform import LiteLLMCall, perform, values_for
from gpuheal.actions.runner import Runner
from gpuheal.clock import Clock
from gpuheal.config.model import SSH_PORT, Config
from gpuheal.core.actions import Action, CommandOutcome, LiteLLMUpdate, StepResult

if TYPE_CHECKING:
    from gpuheal.transport import Target, TransportPool

Verifier = Callable[[str], dict[str, Any]]  # (alias) -> a verdict document (a restart's, LiteLLM's health)

__all__ = ["Effects", "Runner", "Verifier"]


class Effects:
    def __init__(
        self, cfg: Config, runner: Runner | None = None, verify: Verifier | None = None,
        litellm: LiteLLMCall | None = None, model_health: Verifier | None = None, clock: Clock | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock  # the run's (None: real seconds): a restart's readiness wait counts on it
        self.model_health: Verifier = model_health or self._model_health
        self._pool: TransportPool | None = None
        self.run: Runner = runner or self._run
        self._custom_runner = runner is not None
        self.verify: Verifier = verify or self._verify
        self.litellm: LiteLLMCall = litellm or self._litellm
        self._targets: dict[str, Target] | None = None

    def perform(self, step: Action, alias: str, secrets: tuple[str, ...]) -> StepResult:
        """Perform one action for ``alias`` outside a plan item (``restore-load``)."""
        timeout_s = self.cfg.heal.command_timeout_s
        return perform(step, values_for(alias, self.cfg), self.run, self.litellm, timeout_s, secrets, self.cfg)

    def transports(self) -> TransportPool:
        """The run's :class:`~gpuheal.transport.TransportPool`: one SSH connection per host per run,
        shared by the smi sensing of ``check`` (no gpu-monitor, issue 12) and every action."""
        from gpuheal.transport import TransportPool

        if self._pool is None:
            self._pool = TransportPool.from_config(self.cfg.heal)
        return self._pool

    def sensing(self) -> Any:
        """What the poll's smi sensing runs through (no gpu-monitor, or its Rule 7.3 fallback): the
        run's transport pool, or — when a test handed :class:`Heal` its own runner — that runner, so
        sensing and actions go through one door."""
        if not self._custom_runner:
            return self.transports()
        return _RunnerPool(self.run)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _run(self, target: str, argv: list[str], timeout_s: float, input: str | None = None) -> CommandOutcome:
        from gpuheal.transport import Target

        heal = self.cfg.heal
        pool = self.transports()
        if self._targets is None:
            self._targets = {g.host: Target.for_gpu(g, heal) for g in self.cfg.gpus if g.transport == "ssh"}
        if target == "local":
            where = Target("local")
        else:
            where = self._targets.get(target) or Target("ssh", target, SSH_PORT, heal.ssh_user)
        return pool.get(where).run(argv, timeout_s, input=input)

    def _litellm(self, update: LiteLLMUpdate, timeout_s: float) -> CommandOutcome:
        """One built-in load action through LiteLLM's admin API (issue 11): read the deployment,
        change weight or rpm, done only when a read-back shows it. The answer has a command's
        shape (rc, stdout, stderr, error, timed_out) plus ``effect`` (what restore puts back) and
        ``impossible`` (LiteLLM's setup rules the built-in path out)."""
        from gpuheal.credentials import env_or_dotenv
        from gpuheal.sources.litellm_admin import run_update

        lite, heal = self.cfg.litellm, self.cfg.heal
        admin_key = env_or_dotenv(lite.admin_key_env, self.cfg.path)
        return run_update(
            str(lite.url),
            admin_key,
            update.action,
            update.model_id,
            update.field,
            update.value,
            shed_ratio=heal.shed_rpm_ratio,
            redirect_rpm=heal.redirect_rpm,
            deadline_s=min(timeout_s, float(lite.timeout_s) * 2),
        )

    def preview(self, update: LiteLLMUpdate) -> str:
        """For a dry run: what the built-in load action would do, read now from LiteLLM (GET only,
        changes nothing) — the field and values, or why it would fail (issue 11: say why at once)."""
        from gpuheal.credentials import env_or_dotenv
        from gpuheal.sources import litellm_admin as la

        lite, heal = self.cfg.litellm, self.cfg.heal
        key = env_or_dotenv(lite.admin_key_env, self.cfg.path)
        dep = la.read_deployment(str(lite.url), key, update.model_id, float(lite.timeout_s))
        plan = dep if isinstance(dep, la.AdminProblem) else la.target_value(
            dep, update.action, heal.shed_rpm_ratio, heal.redirect_rpm
        )
        if isinstance(plan, la.AdminProblem):
            return f"would fail: {plan.line()}"
        assert not isinstance(dep, la.AdminProblem)
        field, value = plan
        return f"would set {field} {la.num_text(dep.value(field))} -> {la.num_text(value)} (read now from LiteLLM)"

    def _verify(self, alias: str) -> dict[str, Any]:
        from gpuheal.actions.execute import wait_ready_then_complete

        g = self.cfg.gpu(alias)
        heal = self.cfg.heal
        return wait_ready_then_complete(
            g.endpoint, self.cfg.litellm.api_key, heal.reload_wait_s, heal.verify_timeout_s, clock=self.clock
        )

    def prove(self, alias: str) -> dict[str, Any]:
        """The spec's "verify with benchmark inference test before declaring resolved" (issue 20): a
        real completion on the GPU's llama-server, for every fix (shedding, power limit, restarts)."""
        from gpuheal.sources.llama_server import benchmark_inference

        g = self.cfg.gpu(alias)
        out = benchmark_inference(g.endpoint, self.cfg.litellm.api_key or None, n_predict=4,
                                  deadline_s=self.cfg.heal.verify_timeout_s, warmup=False, props=False)
        return {"ok": bool(out.ok), "completion_s": round(out.elapsed_s, 2) if out.ok else None,
                "gen_tok_s": out.gen_tok_s, "error": out.error}

    def _model_health(self, alias: str) -> dict[str, Any]:
        """Rule 6's verify: LiteLLM's own health check of this GPU's deployments — ``gpus[].litellm_model_id``,
        else each deployment LiteLLM's ``/model/info`` lists with an ``api_base`` on the GPU's endpoint.
        unhealthy when one is, healthy when all are; a LiteLLM that is not configured, does not answer or
        lists no deployment there is "not known" (never "passed": the caller says what that means)."""
        from gpuheal.credentials import env_or_dotenv
        from gpuheal.sources.litellm_admin import model_health

        g, lite = self.cfg.gpu(alias), self.cfg.litellm
        if not lite.url:
            return {"litellm": "not configured", "litellm_detail": "no litellm.url"}
        key = env_or_dotenv(lite.admin_key_env, self.cfg.path)
        ids = (g.litellm_model_id,) if g.litellm_model_id else self._deployments_at(g.endpoint, key)
        if isinstance(ids, str):
            return {"litellm": "not known", "litellm_detail": ids}
        seen = [model_health(str(lite.url), key, mid, g.endpoint, self.cfg.heal.verify_timeout_s) for mid in ids]
        worst = (next((h for h in seen if h.verdict == "unhealthy"), None)
                 or next((h for h in seen if h.verdict != "healthy"), None) or seen[0])  # fmt: skip
        out: dict[str, Any] = {"litellm": worst.verdict, "litellm_model_ids": list(ids)}
        return {**out, "litellm_detail": worst.detail} if worst.detail else out

    def _deployments_at(self, endpoint: str, admin_key: str | None) -> tuple[str, ...] | str:
        """The model ids of the deployments LiteLLM routes to ``endpoint`` (at most 8), or why not known."""
        from gpuheal.core.topology import model_ids_at, read_routes
        from gpuheal.sources.litellm_admin import AdminProblem, read_model_info

        lite = self.cfg.litellm
        payload = read_model_info(str(lite.url), admin_key, float(lite.timeout_s))
        if isinstance(payload, AdminProblem):
            return payload.line()
        routes = read_routes(payload)
        if isinstance(routes, str):
            return routes
        ids = model_ids_at(routes, endpoint)
        if not ids:
            return f"LiteLLM's /v1/model/info lists no deployment at {endpoint} ({len(routes)} deployments)"
        return ids[:8]


class _RunnerPool:
    """``pool.get(target).run(argv, timeout_s)`` over a ``runner(target, argv, timeout_s)``."""

    def __init__(self, run: Runner) -> None:
        self._run = run

    def get(self, target: Target) -> _OnTarget:
        return _OnTarget(self._run, "local" if target.kind == "local" else str(target.host))


class _OnTarget:
    def __init__(self, run: Runner, where: str) -> None:
        self._run, self._where = run, where

    def run(self, argv: list[str], timeout_s: float) -> CommandOutcome:
        return self._run(self._where, argv, timeout_s)
