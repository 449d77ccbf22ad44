"""Real-server test tier: gpuheal against a genuine llama.cpp ``llama-server`` on 127.0.0.1.

What this tier is
-----------------
The tests under ``tests/realserver`` talk to a real, unpatched llama.cpp ``llama-server`` process,
not a mock. Nothing is downloaded at test time except (once per machine) the llama.cpp sources:

* **Binary**: ``scripts/build-llama-server.sh`` builds ``llama-server`` from the llama.cpp tree that
  the PyPI sdist of ``llama-cpp-python==0.3.36`` vendors (llama.cpp ``b11312-0c1e57098``), once per
  machine, into ``${GPUHEAL_LLAMA_CACHE:-~/.cache/gpuheal}/llama-server-b11312-0c1e57098/bin/``.
  The first build takes about 8-13 minutes on 2 cores; afterwards the script returns instantly.
  System tools needed: cmake, g++ (gcc), make, tar, flock (util-linux), python3 with pip.
* **Model**: ``make_model.py`` writes a tiny random-weight llama GGUF (~0.6 MB, deterministic, <1 s)
  with the PyPI ``gguf`` package + numpy. The model can never emit EOS, so every request generates
  exactly ``n_predict``/``max_tokens`` tokens.
* **Python packages**: pytest, requests, gguf, numpy.

How to run
----------
::

    scripts/build-llama-server.sh            # once per machine (prints the binary path)
    python -m pytest tests/realserver -q

Environment knobs:

* ``LLAMA_SERVER_BIN=/path/to/llama-server`` - use this binary instead of the cached build.
* ``GPUHEAL_SKIP_REALSERVER=1`` - if no built binary is found, skip the tier instead of building it.
  (Without it, a missing binary is built on the spot by the script: slow, but honest.)
* ``GPUHEAL_LLAMA_CACHE`` - cache root used by the build script (default ``~/.cache/gpuheal``).
* ``GPUHEAL_REALSERVER_KEEP_LOGS=1`` - print each server's log path at teardown.

Fixtures
--------
* ``llama_server_bin`` (session) - path to the ``llama-server`` binary (or skip, see above).
* ``tiny_model`` (session) - path to the generated tiny GGUF.
* ``slow_model`` (session, lazy) - a ~540 MB variant that takes long enough to load that the
  503 ``Loading model`` window is observable. Only generated when a test asks for it.
* ``real_llama_server`` (function) - a factory: ``srv = real_llama_server(**options)`` starts
  ``llama-server -m MODEL --host 127.0.0.1 --port <free> --api-key <key> --metrics -c 2048 -np 2 -t 2``
  and, by default, waits (polling ``/health``, 60 s deadline, process liveness checked) until it
  answers 200. ``real_llama_server(wait=False)`` returns right after spawning, for observing the
  503 loading state; call ``srv.wait_ready()`` later. The returned :class:`LlamaServer` has ``.url``,
  ``.api_key``, ``.port``, ``.proc``, ``.auth`` (headers dict), ``.log_text()`` and ``.stop()``.
  Every server a test started is killed (and reaped) at teardown, whatever happened.
* ``llama_server`` (module) - one default server shared by a test module.

Facts pinned by ``test_real_llama_server.py`` (llama.cpp b11312): ``/health`` is public and answers
``{"status":"ok"}``; everything else needs ``Authorization: Bearer KEY`` (or ``X-Api-Key``) and a
wrong key gives 401 ``{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}``;
``/props`` has the per-slot context at ``default_generation_settings.n_ctx``; ``/completion`` and
``/v1/chat/completions`` return ``timings.predicted_n``/``predicted_per_second``; while loading every
path (even ``/health``, even with a wrong key) answers 503 ``Loading model``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, nullcontext
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-llama-server.sh"
HERE = Path(__file__).resolve().parent

DEFAULT_API_KEY = "gpuheal-test-key"
READY_TIMEOUT_S = 60.0

if str(HERE) not in sys.path:  # so make_model is importable without tests/ being a package
    sys.path.insert(0, str(HERE))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "realserver: runs against a real llama.cpp llama-server on 127.0.0.1 "
        "(binary from scripts/build-llama-server.sh)",
    )


# --------------------------------------------------------------------------------------------
# binary + models
# --------------------------------------------------------------------------------------------


def _runs(binary: Path) -> bool:
    try:
        return (
            subprocess.run(
                [str(binary), "--version"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def llama_server_bin(request: pytest.FixtureRequest) -> Path:
    explicit = os.environ.get("LLAMA_SERVER_BIN")
    if explicit:
        binary = Path(explicit)
        if not _runs(binary):
            pytest.fail(f"LLAMA_SERVER_BIN={explicit} does not exist or does not run")
        return binary

    # Already built? (--check never builds)
    check = subprocess.run(["bash", str(BUILD_SCRIPT), "--check"], capture_output=True, text=True)
    if check.returncode == 0 and check.stdout.strip():
        return Path(check.stdout.strip().splitlines()[-1])

    if os.environ.get("GPUHEAL_SKIP_REALSERVER") == "1":
        pytest.skip(
            "llama-server not built and GPUHEAL_SKIP_REALSERVER=1 "
            f"(build it with {BUILD_SCRIPT.relative_to(REPO_ROOT)})"
        )

    # Build it now, with the build's progress visible on the terminal.
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else nullcontext():
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    binary = Path(proc.stdout.strip().splitlines()[-1])
    if not _runs(binary):
        pytest.fail(f"build script printed {binary}, which does not run")
    return binary


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from make_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("realserver-model") / "tiny.gguf")


@pytest.fixture(scope="session")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~540 MB model (n_embd 1024, 8 layers, n_ff 4096): its load is slow enough to see 503s."""
    from make_model import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("realserver-slow-model") / "slow.gguf",
        n_embd=1024,
        n_layer=8,
        n_ff=4096,
    )


