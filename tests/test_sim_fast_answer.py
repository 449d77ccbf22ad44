"""The llama-server look-alike's shortcut (issue 29: ``gpuheal.sim.servers.llama_answer`` answers a poll's
``/health``, ``/props`` and ``/metrics`` without a handler object) is the handler, byte for byte: the same
bytes for the same request and world, the same world after it (a scrape resets the throughput window),
over many generated requests, good and bad, and every fault; and it leaves to the handler what it does
not know (another method or route, a malformed request, a fault that may never answer)."""

from __future__ import annotations

import random

import pytest

from gpuheal.sim import Scenario, SimFleet
from gpuheal.sim.inprocess import InProcessNetwork, Site
from gpuheal.sim.scenario import GPU_FAULTS
from gpuheal.sim.servers import llama_answer

GPU = {"vendor": "nvidia", "vram_total_mb": 24576, "vram_used_mb": 12000, "temp_c": 55, "util_pct": 50,
       "power_w": 200, "power_limit_w": 300, "power_default_limit_w": 350, "power_max_limit_w": 400,
       "baseline_tok_s": 60.0, "requests_60s": 20, "parallel": 2}
KEYS = ["not-needed", "sk-a,sk-b", None]
METHODS = ["GET", "GET", "GET", "HEAD", "POST", "OPTIONS", "PUT", "get", "BREW", ""]
PATHS = ["/health", "/v1/health", "/props", "/metrics", "/metrics/", "/props?x=1", "/health#f", "//metrics",
         "/slots", "/models", "/v1/models", "/", "", "/nope", "http://h/props", "http://[::1/props", "/p%72ops",
         "/metrics?fail_on_no_slot=1", "*", "/" + "x" * 3000]
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/1.9", "HTTP/2.0", "HTTP/0.9", "http/1.1", ""]
AUTH = [None, "Bearer not-needed", "bearer not-needed", "Bearer  not-needed ", "not-needed", "Bearer sk-a",
        "Bearer sk-b", "Bearer sk-c", "Bearer ", "Basic abc", "Bearer sk-a,sk-b", "\u00e9"]
XKEY = [None, "sk-a", "not-needed", " sk-b ", "", "nope"]


def _scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    gpus = []
    for i, fault in enumerate(GPU_FAULTS):
        gpu = {**GPU, "alias": f"g-{i}", "host": f"h{i}", "fault": fault, "api_key": rng.choice(KEYS),
               "metrics": rng.random() > 0.2, "busy_slots": rng.choice([0, 1, 2, 5]), "queued": rng.choice([0, 3])}
        gpus.append(gpu)
    return Scenario.from_dict({"name": "fast", "reload_s": 0, "gpus": gpus,
                               "ports": {"monitor": 0, "litellm": 0, "control": 0, "gpus_from": 0}})


