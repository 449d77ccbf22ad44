"""Rule 2 (VRAM leak): least squares over 6 h ≥ the GPU's tier (300 / 300 / 200 MB/h), enough samples
and span, the window restarted after a reload or a restart."""

from __future__ import annotations

from datetime import timedelta

from gpuheal import benchdata
from gpuheal.core.view import FleetView, Restarts
from gpuheal.rules import vram_leak
from gpuheal.state.history import History

try:
    from tests.series import START, fleet_config, fleet_trace, polls, run
except ImportError:
    from series import START, fleet_config, fleet_trace, polls, run

CFG = fleet_config()
DENSE, LIGHT, STRIX = "gpu-dense", "gpu-light", "strix-moe"
FIRST_FULL_WINDOW = 345  # min_span_h 5.75 h of per-minute samples


def go(alias: str, vram: str, cfg=CFG, **fields):
    return run(cfg, fleet_trace(cfg, {alias: {"vram_used_mb": vram, **fields}}))


def test_leak_fires_once_the_window_is_long_enough():
    r = go(DENSE, "10000+6x400")  # 360 MB/h on a 300 MB/h GPU
    assert polls(r, DENSE, "vram-leak") == [FIRST_FULL_WINDOW]
    issue = next(i for i in r.open_at_end if i.issue == "vram-leak")
    assert issue.severity == "warning"
    d = issue.detected
    assert abs(d["rate_mb_per_hour"] - 360) < 1 and d["threshold_mb_per_hour"] == 300
    assert d["samples"] == 361 and d["span_h"] == 6.0
    assert d["projected_full_in_hours"] == round((24576 - (10000 + 6 * 400)) / d["rate_mb_per_hour"], 2)


def test_250_mb_per_hour_on_a_300_mb_per_hour_gpu_never_fires():
    r = go(DENSE, "10000+4.1667x420")
    assert polls(r, DENSE, "vram-leak", "pending") == []


def test_250_mb_per_hour_on_strix_200_mb_per_hour_fires():
    r = go(STRIX, "10000+4.1667x400")
    assert polls(r, STRIX, "vram-leak") == [FIRST_FULL_WINDOW]


def test_a_young_window_is_not_known():
    r = go(DENSE, "10000+30x300")  # steep, but only 5 h of samples
    assert polls(r, DENSE, "vram-leak", "pending") == []


def test_too_few_samples_is_not_known():
    # the monitor knew VRAM only every 20th poll: 19 samples in the window < min_samples 30
    series = " ".join((str(10000 + 6 * i) if i % 20 == 0 else "_") for i in range(400))
    r = go(DENSE, series)
    assert polls(r, DENSE, "vram-leak", "pending") == []


def test_missing_samples_do_not_stop_a_real_leak():
    series = " ".join((str(10000 + 6 * i) if i % 3 else "_") for i in range(400))
    r = go(DENSE, series)
    assert polls(r, DENSE, "vram-leak") == [FIRST_FULL_WINDOW + 1]  # poll 0 was missing: span starts at 1


def test_an_external_reload_restarts_the_window():
    # flat at 10 GB, a reload (drop to 2 GB), then a bigger model flat at 12 GB: the step is not a leak
    series = "10000x199 2000 12000x200"
    r = go(DENSE, series)
    assert polls(r, DENSE, "vram-leak", "pending") == []


def test_a_leak_across_a_reload_needs_a_fresh_window():
    r = go(DENSE, "10000+6x199 4000 10000+6x300")  # the reload at poll 200
    assert polls(r, DENSE, "vram-leak", "pending") == []
    r = go(DENSE, "10000+6x199 4000 10000+6x350")
    assert polls(r, DENSE, "vram-leak") == [201 + FIRST_FULL_WINDOW]


def test_one_step_up_is_not_a_sustained_leak():
    cfg = fleet_config(rules={"vram-leak": {"reload_jump_mb": 5000}})
    r = go(DENSE, "10000x180 11600x200", cfg=cfg)  # LS slope ~ 400 MB/h, both halves flat
    assert polls(r, DENSE, "vram-leak", "pending") == []


def test_leak_resolves_when_growth_stops():
    r = go(DENSE, "10000+6x350 12100x400")
    assert polls(r, DENSE, "vram-leak") == [FIRST_FULL_WINDOW]
    resolved = polls(r, DENSE, "vram-leak", "resolved")
    assert len(resolved) == 1 and FIRST_FULL_WINDOW < resolved[0] < FIRST_FULL_WINDOW + 360


def test_monitor_down_freezes_the_leak_issue():
    # 400 polls of leak, then the monitor goes away: the issue neither resolves nor re-fires
    r = run(CFG, fleet_trace(CFG, {DENSE: {"vram_used_mb": "10000+6x400 _x10"}}, monitor="1x400 0x10"))
    assert polls(r, DENSE, "vram-leak") == [FIRST_FULL_WINDOW]
    assert polls(r, DENSE, "vram-leak", "resolved") == []
    assert [i.issue for i in r.open_at_end] == ["data-source-unreachable"]  # hidden, not healthy


def test_threshold_from_vram_leak_mb_per_hour():
    data = [{"alias": DENSE, "host": "ct8", "endpoint": "http://127.0.0.1:1", "transport": "local",
             "vram_leak_mb_per_hour": 400, "vram_total_mb": 24576}]
    cfg = fleet_config(gpus=data)
    assert polls(go(DENSE, "10000+6x400", cfg=cfg), DENSE, "vram-leak", "pending") == []


def test_window_starts_after_heal_restart_and_grace():
    cfg = fleet_config()
    history = History()
    for obs in fleet_trace(cfg, {DENSE: {"vram_used_mb": "10000+6x400"}}):
        history.add(obs, cfg.aliases)
    now_s = (START + timedelta(minutes=400)).timestamp()
    restart = (START + timedelta(minutes=100)).timestamp()
    view = FleetView(cfg, now_s, None, history, benchdata.empty(), {}, Restarts({DENSE: restart}, 120))
    fit = view.vram_fit(DENSE, 6 * 3600, 1024)
    assert fit is not None and fit.first_t >= restart + 120
    assert vram_leak.detect(view, DENSE, view.rule_params(vram_leak.ID, vram_leak.Params, DENSE)) is None  # young window
