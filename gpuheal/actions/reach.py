"""Rule 6.1's process check asked of hosts before heal's in-run confirmation (issue 29 item 5): which hosts do
not answer over SSH at all (:func:`gpuheal.core.confirm.host_silent`). The judgement is the rule's
(:func:`gpuheal.rules.host_unreachable.reach.ask_hosts`); this is its IO."""

from __future__ import annotations

from collections.abc import Collection

from gpuheal.config.model import Config
from gpuheal.core.confirm import host_silent
from gpuheal.rules.host_unreachable import look


def silent_hosts(cfg: Config, aliases: Collection[str]) -> set[str]:
    """The GPUs of ``aliases`` whose host does not answer over SSH (:func:`gpuheal.core.confirm.host_silent`),
    asked with Rule 6.1's own process check (``systemctl is-active UNIT`` or ``pgrep``), once per host, the
    hosts at once (one connect timeout, ``heal.ssh_connect_timeout_s``, at most). A GPU on this machine
    (``transport: local``) is never asked: its host is here."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuheal.transport import Target, TransportPool, expand

    by_host: dict[Target, list[str]] = {}
    for alias in aliases:
        g = cfg.gpu(alias)
        if g.transport == "ssh":
            by_host.setdefault(Target.for_gpu(g, cfg.heal), []).append(alias)
    if not by_host:
        return set()

    def silent(target: Target, alias: str) -> bool:
        g = cfg.gpu(alias)
        try:
            argv = expand(look.check_argv(g.command("restart_command")), alias=alias, host=g.host,
                          endpoint=g.endpoint)  # fmt: skip
            outcome = pool.get(target).run(argv, cfg.heal.ssh_connect_timeout_s)
        except Exception:  # noqa: BLE001 — a check that trips is "not known": the confirmation goes on
            return False
        return host_silent(outcome.error, outcome.timed_out)

    with TransportPool.from_config(cfg.heal) as pool, ThreadPoolExecutor(min(8, len(by_host))) as threads:
        said = dict(zip(by_host, threads.map(lambda t: silent(t, by_host[t][0]), by_host), strict=True))
    return {a for target, aliases_of in by_host.items() if said[target] for a in aliases_of}
