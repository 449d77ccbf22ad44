"""Run remediation commands on a GPU host: locally (subprocess) or over SSH (fabric).

Commands are argv lists from the configuration (contract: a string is split like a shell would
and run without one). Placeholders ``{alias}`` ``{host}`` ``{endpoint}`` become whole argv
elements (:func:`expand`); nothing is ever handed to a local shell, and the one remote shell that
SSH always involves gets ``shlex.join(argv)``, every element quoted.

* :class:`LocalTransport` runs the argv in a new session and, at its timeout, kills the whole
  process group (SIGTERM, then SIGKILL), so a command that forks a hanging child still ends.
* :class:`SshTransport` connects with fabric/paramiko (imported only here, when an SSH action
  runs: ``check`` never pays for them). Host keys come from the configured known_hosts file and
  are enforced (unknown or changed key = refuse; never auto-add). The remote argv is wrapped in
  ``timeout --kill-after=5 N`` so the remote side dies at its timeout too, and the channel is
  closed locally as a backstop.
* :class:`TransportPool` keeps one transport (one SSH connection) per target for a run.

No method raises for a failure of the fleet (refused, unknown host key, missing binary,
timeout): each becomes a :class:`CommandOutcome` with a stable ``error`` code and a one-line
``detail`` for people. Only misuse (a malformed template or argv) raises :class:`GpuhealError`.
Secrets never reach the log: it names the program (argv[0]) and the host, never the arguments.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import os
import select
import shlex
import signal
import socket
import string
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import IO, TYPE_CHECKING, Any, NoReturn, Protocol

from gpuheal.config.model import SSH_PORT, HealConfig
from gpuheal.errors import GpuhealError

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger(__name__)

PLACEHOLDERS = ("alias", "host", "endpoint")
OUTPUT_CAP_BYTES = 64 * 1024
#: After SIGTERM to a timed-out local process group, SIGKILL follows this much later.
KILL_GRACE_S = 0.5
#: Remote ``timeout --kill-after`` (SIGKILL this long after SIGTERM).
REMOTE_KILL_AFTER_S = 5
#: How long past its timeout a remote command may take to report before the channel is closed.
REMOTE_BACKSTOP_S = 2.0
#: After the command exits, how long to wait for the rest of its output (a daemon it started
#: may hold stdout open forever; that is not the command's output).
_DRAIN_AFTER_EXIT_S = 0.5
_READ_CHUNK = 32 * 1024

# Stable ``CommandOutcome.error`` codes (plus "not found: PROGRAM" and "not executable: PROGRAM").
REFUSED = "refused"
HOST_KEY_UNKNOWN = "host key unknown"
HOST_KEY_CHANGED = "host key changed"
AUTH_FAILED = "auth failed"
TIMEOUT = "timeout"
UNREACHABLE = "unreachable"
SSH_ERROR = "ssh error"
CANNOT_RUN = "cannot run"

_FORMATTER = string.Formatter()


# --------------------------------------------------------------------------- templates


def expand(argv_template: Sequence[str], *, alias: str, host: str, endpoint: str) -> list[str]:
    """Fill ``{alias}`` ``{host}`` ``{endpoint}`` in each argument of ``argv_template``.

    Each value lands inside the one argv element that names it: never re-split, never shell
    text, whatever it contains (``ct8; rm -rf /`` stays one argument). ``{{`` and ``}}`` are
    literal braces. Anything else in braces — another name, ``{0}``, ``{}``, ``{host.x}``,
    ``{host[0]}``, a format spec or conversion — is a :class:`GpuhealError`, as is a value
    that starts with ``-`` (it would be read as an option) or holds a NUL byte.
    """
    if isinstance(argv_template, (str, bytes)):
        raise GpuhealError("a command template must be an argv list, not a string")
    values = {"alias": alias, "host": host, "endpoint": endpoint}
    for name, value in values.items():
        if not isinstance(value, str):
            raise GpuhealError(f"placeholder value {{{name}}} must be a string, not {type(value).__name__}")
        if "\0" in value:
            raise GpuhealError(f"placeholder value {{{name}}} contains a NUL byte")
        if value.startswith("-"):
            raise GpuhealError(f"placeholder value {{{name}}}={value!r} starts with '-' (an option)")
    argv = [_expand_arg(arg, values) for arg in argv_template]
    if not argv:
        raise GpuhealError("command is empty")
    return argv


def _expand_arg(arg: Any, values: Mapping[str, str]) -> str:
    if not isinstance(arg, str):
        raise GpuhealError(f"command argument {arg!r} is not a string")
    try:
        parsed = list(_FORMATTER.parse(arg))
    except ValueError as exc:  # "Single '}' encountered", "unmatched '{'"
        raise GpuhealError(f"bad placeholder in {arg!r}: {exc}") from None
    parts: list[str] = []
    for literal, name, spec, conversion in parsed:
        parts.append(literal)
        if name is None:
            continue
        if name not in values:
            raise GpuhealError(
                f"unknown placeholder {{{name}}} in {arg!r} (allowed: {{alias}} {{host}} {{endpoint}})"
            )
        if spec or conversion:
            raise GpuhealError(f"placeholder {{{name}}} in {arg!r} takes no format spec or conversion")
        parts.append(values[name])
    return "".join(parts)


def _check_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, (str, bytes)):
        raise GpuhealError("a command must be an argv list, not a string")
    out = list(argv)
    if not out:
        raise GpuhealError("command is empty")
    for arg in out:
        if not isinstance(arg, str):
            raise GpuhealError(f"command argument {arg!r} is not a string")
        if "\0" in arg:
            raise GpuhealError("command argument contains a NUL byte")
    return out


def remote_command_line(argv: Sequence[str], timeout_s: float) -> str:
    """The exact line :class:`SshTransport` sends: ``timeout --kill-after=5 N argv…``, quoted."""
    argv = _check_argv(argv)
    seconds = max(1, math.ceil(timeout_s))
    return shlex.join(["timeout", f"--kill-after={REMOTE_KILL_AFTER_S}", str(seconds), *argv])


# --------------------------------------------------------------------------- outcome


@dataclass(frozen=True)
class CommandOutcome:
    """What running one command did. ``rc`` is None when it never ran to an exit status
    (not started, timed out, connection failed); negative = killed by that signal (local)."""

    argv: list[str]
    rc: int | None
    stdout: str = ""
    stderr: str = ""
    elapsed_s: float = 0.0
    timed_out: bool = False
    error: str | None = None
    detail: str | None = None
    host: str | None = None  # None = this machine
    truncated: bool = False  # stdout or stderr was longer than OUTPUT_CAP_BYTES

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.error is None and not self.timed_out

    def describe(self) -> str:
        """One line for people: ``rc=0 in 0.12s`` / ``timeout after 5.0s`` / ``refused: …``."""
        where = f" on {self.host}" if self.host else ""
        if self.error:
            text = self.error + (f" ({self.detail})" if self.detail else "")
        else:
            text = f"rc={self.rc}"
        suffix = ", output truncated" if self.truncated else ""
        return f"{text}{where} after {self.elapsed_s:.2f}s{suffix}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Capped:
    """Keeps the first ``cap`` bytes of a stream; counts (and drops) the rest."""

    def __init__(self, cap: int = OUTPUT_CAP_BYTES) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, data: bytes) -> None:
        with self._lock:
            room = max(0, self.cap - len(self.buf))
            self.buf += data[:room]
            self.dropped += max(0, len(data) - room)

    def text(self) -> str:
        with self._lock:
            return bytes(self.buf).decode("utf-8", "replace")


def _outcome(
    argv: Sequence[str], *, start: float, rc: int | None = None, out: _Capped | None = None,
    err: _Capped | None = None, **kw: Any,
) -> CommandOutcome:
    return CommandOutcome(
        argv=list(argv),
        rc=rc,
        stdout=out.text() if out else "",
        stderr=err.text() if err else "",
        elapsed_s=round(time.monotonic() - start, 3),
        truncated=bool((out and out.dropped) or (err and err.dropped)),
        **kw,
    )


class Transport(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def host(self) -> str | None: ...

    def run(self, argv: Sequence[str], timeout_s: float, input: str | None = None) -> CommandOutcome: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- local


class LocalTransport:
    """Run an argv on this machine: no shell, its own session, the group killed at timeout."""

    kind = "local"
    host: str | None = None

    def run(self, argv: Sequence[str], timeout_s: float, input: str | None = None) -> CommandOutcome:
        argv = _check_argv(argv)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                shell=False,
                start_new_session=True,  # its own process group: the timeout kills all of it
                close_fds=True,
            )
        except FileNotFoundError:
            return _outcome(argv, start=start, error=f"not found: {argv[0]}",
                            detail=f"no such program: {argv[0]}")
        except PermissionError:
            return _outcome(argv, start=start, error=f"not executable: {argv[0]}",
                            detail=f"permission denied: {argv[0]}")
        except OSError as exc:
            return _outcome(argv, start=start, error=CANNOT_RUN, detail=f"{argv[0]}: {exc.strerror}")
        log.debug("local: started %s (pid %d)", argv[0], proc.pid)
        out, err = _Capped(), _Capped()
        if input is not None and proc.stdin is not None:  # a pipe whenever there is input
            _writer(proc.stdin, input.encode("utf-8"))
        rc = _collect(proc, out, err, start + timeout_s)
        if rc is None:
            _kill_group(proc)
            _collect(proc, out, err, time.monotonic() + 1.0, last=True)  # what it wrote as it died
            result = _outcome(argv, start=start, out=out, err=err, timed_out=True, error=TIMEOUT,
                              detail=f"killed after {timeout_s:g}s")
            log.info("local: %s timed out after %.2fs", argv[0], result.elapsed_s)
            return result
        result = _outcome(argv, start=start, rc=rc, out=out, err=err)
        log.debug("local: %s exited rc=%s in %.2fs", argv[0], rc, result.elapsed_s)
        return result

    def close(self) -> None:
        pass


def _pipe_thread(name: str, work: Callable[[], object], stream: IO[bytes]) -> threading.Thread:
    """Run ``work()`` on a daemon thread, swallowing the pipe errors a dying command causes
    (BrokenPipeError, a closed file), and always close ``stream``."""

    def run() -> None:
        try:
            work()
        except (OSError, ValueError):
            pass
        finally:
            try:
                stream.close()
            except OSError:
                pass

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def _collect(
    proc: subprocess.Popen[bytes], out: _Capped, err: _Capped, stop_at: float, last: bool = False
) -> int | None:
    """Read the command's stdout and stderr until both close, in this thread (no reader threads:
    250 hosts' nvidia-smi at once cost 2 threads each in GIL hand-offs, issue 12 benchmark), and
    reap it → its exit status; ``None`` when ``stop_at`` came first. After the command exits,
    output is drained for at most ``_DRAIN_AFTER_EXIT_S`` (a grandchild may hold a pipe open). The
    pipes of a command still running at ``stop_at`` stay open unless ``last``: its SIGTERM handler's
    last words are read by the call after the kill."""
    import selectors

    with selectors.DefaultSelector() as sel:
        for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
            if stream is not None and not stream.closed:
                sel.register(stream, selectors.EVENT_READ, (stream, sink))
        drain_by = math.inf
        while sel.get_map():
            now = time.monotonic()
            if now >= min(stop_at, drain_by):
                break
            if drain_by == math.inf and proc.poll() is not None:
                drain_by = now + _DRAIN_AFTER_EXIT_S
            # wake now and then to see the command exit while a grandchild holds a pipe
            for key, _ in sel.select(min(stop_at, drain_by, now + 0.05) - now):
                pipe: IO[bytes]
                pipe, sink = key.data
                chunk = os.read(pipe.fileno(), _READ_CHUNK)
                if chunk:
                    sink.add(chunk)
                else:
                    sel.unregister(pipe)
                    pipe.close()
        if last or proc.poll() is not None:  # else the caller kills it and collects what it writes as it dies
            for key in list(sel.get_map().values()):  # given up on: the command is gone or killed
                key.data[0].close()
    try:
        return proc.wait(timeout=max(0.0, stop_at - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def _writer(stream: IO[bytes], data: bytes) -> threading.Thread:
    return _pipe_thread("gpuheal-input", lambda: stream.write(data), stream)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, give it KILL_GRACE_S, then SIGKILL whatever is left.

    The leader is not reaped until the SIGKILL is sent, so its pid (= the group id) cannot be
    reused by an unrelated process in between.
    """
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
        except ChildProcessError:
            break
        time.sleep(0.02)
    _signal_group(pgid, signal.SIGKILL)  # children that ignored or outlived the SIGTERM
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:  # uninterruptible (D state, e.g. a hung GPU driver call)
        log.warning("local: pid %d survives SIGKILL (uninterruptible sleep?); not waiting", proc.pid)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- ssh


