"""``sources.http.workers``: the poll's calls that wait on the network at once run on threads; on an installed
in-process network (tests, the chaos week) nothing waits, so they run in the calling thread, each when
submitted, their outcomes (a value or an exception) held by their futures as a thread's would be (issue 29)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuheal.sim.inprocess import InProcessNetwork
from gpuheal.sources import http


def _calls(pool) -> tuple[list[int], object, object]:
    seen: list[int] = []

    def ok(x, *, y):
        seen.append(threading.get_ident())
        return x + y

    def boom():
        seen.append(threading.get_ident())
        raise ValueError("bad answer")

    with pool as p:
        got = p.submit(ok, 1, y=2)
        failed = p.submit(boom)
        mapped = list(p.map(lambda a, b: a * b, [1, 2, 3], [4, 5, 6]))
    assert mapped == [4, 10, 18]
    return seen, got, failed


def test_on_an_in_process_network_the_calls_run_in_this_thread_at_once():
    with http.use_network(InProcessNetwork()):
        pool = http.workers(4, "probe")
        assert not isinstance(pool, ThreadPoolExecutor)
        seen, got, failed = _calls(pool)
    assert seen == [threading.get_ident()] * 2
    assert got.done() and got.result() == 3
    with pytest.raises(ValueError, match="bad answer"):
        failed.result()


def test_over_sockets_the_calls_run_on_threads():
    pool = http.workers(4, "probe")
    assert isinstance(pool, ThreadPoolExecutor)
    seen, got, failed = _calls(pool)
    assert threading.get_ident() not in seen and got.result() == 3
    with pytest.raises(ValueError, match="bad answer"):
        failed.result()


def test_a_keyboard_interrupt_is_not_held_for_later():
    def stop():
        raise KeyboardInterrupt

    with http.use_network(InProcessNetwork()), pytest.raises(KeyboardInterrupt), http.workers(1, "x") as pool:
        pool.submit(stop)
