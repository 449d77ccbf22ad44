"""Human output of ``gpuheal trend``: one row per GPU with unicode sparklines (VRAM over the fit
window, temperature over the last hour, each shortened to the history there is), the rate against
the GPU's leak threshold, the projection to full, the fit's samples and span, and the temperature
rise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuheal.core.trend import sparkline
from gpuheal.render.human import clean, fmt_num, print_line, print_table

if TYPE_CHECKING:
    from gpuheal.config.model import Config
    from gpuheal.state.history import History

SPARK_WIDTH = 24
TEMP_SPAN_S = 3600.0


def render_trend(doc: dict[str, Any], history: History, now_s: float, cfg: Config) -> None:
    from gpuheal.rules import vram_leak

    rows = []
    for alias, trend in doc["vram_trend"].items():
        window_s = cfg.params_as(vram_leak.Params, vram_leak.ID, alias).window_h * 3600
        cols = history.raw.get(alias)
        vram_spark = temp_spark = ""
        if cols and cols["t"]:
            first = cols["t"][0]  # a young history fills the whole line instead of its last cell
            vram_spark = sparkline(cols["t"], cols["vram_used_mb"], max(now_s - window_s, first), now_s, SPARK_WIDTH)
            temp_spark = sparkline(cols["t"], cols["temp_c"], max(now_s - TEMP_SPAN_S, first), now_s, SPARK_WIDTH // 2)
        rate = trend["rate_mb_per_hour"]
        threshold = doc["leak_threshold_mb_per_hour"][alias]
        leak = any(a["gpu"] == alias and a["issue"] == vram_leak.ID for a in doc["attention"])
        full = trend["projected_full_in_hours"]
        rise = doc["temp_rise_c_per_min"][alias]
        rows.append(
            [
                (clean(alias), "bold"),
                (vram_spark or "-", None),
                (fmt_num(trend["current_mb"], " MB"), None),
                (f"{fmt_num(rate, '', 1)} / {threshold:g}", "bold red" if leak else None),
                (
                    fmt_num(full, " h", 1) if full is not None else "-",
                    "yellow" if full is not None and full < 24 else None,
                ),
                (f"{trend['samples']} / {trend['span_h']:g} h", None),
                (fmt_num(doc["temp_c"][alias], "°C"), None),
                (fmt_num(rise, "", 2), "yellow" if rise is not None and rise > 2 else None),
                (temp_spark or "-", None),
            ]
        )
    print_table(
        f"gpuheal trend at {doc['generated_at']}",
        ["alias", "vram (fit window)", "now", "MB/h / limit", "full in", "fit n/span", "temp", "°C/min", "temp (1 h)"],
        rows,
    )
    for item in doc["attention"]:
        print_line(f"ATTENTION {clean(item['gpu'])} {item['issue']}: {clean(item['detail'], 200)}", "yellow")
