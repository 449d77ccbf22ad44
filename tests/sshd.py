"""A real OpenSSH ``sshd`` on 127.0.0.1 for the test suite: no mocks for SSH.

:func:`start_sshd` generates a host key and a client key into a directory, writes an
``sshd_config`` that accepts only that client key for the current user (root included:
``PermitRootLogin prohibit-password``), and runs ``sshd -D -e -f CONFIG`` on a free port until
:meth:`SshdServer.stop`. ``tests/conftest.py`` exposes it as the session fixture ``sshd``.

Quirks handled here:

* sshd must be started by absolute path (it re-execs itself).
* As root it needs its privilege-separation directory ``/run/sshd`` (normally made by the
  service unit, which never ran in a container): created when missing.
* ``UsePAM no`` (PAM needs root and a service file), so sshd itself refuses a *locked* account
  (``!`` in /etc/shadow); ``StrictModes no`` because the keys live in a world-readable tmp dir.
* Only the keys in our own ``AuthorizedKeysFile`` are accepted (the user's real
  ``~/.ssh/authorized_keys`` is not), and only ``AllowUsers`` = the current user.

Without an sshd binary the SSH tests skip with :data:`SKIP_REASON`; ``.ci/run`` installs
openssh-server, so CI always runs them.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

SKIP_REASON = (
    "no sshd binary (/usr/sbin/sshd): install openssh-server "
    "(apt-get install openssh-server openssh-client; .ci/run installs it)"
)
HOST = "127.0.0.1"


def find_sshd() -> str | None:
    for candidate in ("/usr/sbin/sshd", shutil.which("sshd")):
        if candidate and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def sshd_version(binary: str) -> str:
    proc = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10)
    return (proc.stderr or proc.stdout).strip().splitlines()[0] if (proc.stderr or proc.stdout) else "?"


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str) -> str:
    """Generate an ed25519 key pair at ``path`` (+ ``.pub``); return the public key line."""
    keygen_bin = shutil.which("ssh-keygen")
    if keygen_bin is None:
        raise RuntimeError("ssh-keygen not found: install openssh-client (.ci/run installs it)")
    subprocess.run(
        [keygen_bin, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, capture_output=True, timeout=30,
    )
    path.chmod(0o600)
    return Path(f"{path}.pub").read_text().strip()


@dataclass
class SshdServer:
    """A running sshd. Connect as ``user`` to ``host:port`` with ``key_filename``, trusting
    ``known_hosts``. ``wrong_known_hosts`` holds a different key for the same name (a changed
    host key), ``empty_known_hosts`` nothing (an unknown one), ``unauthorized_key_filename`` a
    key sshd does not accept."""

    host: str
    port: int
    user: str
    key_filename: str
    known_hosts: str
    wrong_known_hosts: str
    empty_known_hosts: str
    unauthorized_key_filename: str
    host_public_key: str
    workdir: Path
    log_path: Path
    binary: str
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def transport(self, **overrides):
        """An :class:`gpuheal.transport.SshTransport` for this server (keyword overrides)."""
        from gpuheal.transport import SshTransport

        kwargs = dict(host=self.host, port=self.port, user=self.user,
                      known_hosts=self.known_hosts, key_filename=self.key_filename,
                      connect_timeout_s=5.0)
        kwargs.update(overrides)
        return SshTransport(**kwargs)

    def ssh_argv(self, *remote: str) -> list[str]:
        """The OpenSSH client command line for the same connection (debugging, other tests)."""
        return ["ssh", "-p", str(self.port), "-i", self.key_filename,
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                f"{self.user}@{self.host}", *remote]

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


_CONFIG = """\
Port {port}
ListenAddress {host}
HostKey {host_key}
PidFile {workdir}/sshd.pid
AuthorizedKeysFile {workdir}/authorized_keys
AllowUsers {user}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowTcpForwarding no
PermitUserEnvironment no
LoginGraceTime 15
MaxStartups 100
MaxSessions 50
LogLevel VERBOSE
"""


def start_sshd(workdir: Path, binary: str | None = None, start_timeout_s: float = 10.0,
               extra_config: str = "") -> SshdServer:
    """Start sshd on a free 127.0.0.1 port with fresh keys in ``workdir``; raises if it fails.
    ``extra_config``: more sshd_config lines (e.g. ``SetEnv PATH=...`` for a fake remote tool)."""
    binary = binary or find_sshd()
    if binary is None:
        raise RuntimeError(SKIP_REASON)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    host_key = workdir / "ssh_host_ed25519_key"
    host_pub = keygen(host_key, "gpuheal-test-host")
    other_host_pub = keygen(workdir / "other_host_ed25519_key", "gpuheal-test-other-host")
    client_key = workdir / "id_ed25519"
    (workdir / "authorized_keys").write_text(keygen(client_key, "gpuheal-test-client") + "\n")
    stranger_key = workdir / "stranger_ed25519"
    keygen(stranger_key, "gpuheal-test-stranger")
    empty = workdir / "known_hosts.empty"
    empty.write_text("")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation chroot

    last_error = ""
    for _attempt in range(3):  # the free port may be taken between choosing and binding it
        port = free_port()
        config = workdir / "sshd_config"
        config.write_text(_CONFIG.format(port=port, host=HOST, host_key=host_key,
                                         workdir=workdir, user=user) + extra_config)
        check = subprocess.run([binary, "-t", "-f", str(config)], capture_output=True,
                               text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"sshd -t rejected {config}: {check.stderr.strip()}")
        known = workdir / "known_hosts"
        known.write_text(f"[{HOST}]:{port} {_key_part(host_pub)}\n")
        wrong = workdir / "known_hosts.wrong"
        wrong.write_text(f"[{HOST}]:{port} {_key_part(other_host_pub)}\n")
        log_path = workdir / f"sshd-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([binary, "-D", "-e", "-f", str(config)],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        server = SshdServer(
            host=HOST, port=port, user=user, key_filename=str(client_key),
            known_hosts=str(known), wrong_known_hosts=str(wrong),
            empty_known_hosts=str(empty), unauthorized_key_filename=str(stranger_key),
            host_public_key=host_pub, workdir=workdir, log_path=log_path, binary=binary,
            proc=proc,
        )
        if _wait_for_banner(server, start_timeout_s):
            return server
        server.stop()
        last_error = server.log_tail()
        if "Address already in use" not in last_error:
            break
    raise RuntimeError(f"sshd did not start; its log:\n{last_error}")


def _key_part(pub_line: str) -> str:
    """``ssh-ed25519 AAAA…`` without the comment."""
    return " ".join(pub_line.split()[:2])


def _wait_for_banner(server: SshdServer, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            return False
        try:
            with socket.create_connection((server.host, server.port), timeout=1) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-2.0-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False