def _request(rng: random.Random) -> bytes:
    if rng.random() < 0.05:
        return rng.choice([b"", b"GET /health HTTP/1.1\r\n", b"\r\n\r\n", b"GET /health\r\n\r\n",
                           b"GET /health HTTP/1.1\r\nno colon\r\n\r\n", bytes(rng.randrange(256) for _ in range(40))])
    if rng.random() < 0.5:  # what a poll asks, with any headers
        line = f"GET {rng.choice(PATHS[:8])} {rng.choice(VERSIONS[:3])}"
    else:
        line = f"{rng.choice(METHODS)} {rng.choice(PATHS)} {rng.choice(VERSIONS)}"
    lines = [line, "Host: 127.0.0.1:20003"]
    auth, xkey = rng.choice(AUTH), rng.choice(XKEY)
    if auth is not None:
        lines.append(f"{rng.choice(['Authorization', 'authorization'])}: {auth}")
    if xkey is not None:
        lines.append(f"X-Api-Key: {xkey}")
    if rng.random() < 0.2:
        lines.append(f"Authorization: {rng.choice(AUTH[1:])}")  # a repeated header: the first counts
    body = b""
    if rng.random() < 0.2:
        body = rng.choice([b"", b"{}", b"x" * 10])
        lines.append(f"Content-Length: {rng.choice([len(body), 'abc', -1, 10**9])}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _networks(seed: int) -> tuple[SimFleet, SimFleet, InProcessNetwork, InProcessNetwork]:
    fast_fleet = SimFleet(_scenario(seed), serve="in-process")
    slow_fleet = SimFleet(_scenario(seed), serve="in-process")
    fast_fleet.start()
    slow_fleet.start()
    for a, g in slow_fleet.world.gpus.items():  # the process's start is read off the monotonic clock
        g.process_start_us = fast_fleet.world.gpus[a].process_start_us
    fast, slow = fast_fleet.network(), slow_fleet.network()
    for site in slow.sites.values():
        site.fast = None
    return fast_fleet, slow_fleet, fast, slow


def _window(fleet: SimFleet) -> list[tuple[float, ...]]:
    return [(g.window_tokens, g.window_seconds, g.window_prompt_tokens, g.window_prompt_seconds, g.hung_requests,
             g.inflight, g.requests_served) for g in fleet.world.gpus.values()]


def _plain(answer: object) -> object:
    """An answer, with a refused connection as its type and arguments (exceptions compare by identity)."""
    return (type(answer), answer.args) if isinstance(answer, OSError) else answer


def _counted(shortcut, fleet: SimFleet, hits: list[int]):
    """``shortcut``, counting its answers and checking that what it leaves to the handler it left untouched."""

    def counted(request: bytes) -> bytes | None:
        before = _window(fleet)
        out = shortcut(request)
        if out is None:
            assert _window(fleet) == before
        else:
            hits.append(1)
        return out

    return counted


@pytest.mark.parametrize("seed", range(6))
def test_the_shortcut_answers_what_the_handler_answers(seed):
    rng = random.Random(seed)
    fast_fleet, slow_fleet, fast, slow = _networks(seed)
    try:
        llama_sites = [addr for addr, site in fast.sites.items() if site.fast is not None]
        assert len(llama_sites) == len(GPU_FAULTS)
        hits: list[int] = []
        for addr in llama_sites:
            fast.sites[addr].fast = _counted(fast.sites[addr].fast, fast_fleet, hits)
        for step in range(1500):
            if step % 50 == 0:
                for fleet in (fast_fleet, slow_fleet):
                    fleet.advance(7.5)
            if step % 40 == 0:  # some tokens through the window, so that a scrape has a window to reset
                post = (b"POST /completion HTTP/1.1\r\nAuthorization: Bearer not-needed\r\nContent-Length: 30\r\n\r\n"
                        b'{"prompt": "a b c", "n_predict": 8}')
                for addr in llama_sites:
                    assert _plain(fast.answer(*addr, post)) == _plain(slow.answer(*addr, post))
            addr = rng.choice(llama_sites)
            request = _request(rng)
            try:
                mine = fast.answer(*addr, request)
            except ValueError as exc:  # an unsplittable URL: the handler raises it, either way
                with pytest.raises(type(exc)):
                    slow.answer(*addr, request)
                continue
            assert _plain(mine) == _plain(slow.answer(*addr, request)), request
            assert _window(fast_fleet) == _window(slow_fleet)
        shortcut = sum(hits)
        assert shortcut > 300  # the generator reaches the shortcut, not only the handler
        assert fast.requests == slow.requests
    finally:
        fast_fleet.stop()
        slow_fleet.stop()


def test_what_the_shortcut_leaves_to_the_handler():
    fleet = SimFleet(_scenario(0), serve="in-process")
    fleet.start()
    try:
        world = fleet.world
        ok = next(a for a, g in world.gpus.items() if g.fault == "none")
        good = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        assert llama_answer(world, ok, good) is not None
        for request in (b"POST /health HTTP/1.1\r\n\r\n", b"GET /slots HTTP/1.1\r\n\r\n", b"GET /health HTTP/1.1\r\n",
                        b"GET http://[::1/props HTTP/1.1\r\n\r\n", b"HEAD /health HTTP/1.1\r\n\r\n", b"\xff" * 64):
            assert llama_answer(world, ok, request) is None, request
        for fault in ("hang", "unreachable", "taskloop-hang"):
            alias = next(a for a, g in world.gpus.items() if g.fault == fault)
            assert llama_answer(world, alias, good) is None
    finally:
        fleet.stop()


def test_a_verbose_fleet_logs_every_request_through_the_handler():
    for verbose in (True, False):
        fleet = SimFleet(_scenario(1), serve="in-process", verbose=verbose)
        fleet.start()
        try:
            sites = list(fleet.network().sites.values())
        finally:
            fleet.stop()
        assert len(sites) == len(GPU_FAULTS) + 2 and all(isinstance(site, Site) for site in sites)
        assert sum(site.fast is not None for site in sites) == (0 if verbose else len(GPU_FAULTS))
