"""Run the cluster guide's local-head commands (docs/cluster.md) against a real `ray start --head` of the test's own.

Other people's Ray clusters share this machine, so the head gets its own `--temp-dir` (Ray then records its address
there, not in /tmp/ray/ray_current_cluster, which a bare `ray.init()` elsewhere would join) and free ports, its token
comes from a file of the test's (`RAY_AUTH_TOKEN_PATH`, never ~/.ray/auth_token), and teardown ends only the
processes whose command line names that temp dir, and their children: `ray stop` would stop everyone's.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
GUIDE_PORT = "8265"
# `ray start` flags of the guide's head, plus what isolates it; every other port is picked free
PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port",
              "--node-manager-port", "--object-manager-port")
# where the guide's commands live: the first ```sh block (of these pages, in order) that starts a head and submits
GUIDE_PAGES = ("docs/cluster.md", "docs/submitting.md")


def guide_commands() -> list[str]:
    """The commands of the docs' local-head block (`ray start --head` ... `ray job submit`), continuations joined."""
    pages = [REPO / p for p in GUIDE_PAGES] + sorted((REPO / "docs").rglob("*.md"))
    for page in pages:
        if not page.exists():
            continue
        for block in re.findall(r"```(?:sh|bash)\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL):
            if "ray start --head" in block and "ray job submit" in block:
                return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    raise AssertionError(f"no ```sh block with `ray start --head` and `ray job submit` in {GUIDE_PAGES} or docs/")


def command(prefix: str) -> str:
    """The one command of the guide's block starting with `prefix`."""
    found = [c for c in guide_commands() if c.startswith(prefix)]
    assert len(found) == 1, f"cluster guide block: {len(found)} commands start with {prefix!r}"
    return found[0]


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


class Head:
    """A Ray head started by the cluster guide's commands, with a shell environment that later commands share."""

    def __init__(self):
        # short: Ray's unix socket paths under it must stay below 108 bytes
        self.temp_dir = tempfile.mkdtemp(prefix="qh-", dir="/tmp")
        ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
        self.dashboard_port = str(ports["--dashboard-port"])
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        token = Path(self.temp_dir, "token")
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_TOKEN_PATH=str(token),
                   RAY_USAGE_STATS_ENABLED="0")
        self.env = env
        self.start_args = [f"--temp-dir={self.temp_dir}", *(f"{flag}={port}" for flag, port in ports.items()),
                           "--min-worker-port=0", "--max-worker-port=0"]

    # -- running the guide's commands-----------------------------------------------------------------------------
    def sh(self, cmd: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """Run one guide command (its port swapped for the head's) in the shared environment, from the repo root."""
        cmd = cmd.replace(f":{GUIDE_PORT}", f":{self.dashboard_port}")
        if cmd.startswith("export "):
            name, _ = cmd[len("export "):].split("=", 1)
            out = subprocess.run(["bash", "-c", f'{cmd.split("  #")[0]}\nprintf %s "${name}"'], env=self.env,
                                 cwd=REPO, capture_output=True, text=True, timeout=30, check=True)
            self.env[name] = out.stdout
            return out
        result = subprocess.run(["bash", "-c", cmd], env=self.env, cwd=REPO, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"`{cmd}` exited {result.returncode}:\n{result.stdout[-4000:]}\n"
                                 f"{result.stderr[-4000:]}")
        return result

    def start(self) -> None:
        for cmd in guide_commands():
            if cmd.startswith("ray job"):
                break
            if cmd.startswith("ray start --head"):
                cmd = cmd.split("  #")[0] + " " + " ".join(shlex.quote(a) for a in self.start_args)
            if cmd.startswith("export QUORUM_HOME"):
                continue  # per test: see `submit_env`
            self.sh(cmd, timeout=180)

    def set_home(self, home: str) -> None:
        """The guide's `export QUORUM_HOME=$PWD`, pointed at a test folder instead of the checkout, and the
        exports after it (the runtime env that carries it) re-evaluated."""
        after = False
        for cmd in guide_commands():
            if cmd.startswith("export QUORUM_HOME"):
                self.env["QUORUM_HOME"], after = home, True
            elif after and cmd.startswith("export "):
                self.sh(cmd)
            elif after:
                break

    def client(self):
        """A JobSubmissionClient for polling (cheaper than a CLI process per look), token passed explicitly."""
        from ray.job_submission import JobSubmissionClient

        token = Path(self.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
        return JobSubmissionClient(self.address, headers={"Authorization": f"Bearer {token}"})

    # -- teardown ------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGKILL every process whose command line names this head's temp dir, and their children (nothing in a
        test's head is worth a graceful stop: SIGTERM and a 5 s grace cost each teardown seconds), then remove the
        temp dir."""
        mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        procs = set()
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.info["pid"] not in mine and any(self.temp_dir in a for a in proc.info["cmdline"] or ()):
                procs.add(proc)
                try:
                    procs.update(proc.children(recursive=True))
                except psutil.NoSuchProcess:
                    continue
        procs = [p for p in procs if p.pid not in mine]
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def submission_id(output: str) -> str:
    found = re.search(r"raysubmit_\w+", output)
    assert found, f"no submission id in:\n{output[-3000:]}"
    return found.group(0)
