"""The weekly report fits Zulip at any fleet size (issue 21 point 6): at 3, 100 and 1,000 GPUs the
summary on stdout is within 10,000 characters. Every GPU has its row while they all fit (issue 27
item 17: the spec's per-GPU trend), regressions first; past that, rows for the GPUs that moved and
one line for the steady ones. ``--full`` has every row, and ``--send --full`` posts the summary and
then the whole table split into messages that each arrive whole at a loopback Zulip."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuheal import benchdata
from gpuheal.render import weekly
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import report

try:
    from tests.zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike, config_dict, runtime, seed
except ImportError:
    from zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike, config_dict, runtime, seed

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
LIMIT = 10_000
HOSTILE = "rack|7*_`@**all**`" + "x" * 60  # Markdown specials, longer than a cell's 64 characters


def alias(i: int, prefix: str = "gpu-") -> str:
    return f"{prefix}{i:04d}"


def week_mean(i: int, regress_all: bool) -> float:
    """This week's tok/s against 100 last week: every 10th GPU regressed, every 10th + 1 improved."""
    if regress_all or i % 10 == 0:
        return 80.0
    return 120.0 if i % 10 == 1 else 101.0


def bench_for(n: int, regress_all: bool = False, prefix: str = "gpu-") -> dict:
    data = benchdata.empty()
    end_s = NOW.timestamp()
    for i in range(n):
        for k in range(28, 0, -1):  # two results a day over two weeks, oldest first
            at = end_s - k * 43200 + 600
            tok = 100.0 if k > 14 else week_mean(i, regress_all)
            benchdata.add_result(data, alias(i, prefix), {"at": at, "gen_tok_s": tok, "ok": True})
    return data


def doc_for(n: int, regress_all: bool = False, prefix: str = "gpu-") -> dict:
    aliases = [alias(i, prefix) for i in range(n)]
    return weekly.build(aliases, {a: None for a in aliases}, bench_for(n, regress_all, prefix), [], NOW)


def row_of(text: str, gpu: str) -> bool:
    return any(line.startswith(f"| {gpu} ") for line in text.splitlines())


def table_rows(text: str) -> list[str]:
    return [line.split(" ")[1] for line in text.splitlines() if line.startswith("| ") and "`" in line]


@pytest.mark.parametrize("n", [3, 100])
def test_every_gpu_has_its_row_while_they_fit_regressions_first(n):
    doc = doc_for(n)
    text = weekly.markdown(doc, limit=LIMIT)
    assert len(text) <= LIMIT
    assert "steady" not in text
    rows = table_rows(text)
    assert sorted(rows) == sorted(g["gpu"] for g in doc["gpus"])
    regressed = [g["gpu"] for g in doc["gpus"] if g["regression"]]
    assert rows[: len(regressed)] == sorted(regressed)  # regressions first
    moved = [g["gpu"] for g in doc["gpus"] if abs(g["change_pct"]) > weekly.STEADY_PCT]
    assert set(rows[: len(moved)]) == set(moved)  # then the other moves, the steady GPUs last


def test_summary_past_the_limit_folds_only_the_steady_gpus():
    doc = doc_for(1000)
    text = weekly.markdown(doc, limit=LIMIT)
    assert len(text) <= LIMIT
    moved = [g["gpu"] for g in doc["gpus"] if abs(g["change_pct"]) > weekly.STEADY_PCT]
    steady = 1000 - len(moved)
    assert f"{steady} GPUs steady (±5 %)" in text
    assert not any(row_of(text, g["gpu"]) for g in doc["gpus"] if g["gpu"] not in moved)
    regressed = [g["gpu"] for g in doc["gpus"] if g["regression"]]
    assert all(row_of(text, g) for g in regressed)  # regressions come first
    shown = sum(row_of(text, g) for g in moved)
    assert shown < len(moved) and f"… and {len(moved) - shown} more GPUs" in text


def test_the_fold_starts_exactly_where_every_row_no_longer_fits():
    """The largest fleet shown whole fills the message to within one row; one GPU more is folded,
    and both stay within the limit (the fold is not a habit kicking in early)."""
    n = 100
    while "steady" not in weekly.markdown(doc_for(n + 1), limit=LIMIT):
        n += 1
    whole, folded = weekly.markdown(doc_for(n), limit=LIMIT), weekly.markdown(doc_for(n + 1), limit=LIMIT)
    row = max(len(line) for line in whole.splitlines() if line.startswith("| gpu-"))
    assert len(table_rows(whole)) == n and LIMIT - row - 3 < len(whole) <= LIMIT
    assert len(folded) <= LIMIT and len(table_rows(folded)) < n + 1


def test_summary_fits_when_every_gpu_regressed_with_hostile_names():
    doc = doc_for(1000, regress_all=True, prefix=HOSTILE)
    text = weekly.markdown(doc, limit=LIMIT)
    assert len(text) <= LIMIT
    assert "@**all**" not in text  # escaped: no mention
    assert "and 990 more GPUs regressed" in text


def test_full_has_every_row_and_its_chunks_each_fit():
    doc = doc_for(1000)
    full = weekly.markdown(doc, full=True, limit=LIMIT)
    assert len(full) > LIMIT and all(row_of(full, g["gpu"]) for g in doc["gpus"])
    chunks = weekly.table_chunks(doc, limit=LIMIT)
    assert len(chunks) > 1 and all(len(c) <= LIMIT for c in chunks)
    rows = [line for c in chunks for line in c.splitlines() if line.startswith("| gpu-")]
    assert sorted(r.split(" ")[1] for r in rows) == sorted(g["gpu"] for g in doc["gpus"])


def _config(n: int, site: str) -> dict:
    gpus = [{"alias": alias(i), "host": f"node{i:04d}", "endpoint": "http://127.0.0.1:9"} for i in range(n)]
    return config_dict(site, gpus=gpus)


def _send(tmp_path, monkeypatch, n: int, full: bool):
    monkeypatch.setenv("ZULIP_EMAIL", DEFAULT_EMAIL)
    monkeypatch.setenv("ZULIP_API_KEY", DEFAULT_KEY)
    monkeypatch.chdir(tmp_path)
    state = tmp_path / "state"
    seed(state, files.BENCH, bench_for(n))
    with ZulipLookalike() as srv:
        rt = runtime(_config(n, srv.url), state, NOW)
        with StateDir(state) as store:
            result = report.command(rt, store, weekly=True, send=True, full=full)
        return result, list(srv.messages)


def test_send_posts_the_summary_whole(tmp_path, monkeypatch):
    result, messages = _send(tmp_path, monkeypatch, 1000, full=False)
    assert result.exit_code == 0 and len(messages) == 1
    assert messages[0]["content"] == result.document["markdown"].strip()


def test_send_full_splits_the_table_across_messages_that_arrive_whole(tmp_path, monkeypatch):
    result, messages = _send(tmp_path, monkeypatch, 1000, full=True)
    assert result.exit_code == 0
    doc = result.document
    chunks = weekly.table_chunks(doc, limit=LIMIT)
    assert [m["content"] for m in messages] == [doc["markdown"].strip()] + chunks
    assert all(len(m["content"]) <= LIMIT for m in messages)
    assert len(doc["sent_parts"]) == len(messages)
