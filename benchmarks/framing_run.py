"""Run gpuheal with a chosen HTTP/1.1 framing (issue 19 item 5's measurement): ``hand`` (gpuheal's
own, ``sources/http.py``) or ``h11`` (``h11_framing.install``). Both go through this launcher, so
the two differ only in the framing.

    .venv/bin/python benchmarks/framing_run.py h11 --config C --state-dir S check --json
"""

from __future__ import annotations

import sys
from pathlib import Path

FRAMINGS = ("hand", "h11")


def argv(framing: str) -> list[str]:
    """The command line prefix that runs gpuheal with ``framing``."""
    if framing not in FRAMINGS:
        raise SystemExit(f"unknown framing {framing!r}: one of {', '.join(FRAMINGS)}")
    return [sys.executable, str(Path(__file__).resolve()), framing]


def main() -> None:
    framing, args = sys.argv[1], sys.argv[2:]
    if framing == "h11":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from h11_framing import install

        install()
    elif framing != "hand":
        raise SystemExit(f"unknown framing {framing!r}: one of {', '.join(FRAMINGS)}")
    sys.argv = ["gpuheal", *args]
    from gpuheal.entry import main as gpuheal_main  # what the console script runs

    gpuheal_main()


if __name__ == "__main__":
    main()