class _Connection(Protocol):
    """What the SSH transport uses of fabric's ``Connection`` (fabric ships no type information)."""

    @property
    def is_connected(self) -> bool: ...

    @property
    def transport(self) -> paramiko.Transport | None: ...

    def close(self) -> None: ...


class SshTransport:
    """One SSH connection to one host, opened on first use and reused for every command.

    ``known_hosts`` is the file of trusted host keys; with ``None`` (or with
    ``system_known_hosts=True``) the user's ``~/.ssh/known_hosts`` and
    ``/etc/ssh/ssh_known_hosts`` are used as well. An unknown key or a changed key refuses the
    connection (paramiko ``RejectPolicy``); nothing is ever added to any file. ``~/.ssh/config``
    is not read: the gpuheal configuration is the whole truth. Without ``key_filename`` the
    agent and ``~/.ssh/id_*`` keys are tried, as ``ssh`` would.

    The remote host needs a POSIX login shell for the user (sh, bash, dash, zsh: the line is
    ``shlex.join`` quoted) and coreutils ``timeout``. Commands run without a pty.
    """

    kind = "ssh"

    def __init__(
        self,
        host: str,
        port: int = SSH_PORT,
        user: str | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        key_filename: str | os.PathLike[str] | None = None,
        connect_timeout_s: float = 10.0,
        *,
        system_known_hosts: bool = False,
    ) -> None:
        self.host = host
        self.port = int(port)
        self.user = user
        self.known_hosts = os.path.expanduser(os.fspath(known_hosts)) if known_hosts else None
        self.key_filename = os.path.expanduser(os.fspath(key_filename)) if key_filename else None
        self.connect_timeout_s = float(connect_timeout_s)
        self.system_known_hosts = system_known_hosts or known_hosts is None
        self.connects = 0  # SSH connections opened so far (one per run is the goal)
        self._conn: _Connection | None = None
        self._failure: tuple[str, str] | None = None  # (error, detail) of a failed connect

    def __repr__(self) -> str:
        return f"SshTransport({self.user or ''}@{self.host}:{self.port})"

    @property
    def connected(self) -> bool:
        return self._conn is not None and bool(self._conn.is_connected)

    def connect(self) -> tuple[str, str] | None:
        """Open the connection if needed. None when connected, else ``(error, detail)``.

        A failed connect is remembered: later commands of this run fail at once with the same
        outcome instead of paying the connect timeout again.
        """
        if self.connected:
            return None
        if self._failure is not None:
            return self._failure
        if self._conn is not None:  # the connection dropped mid-run: open a fresh one
            self._close_conn()
        started = time.monotonic()
        try:
            self._conn = self._open()
        except Exception as exc:  # mapped to a clean outcome; never raised to the caller
            self._failure = self._classify(exc, time.monotonic() - started)
            log.warning("ssh %s:%d: %s: %s", self.host, self.port, *self._failure)
            return self._failure
        return None

    def _open(self) -> _Connection:
        import fabric  # type: ignore[import-untyped]  # fabric ships no type information and has no stubs
        import paramiko

        # paramiko logs a traceback at ERROR for every failed handshake; gpuheal reports the
        # outcome itself, in one line. An explicitly configured level is left alone.
        quiet = logging.getLogger("paramiko")
        if quiet.level == logging.NOTSET:
            quiet.setLevel(logging.CRITICAL)

        t = self.connect_timeout_s
        auto_keys = self.key_filename is None
        connect_kwargs: dict[str, Any] = {
            "timeout": t,
            # Below ``timeout`` (which also bounds paramiko's wait for the handshake), so a
            # silent server ends as "Error reading SSH protocol banner", not a vague error.
            "banner_timeout": t * 0.9,
            "auth_timeout": t,
            "channel_timeout": t,
            "allow_agent": auto_keys,
            "look_for_keys": auto_keys,
        }
        if self.key_filename:
            connect_kwargs["key_filename"] = [self.key_filename]
        # lazy + an explicit empty SSHConfig: no ~/.ssh/config, no fabric/invoke config files.
        config = fabric.Config(lazy=True, ssh_config=paramiko.SSHConfig())
        conn = fabric.Connection(
            self.host, user=self.user, port=self.port, config=config,
            connect_kwargs=connect_kwargs, forward_agent=False,
        )
        try:
            client: paramiko.SSHClient = conn.client
            # fabric installs AutoAddPolicy; replace it before anything connects.
            client.set_missing_host_key_policy(_strict_policy()[0]())
            keys = client.get_host_keys()
            if self.known_hosts:
                try:
                    keys.load(self.known_hosts)
                except OSError as exc:
                    raise _KnownHostsUnreadable(self.known_hosts, exc) from None
            if self.system_known_hosts:
                for path in ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts"):
                    path = os.path.expanduser(path)
                    if os.path.isfile(path):
                        try:
                            keys.load(path)
                        except OSError:
                            pass
            log.debug("ssh %s:%d: connecting as %s", self.host, self.port, conn.user)
            try:
                conn.open()
            except paramiko.SSHException:
                # When the handshake dies in paramiko's thread (e.g. no banner in time), connect()
                # may report a vaguer "No existing session"; the thread's own exception is the
                # real cause.
                transport = client.get_transport()
                cause = transport.get_exception() if transport is not None else None
                if cause is not None:
                    raise cause from None
                raise
        except BaseException:
            conn.close()
            raise
        self.connects += 1
        opened: _Connection = conn
        return opened

    def _classify(self, exc: BaseException, elapsed_s: float = 0.0) -> tuple[str, str]:
        import paramiko

        where = f"{self.host}:{self.port}"
        khf = self.known_hosts or "~/.ssh/known_hosts"
        if isinstance(exc, _KnownHostsUnreadable):
            return HOST_KEY_UNKNOWN, f"cannot read known_hosts file {exc.path}: {exc.reason}"
        if isinstance(exc, _strict_policy()[1]):
            return HOST_KEY_UNKNOWN, (
                f"host key for {self.host} not in {khf}; add it with ssh-keyscan after verifying "
                f"the fingerprint (the server offered {exc.key_type} {exc.fingerprint})"
            )
        if isinstance(exc, paramiko.BadHostKeyException):
            return HOST_KEY_CHANGED, (
                f"host key for {self.host} CHANGED: {khf} has {_fingerprint(exc.expected_key)}, "
                f"the server offered {_fingerprint(exc.key)}; refusing (possible "
                f"man-in-the-middle). If the host was reinstalled, verify and replace the entry"
            )
        if isinstance(exc, OSError) and exc.filename and exc.filename == self.key_filename:
            return AUTH_FAILED, f"cannot read SSH key {exc.filename}: {exc.strerror}"
        if isinstance(exc, paramiko.AuthenticationException):
            return AUTH_FAILED, f"{self.user or 'the user'}@{where}: {exc}"
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            errnos = {getattr(e, "errno", None) for e in exc.errors.values()}
            if errnos == {errno.ECONNREFUSED}:
                return REFUSED, f"connection refused by {where}"
            return UNREACHABLE, f"{where}: {exc}"
        if isinstance(exc, ConnectionRefusedError):
            return REFUSED, f"connection refused by {where}"
        if isinstance(exc, socket.gaierror):
            return UNREACHABLE, f"cannot resolve {self.host}: {exc.strerror}"
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return TIMEOUT, f"no SSH connection to {where} within {self.connect_timeout_s:g}s"
        if isinstance(exc, paramiko.SSHException) and (
            "banner" in str(exc).lower() or elapsed_s >= self.connect_timeout_s * 0.9
        ):
            return TIMEOUT, f"no SSH handshake with {where} within {self.connect_timeout_s:g}s ({exc})"
        if isinstance(exc, OSError):
            return UNREACHABLE, f"{where}: {exc.strerror or exc}"
        return SSH_ERROR, f"{where}: {type(exc).__name__}: {exc}"

    def run(self, argv: Sequence[str], timeout_s: float, input: str | None = None) -> CommandOutcome:
        argv = _check_argv(argv)
        start = time.monotonic()
        failure = self.connect()
        if failure is not None:
            error, detail = failure
            return _outcome(argv, start=start, host=self.host, error=error, detail=detail)
        import paramiko

        line = remote_command_line(argv, timeout_s)
        out, err = _Capped(), _Capped()
        t0 = time.monotonic()  # the command's own clock starts once connected
        deadline = t0 + timeout_s + REMOTE_BACKSTOP_S
        try:
            chan = self._session()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._close_conn()
            return _outcome(argv, start=start, host=self.host, error=SSH_ERROR,
                            detail=f"cannot open a session on {self.host}: {exc}")
        try:
            chan.exec_command(line)  # no pty: output stays split, signals are ours
            if input is not None:
                chan.settimeout(max(0.1, deadline - time.monotonic()))
                chan.sendall(input.encode("utf-8"))
            chan.shutdown_write()  # EOF on stdin
            status, closed_by_us = self._pump(chan, out, err, deadline)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            return _outcome(argv, start=start, host=self.host, out=out, err=err,
                            error=SSH_ERROR, detail=f"{self.host}: {exc}")
        finally:
            chan.close()
        elapsed = time.monotonic() - t0
        remote_timeout = max(1, math.ceil(timeout_s))
        if closed_by_us or (status in (124, 137) and elapsed >= remote_timeout - 0.25):
            how = ("remote timeout(1) ended it" if not closed_by_us
                   else "no exit status in time; channel closed, remote timeout(1) will end it")
            result = _outcome(argv, start=start, host=self.host, out=out, err=err,
                              timed_out=True, error=TIMEOUT,
                              detail=f"killed after {timeout_s:g}s ({how})")
            log.info("ssh %s: %s timed out after %.2fs", self.host, argv[0], result.elapsed_s)
            return result
        if status == -1:
            return _outcome(argv, start=start, host=self.host, out=out, err=err, error=SSH_ERROR,
                            detail="the remote command ended without an exit status (a signal?)")
        failed: tuple[str, str] | tuple[None, None] = (None, None)
        if status == 127:  # timeout(1) and shells: command not found
            failed = f"not found: {argv[0]}", f"{argv[0]}: not found on {self.host}"
        elif status == 126:
            failed = f"not executable: {argv[0]}", f"{argv[0]}: cannot execute on {self.host}"
        result = _outcome(argv, start=start, host=self.host, rc=status, out=out, err=err,
                          error=failed[0], detail=failed[1])
        log.debug("ssh %s: %s exited rc=%s in %.2fs", self.host, argv[0], status, result.elapsed_s)
        return result

    @staticmethod
    def _pump(chan: paramiko.Channel, out: _Capped, err: _Capped, deadline: float) -> tuple[int | None, bool]:
        """Read stdout/stderr until the exit status (plus a short drain) or ``deadline``.
        Returns ``(exit status or None, closed_by_us)``."""
        exited_at: float | None = None
        while True:
            while chan.recv_ready():
                out.add(chan.recv(_READ_CHUNK))
            while chan.recv_stderr_ready():
                err.add(chan.recv_stderr(_READ_CHUNK))
            now = time.monotonic()
            if exited_at is None and chan.exit_status_ready():
                exited_at = now
            if exited_at is not None and (chan.eof_received or now - exited_at >= _DRAIN_AFTER_EXIT_S):
                if not (chan.recv_ready() or chan.recv_stderr_ready()):
                    return chan.recv_exit_status(), False
            if now >= deadline:
                chan.close()
                return None, True
            select.select([chan], [], [], min(0.05, max(0.0, deadline - now)))

    def _session(self) -> paramiko.Channel:
        """A new channel on the open connection (``connect`` succeeded just before)."""
        import paramiko

        transport = None if self._conn is None else self._conn.transport
        if transport is None:
            raise paramiko.SSHException("the connection has no transport")
        return transport.open_session(timeout=self.connect_timeout_s)

    def close(self) -> None:
        self._close_conn()

    def __enter__(self) -> SshTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection must not fail the run
                pass


