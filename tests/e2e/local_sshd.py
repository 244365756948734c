"""An sshd run by the test itself, reachable as `localhost` and `127.0.0.1` with a generated key.

    with local_sshd(tmp_path) as env:       # env: PATH with an `ssh` that finds this sshd
        subprocess.run(["pdsh", "-w", "localhost,127.0.0.1", "hostname"],
                       env={**os.environ, **env, "PDSH_RCMD_TYPE": "ssh"})

The daemon has its own host key, accepts only the generated client key (for whoever runs the
test), listens on a free port of 127.0.0.1 and runs in the foreground until the block ends.
Clients reach it through an `ssh` placed first on PATH that adds `-F <config>`: the config names
the port, the key and no host-key checking, as a user's ~/.ssh/config would on a cluster, so
DeepSpeed's own ssh check and pdsh's ssh module use it unchanged, and ~/.ssh is never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.runs import free_port

SBIN = os.pathsep.join(("/usr/sbin", "/sbin", os.environ.get("PATH", "")))
HOSTS = ("localhost", "127.0.0.1")


def missing() -> str | None:
    """Why sshd cannot be run here, or None when it can."""
    absent = [n for n in ("sshd",) if not shutil.which(n, path=SBIN)]
    absent += [n for n in ("ssh", "ssh-keygen") if not shutil.which(n)]
    if absent:
        return (f"OpenSSH is not installed ({', '.join(absent)} not found; Debian/Ubuntu: "
                "apt-get install openssh-server openssh-client)")
    return None


@contextlib.contextmanager
def local_sshd(workdir: Path, timeout: float = 20.0):
    """Start sshd, wait until it accepts connections, yield {"PATH": ...}, stop it."""
    workdir.mkdir(parents=True, exist_ok=True)
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(workdir / key)],
                       check=True)
    (workdir / "authorized_keys").write_text((workdir / "client_key.pub").read_text())
    port = free_port()
    (workdir / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {workdir}/host_key\n"
        f"AuthorizedKeysFile {workdir}/authorized_keys\nPidFile {workdir}/sshd.pid\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    log = open(workdir / "sshd.log", "w")
    daemon = subprocess.Popen([shutil.which("sshd", path=SBIN), "-D", "-e", "-f",
                               str(workdir / "sshd_config")], stdout=log, stderr=log)
    try:
        _wait_for_port(port, daemon, workdir, timeout)
        yield {"PATH": f"{_ssh_wrapper(workdir, port)}{os.pathsep}{os.environ.get('PATH', '')}"}
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()


def _ssh_wrapper(workdir: Path, port: int) -> Path:
    """A folder holding `ssh` = the real ssh with this sshd's client config."""
    config = workdir / "ssh_config"
    options = {"Port": port, "IdentityFile": workdir / "client_key", "IdentitiesOnly": "yes",
               "BatchMode": "yes", "StrictHostKeyChecking": "no",
               "UserKnownHostsFile": "/dev/null", "LogLevel": "ERROR"}
    config.write_text(f"Host {' '.join(HOSTS)}\n"
                      + "".join(f"  {key} {value}\n" for key, value in options.items()))
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {config} "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


def _wait_for_port(port: int, daemon: subprocess.Popen, workdir: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daemon.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"sshd did not start on 127.0.0.1:{port}\n"
                         + (workdir / "sshd.log").read_text()[-3000:])
