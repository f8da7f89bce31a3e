"""A throw-away sshd on 127.0.0.1 for the remote-engine tests (no Qt here).

:func:`start_sshd` makes, in its own folder, a host key and a user key (``ssh-keygen``), an
``authorized_keys`` holding the user key, an ``sshd_config`` that listens on 127.0.0.1 only, on a
free port, with public-key login for the current user and nothing else, and an ssh *client* config
in which ``Host kvtest`` reaches that server with that key and a temporary known_hosts. Then it
starts ``/usr/sbin/sshd -D -e -f <config>`` and waits until the port accepts.

Nothing of the machine's own ssh setup is read or written: the server reads only its own config
(``-f``), the client is always run with ``-F <client config>`` (for the window:
``KVINSPECT_SSH_COMMAND="ssh -F <client config>"``), known hosts go to the temporary folder.

The client config sends the test run's own environment (``HF_HUB_OFFLINE``, ``KVINSPECT_*`` folders,
…) over the channel and the server accepts exactly those names, so a remote engine in a test never
touches the user's real data folders and never goes to the network.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HOST = "kvtest"  # the alias in the client config
#: Environment names the test client sends and the test server accepts.
ENV_NAMES = ("HF_HUB_OFFLINE", "TRANSFORMERS_VERBOSITY", "TOKENIZERS_PARALLELISM", "KVINSPECT_*")
REQUIRE_ENV = "KVINSPECT_REQUIRE_SSHD"


class SshdUnavailable(Exception):
    """This machine cannot run the test sshd (not installed, or not allowed): a skip, or a failure under CI."""


@dataclass
class Sshd:
    folder: Path
    port: int
    proc: subprocess.Popen
    client_config: Path
    log: Path
    host: str = HOST

    @property
    def ssh(self) -> list[str]:
        """The ssh client command line for this server (use ``[*sshd.ssh, sshd.host, ...]``)."""
        return [shutil.which("ssh") or "ssh", "-F", str(self.client_config)]

    @property
    def ssh_command(self) -> str:
        """``KVINSPECT_SSH_COMMAND`` for a window or an engine launcher that should reach this server."""
        import shlex

        return shlex.join(self.ssh)

    def run(self, *remote: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """Run ``remote`` (an argv, quoted here for the remote shell) on this server over ssh."""
        import shlex

        return subprocess.run([*self.ssh, self.host, shlex.join(remote)], capture_output=True, text=True,
                              timeout=timeout, **kw)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _tool(name: str, *extra: str) -> str:
    found = shutil.which(name) or next((p for p in extra if os.access(p, os.X_OK)), None)
    if not found:
        raise SshdUnavailable(f"{name} is not installed (apt-get install openssh-server openssh-client)")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.settimeout(2)
            return s.recv(4).startswith(b"SSH-")  # the server's banner, not just any listener
    except OSError:
        return False


def _keygen(keygen: str, path: Path) -> None:
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "kvinspect-test", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)


def start_sshd(folder: Path, timeout_s: float = 20.0) -> Sshd:
    """Make keys and configs in ``folder``, start sshd on a free 127.0.0.1 port; raise SshdUnavailable if it cannot."""
    # sshd re-executes itself, so it needs its absolute path.
    sshd = _tool("sshd", "/usr/sbin/sshd", "/usr/local/sbin/sshd")
    _tool("ssh")
    keygen = _tool("ssh-keygen")
    if not os.path.isabs(sshd):
        sshd = os.path.abspath(sshd)
    # The privilege-separation directory (sshd refuses to start without it; a fresh container has none).
    privsep = Path("/run/sshd")
    if not privsep.is_dir():
        try:
            privsep.mkdir(mode=0o755, parents=True)
        except OSError as exc:
            raise SshdUnavailable(f"sshd needs {privsep} and it cannot be created here ({exc.strerror})") from exc

    folder.mkdir(parents=True, exist_ok=True)
    host_key, user_key = folder / "host_ed25519", folder / "id_ed25519"
    _keygen(keygen, host_key)
    _keygen(keygen, user_key)
    auth = folder / "authorized_keys"
    auth.write_text(user_key.with_suffix(".pub").read_text())
    auth.chmod(0o600)
    user = getpass.getuser()
    log = folder / "sshd.log"
    last_err = ""
    for _attempt in range(3):  # a free port may be taken between the probe and sshd's bind: try another
        port = _free_port()
        cfg = folder / "sshd_config"
        cfg.write_text("\n".join([
            "ListenAddress 127.0.0.1",
            f"Port {port}",
            f"HostKey {host_key}",
            f"AuthorizedKeysFile {auth}",
            f"PidFile {folder / 'sshd.pid'}",
            f"AllowUsers {user}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # CI runs as root; only the throw-away key above can log in, and only from 127.0.0.1.
            "PermitRootLogin prohibit-password",
            "StrictModes no",  # the keys live in a temporary folder with whatever modes it has
            "UsePAM no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            "AllowAgentForwarding no",
            "PermitTunnel no",
            "PermitUserEnvironment no",
            f"AcceptEnv {' '.join(ENV_NAMES)}",
            "LogLevel INFO",
            "",
        ]))
        check = subprocess.run([sshd, "-t", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise SshdUnavailable(f"sshd rejects its test config: {check.stderr.strip()[-500:]}")
        with log.open("ab") as f:
            proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                    stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            if _accepts(port):
                break
            time.sleep(0.1)
        if proc.poll() is None and _accepts(port):
            client = folder / "ssh_config"
            client.write_text("\n".join([
                f"Host {HOST}",
                "  HostName 127.0.0.1",
                f"  Port {port}",
                f"  User {user}",
                f"  IdentityFile {user_key}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {folder / 'known_hosts'}",
                "  GlobalKnownHostsFile /dev/null",
                "  StrictHostKeyChecking no",
                "  BatchMode yes",
                "  PasswordAuthentication no",
                "  ForwardAgent no",
                "  ForwardX11 no",
                "  ControlMaster no",
                "  ConnectTimeout 15",
                "  LogLevel ERROR",
                f"  SendEnv {' '.join(ENV_NAMES)}",
                "",
            ]))
            return Sshd(folder=folder, port=port, proc=proc, client_config=client, log=log)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        last_err = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        last_err = last_err[0]
    raise SshdUnavailable(f"sshd did not start on 127.0.0.1: {last_err}")


def require_sshd() -> bool:
    """True where the run must have sshd (CI): a missing sshd is then a failure, not a skip."""
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")