# --------------------------------------------------------------------------------------------
# server process handling
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    pass


class LlamaServer:
    """A running (or starting) llama-server child process."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        port: int,
        api_key: str | None,
        args: Sequence[str],
        log_path: Path,
    ) -> None:
        self.binary = binary
        self.model = model
        self.port = port
        self.host = "127.0.0.1"
        self.url = f"http://{self.host}:{port}"
        self.api_key = api_key
        self.log_path = log_path
        self.cmd = [str(binary), "-m", str(model), "--host", self.host, "--port", str(port)]
        if api_key is not None:
            self.cmd += ["--api-key", api_key]
        self.cmd += list(args)
        self._log = open(log_path, "wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    # -- convenience ---------------------------------------------------------------------
    @property
    def auth(self) -> dict[str, str]:
        """Headers that authenticate against this server."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        try:
            self._log.flush()
        except ValueError:
            pass
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def __repr__(self) -> str:
        return f"<LlamaServer {self.url} pid={self.proc.pid} rc={self.proc.poll()}>"

    # -- lifecycle -----------------------------------------------------------------------
    def wait_ready(self, timeout: float = READY_TIMEOUT_S, poll_s: float = 0.02) -> float:
        """Poll GET /health until it answers 200; return seconds since spawn.

        Raises ServerStartError if the process exits or the deadline passes.
        """
        import requests

        session = requests.Session()
        session.trust_env = False  # never route 127.0.0.1 through an HTTP proxy
        deadline = time.monotonic() + timeout
        last = "no answer"
        try:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    raise ServerStartError(
                        f"llama-server exited with code {rc} before becoming ready\n"
                        f"cmd: {' '.join(self.cmd)}\n--- log ---\n{self.log_text()[-4000:]}"
                    )
                try:
                    r = session.get(self.url + "/health", timeout=2)
                    if r.status_code == 200:
                        return time.monotonic() - self.started_at
                    last = f"HTTP {r.status_code} {r.text[:200]}"
                except requests.RequestException as exc:
                    last = type(exc).__name__
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"llama-server not ready after {timeout:.0f} s (last: {last})\n"
                        f"cmd: {' '.join(self.cmd)}\n--- log ---\n{self.log_text()[-4000:]}"
                    )
                time.sleep(poll_s)
        finally:
            session.close()

    def stop(self, timeout: float = 10.0) -> int | None:
        """Terminate (then kill) the process and reap it. Idempotent."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL always lands
            self.proc.kill()
            self.proc.wait()
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode


class ServerFactory:
    def __init__(self, binary: Path, default_model: Path, log_dir: Path) -> None:
        self.binary = binary
        self.default_model = default_model
        self.log_dir = log_dir
        self.servers: list[LlamaServer] = []

    def __call__(
        self,
        model: Path | None = None,
        *,
        wait: bool = True,
        api_key: str | None = DEFAULT_API_KEY,
        ctx_size: int | None = 2048,
        n_parallel: int | None = 2,
        threads: int | None = 2,
        metrics: bool = True,
        extra_args: Sequence[str] = (),
        timeout: float = READY_TIMEOUT_S,
    ) -> LlamaServer:
        args: list[str] = []
        if ctx_size is not None:
            args += ["-c", str(ctx_size)]
        if n_parallel is not None:
            args += ["-np", str(n_parallel)]
        if threads is not None:
            args += ["-t", str(threads)]
        if metrics:
            args.append("--metrics")
        args += list(extra_args)

        last_error: Exception | None = None
        for _attempt in range(3):  # a free port can be stolen between bind-check and exec
            port = free_port()
            log_path = self.log_dir / f"llama-server-{port}-{len(self.servers)}.log"
            srv = LlamaServer(
                self.binary,
                model or self.default_model,
                port=port,
                api_key=api_key,
                args=args,
                log_path=log_path,
            )
            self.servers.append(srv)
            if not wait:
                return srv
            try:
                srv.wait_ready(timeout=timeout)
                return srv
            except ServerStartError as exc:
                srv.stop()
                last_error = exc
                log = srv.log_text().lower()
                if "bind" in log or "address already in use" in log or "couldn't" in log:
                    continue  # port race: try another port
                raise
        assert last_error is not None
        raise last_error

    def stop_all(self) -> None:
        errors = []
        for srv in self.servers:
            try:
                srv.stop()
            except Exception as exc:  # keep going: every process must be reaped
                errors.append(exc)
            if os.environ.get("GPUHEAL_REALSERVER_KEEP_LOGS") == "1":
                print(f"llama-server log: {srv.log_path}", file=sys.stderr)
        self.servers.clear()
        if errors:
            raise errors[0]


@pytest.fixture
def real_llama_server(
    llama_server_bin: Path, tiny_model: Path, tmp_path: Path
) -> Iterator[ServerFactory]:
    factory = ServerFactory(llama_server_bin, tiny_model, tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="module")
def llama_server(
    llama_server_bin: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    factory = ServerFactory(llama_server_bin, tiny_model, tmp_path_factory.mktemp("llama-server"))
    try:
        yield factory()
    finally:
        factory.stop_all()
