"""The composition root: what every command gets — config, state directory, clock, output mode.

A step module exposes ``run(rt, store, **options) -> CommandResult``; the CLI opens the state
directory under its lock, calls the step, prints the document (``--json``) or lets the step render
for humans, and exits with the step's code. Keeping this shape in one place keeps every command in
``cli.py`` to a few lines.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuheal.config import Config

log = logging.getLogger("gpuheal")


@dataclass
class Runtime:
    cfg: Config
    state_dir: Path
    now: datetime
    json_out: bool = False
    metrics_file: str | None = None


@dataclass
class CommandResult:
    """What a step returns: the ``--json`` document, the exit code, and a human renderer."""

    document: dict[str, Any]
    exit_code: int
    render: Callable[[], None] | None = None
    warnings: list[str] = field(default_factory=list)


def resolve_state_dir(explicit: str | None) -> Path:
    """``--state-dir`` → ``$GPUHEAL_STATE_DIR`` → ``./state`` (contract: Commands)."""
    return Path(explicit or os.environ.get("GPUHEAL_STATE_DIR") or "state")


def setup_logging(verbose: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gpuheal: %(levelname)s: %(message)s"))
    root = logging.getLogger("gpuheal")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    root.propagate = False


def emit(result: CommandResult, json_out: bool) -> None:
    for warning in result.warnings:
        log.warning("%s", warning)
    if json_out:
        from gpuheal.parse.values import clean_text
        from gpuheal.render.jsontext import dumps

        # valid UTF-8 whatever a source sent (a lone surrogate would raise UnicodeEncodeError here);
        # json.dumps(indent=2)'s text through the C encoder (10,000 GPUs: ~0.45 s less, issue 13)
        text = dumps(result.document, indent=2)
        sys.stdout.write(clean_text(text) + "\n")
    elif result.render is not None:
        result.render()
    sys.stdout.flush()