class _KnownHostsUnreadable(Exception):
    def __init__(self, path: str, exc: OSError) -> None:
        super().__init__(path)
        self.path = path
        self.reason = exc.strerror or str(exc)


def _fingerprint(key: paramiko.PKey) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


class _OffersKey:
    """What the unknown-host refusal (:func:`_strict_policy`) says of the key the server offered."""

    key_type: str
    fingerprint: str


@functools.cache
def _strict_policy() -> tuple[type[paramiko.MissingHostKeyPolicy], type[_OffersKey]]:
    """``(policy class, unknown-key exception class)``: a paramiko ``RejectPolicy`` that raises
    an exception of its own for an unknown key, so the refusal can be told apart."""
    import paramiko

    class UnknownHostKey(paramiko.SSHException, _OffersKey):
        def __init__(self, hostname: str, key: paramiko.PKey) -> None:
            super().__init__(f"host key for {hostname} not in known_hosts")
            self.hostname = hostname
            self.key_type = key.get_name()
            self.fingerprint = _fingerprint(key)

    class StrictRejectPolicy(paramiko.RejectPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
            raise UnknownHostKey(hostname, key)

    return StrictRejectPolicy, UnknownHostKey


# --------------------------------------------------------------------------- pool


@dataclass(frozen=True)
class Target:
    """Where a command runs: ``Target("local")`` or ``Target("ssh", host, port, user)``."""

    kind: str
    host: str | None = None
    port: int = SSH_PORT
    user: str | None = None

    @classmethod
    def for_gpu(cls, gpu: Any, heal: HealConfig | None = None) -> Target:
        """From a ``GpuConfig`` (``transport``, ``host``, ``ssh_port``, ``ssh_user``); the user
        falls back to ``heal.ssh_user``, then to the local user."""
        if gpu.transport == "local":
            return cls("local")
        user = getattr(gpu, "ssh_user", None) or (heal.ssh_user if heal is not None else None)
        return cls("ssh", gpu.host, int(getattr(gpu, "ssh_port", None) or SSH_PORT), user)


_stand_in: Callable[[Target], Transport] | None = None


@contextlib.contextmanager
def use_transports(stand_in: Callable[[Target], Transport]) -> Iterator[None]:
    """Every pool of this process hands out ``stand_in(target)`` instead of a local or SSH transport
    while the block runs: a simulated host behind every target, for tests and ``benchmarks/chaos.py``
    (issue 29), with everything above the transport (templates, outcomes, parsing, judging)
    unchanged. Production never installs one."""
    global _stand_in
    previous, _stand_in = _stand_in, stand_in
    try:
        yield
    finally:
        _stand_in = previous


class TransportPool:
    """One transport per target for one run; ``close()`` (or ``with``) closes every connection."""

    def __init__(
        self,
        *,
        known_hosts: str | os.PathLike[str] | None = None,
        key_filename: str | os.PathLike[str] | None = None,
        connect_timeout_s: float = 10.0,
        system_known_hosts: bool = False,
    ) -> None:
        self.known_hosts = known_hosts
        self.key_filename = key_filename
        self.connect_timeout_s = connect_timeout_s
        self.system_known_hosts = system_known_hosts
        self._local = LocalTransport()
        self._ssh: dict[Target, SshTransport] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, heal: HealConfig) -> TransportPool:
        """From the config's ``heal`` section: ``known_hosts``, ``ssh_key``,
        ``ssh_connect_timeout_s``, ``system_known_hosts``."""
        return cls(
            known_hosts=heal.known_hosts,
            key_filename=heal.ssh_key,
            connect_timeout_s=heal.ssh_connect_timeout_s,  # defaults.yaml heal.ssh_connect_timeout_s
            system_known_hosts=heal.system_known_hosts,
        )

    def get(self, target: Target) -> Transport:
        if _stand_in is not None:
            return _stand_in(target)
        if target.kind == "local":
            return self._local
        if target.kind != "ssh":
            raise GpuhealError(f"unknown transport {target.kind!r} (ssh | local)")
        if not target.host:
            raise GpuhealError("an ssh target needs a host")
        with self._lock:
            transport = self._ssh.get(target)
            if transport is None:
                transport = self._ssh[target] = SshTransport(
                    target.host, target.port, target.user,
                    known_hosts=self.known_hosts, key_filename=self.key_filename,
                    connect_timeout_s=self.connect_timeout_s,
                    system_known_hosts=self.system_known_hosts,
                )
            return transport

    def close(self) -> None:
        with self._lock:
            transports, self._ssh = list(self._ssh.values()), {}
        for transport in transports:
            transport.close()

    def __enter__(self) -> TransportPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
