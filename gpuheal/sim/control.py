"""A tiny client for the sim's control endpoint (stdlib only; also runnable as a script).

    python -m gpuheal.sim.control CONTROL_URL restart ALIAS     # or 'monitor' / 'litellm'
    python -m gpuheal.sim.control CONTROL_URL advance SECONDS
    python -m gpuheal.sim.control CONTROL_URL now
    python -m gpuheal.sim.control CONTROL_URL state
    python -m gpuheal.sim.control CONTROL_URL smi ALIAS     # the GPU's per-process VRAM, as its smi prints it
    python -m gpuheal.sim.control CONTROL_URL set ALIAS '{"temp_c": 90}'

CONTROL_URL is the fleet's ``control_url`` (``http://127.0.0.1:P/_sim``). Prints the answer
(JSON; ``now`` prints the ISO time alone) and exits 0; on any failure exits 1 with one line on
stderr. Used as the *local restart command* of gpuheal configs written by the sim.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

USAGE = (
    "usage: python -m gpuheal.sim.control CONTROL_URL "
    "(restart ALIAS | advance SECONDS | now | state | smi ALIAS | set ALIAS JSON)"
)
TIMEOUT_S = 5.0


class ControlError(Exception):
    pass


def call(
    control_url: str, method: str, path: str, body: Any = None, timeout: float = TIMEOUT_S
) -> Any:
    """One request to the control endpoint; returns the decoded JSON or raises ControlError."""
    url = control_url.rstrip("/") + path
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read().decode("utf-8")).get("error") or exc.reason
        except Exception:
            detail = exc.reason
        raise ControlError(f"{url}: HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise ControlError(f"{url}: {exc.reason}") from None
    except (TimeoutError, OSError) as exc:
        raise ControlError(f"{url}: {exc}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        raise ControlError(f"{url}: answer is not JSON") from None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(args) < 2:
        print(f"gpuheal-sim-control: {USAGE}", file=sys.stderr)
        return 1
    url, cmd, rest = args[0], args[1], args[2:]
    try:
        if cmd == "restart" and len(rest) == 1:
            result = call(url, "POST", "/restart", {"gpu": rest[0]})
        elif cmd == "advance" and len(rest) == 1:
            try:
                seconds = float(rest[0])
            except ValueError:
                raise ControlError(f"advance: not a number of seconds: {rest[0]!r}") from None
            result = call(url, "POST", "/advance", {"seconds": seconds})
        elif cmd == "now" and not rest:
            print(call(url, "GET", "/now")["now"])
            return 0
        elif cmd == "smi" and len(rest) == 1:
            from urllib.parse import quote

            text = call(url, "GET", "/smi?gpu=" + quote(rest[0], safe="")).get("text", "")
            sys.stdout.write(text if isinstance(text, str) else "")
            return 0
        elif cmd == "state" and not rest:
            result = call(url, "GET", "/state")
        elif cmd == "set" and len(rest) == 2:
            try:
                values = json.loads(rest[1])
            except ValueError:
                raise ControlError("set: values must be a JSON object") from None
            result = call(url, "POST", "/set", {"gpu": rest[0], "set": values})
        else:
            raise ControlError(USAGE)
    except ControlError as exc:
        print(f"gpuheal-sim-control: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2 if cmd == "state" else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
