"""A whole Flower federation on this machine's loopback: one SuperLink and one SuperNode
per silo, each its own process, with TLS and node authentication on by default
(``fedveil deploy local``; the end-to-end test). It drives the same binaries and the same
``flwr`` CLI steps a consortium runs on separate machines (docs/deployment.md), so what
works here is the recipe there.

Every process gets its own ``FLWR_HOME`` and log file under the work folder and runs in
its own session, so :meth:`LocalFederation.kill_silo` can SIGKILL a silo's SuperNode with
everything it started, and :meth:`LocalFederation.stop` leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .private_files import private_folder

FEDERATION = "local"
READY_LINE = "Application startup complete"
ACTIVATED_LINE = "Activated"


class FederationError(RuntimeError):
    """A Flower process did not start, a node was not registered, a run did not finish."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat(pid: int | str) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, from ``/proc/<pid>/stat``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def process_tree(pid: int) -> list[tuple[int, int]]:
    """``pid`` and every process descended from it, as (pid, start time) (Linux ``/proc``):
    Flower's helpers start their own sessions, so a process group does not hold them all."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        stat = _stat(entry) if entry.isdigit() else None
        if stat is not None:
            children.setdefault(stat[0], []).append((int(entry), stat[1]))
    root = _stat(pid)
    out, todo = [], [] if root is None else [(pid, root[1])]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current[0], []))
    return out


def signal_processes(members: list[tuple[int, int]], sig: int) -> None:
    """Send ``sig`` to every (pid, start time) still alive as that same process (a pid
    reused since by another process is left alone)."""
    for pid, started in members:
        stat = _stat(pid)
        if stat is not None and stat[1] == started:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _binary(name: str) -> str:
    """A Flower executable: beside this interpreter (a virtual environment), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise FederationError(f"'{name}' not found: pip install 'fedveil[flower]'")
    return found


@dataclass
class LocalFederation:
    workdir: Path
    num_silos: int
    tls: bool = True
    auth: bool = True
    silo_root: Path | None = None  # the folders of `fedveil deploy prepare` (default: workdir/silos)
    node_configs: dict[int, dict[str, Any]] = field(default_factory=dict)  # extra node config per silo
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    node_ports: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.silo_root = self.workdir / "silos" if self.silo_root is None else Path(self.silo_root).resolve()
        if self.auth and not self.tls:
            raise FederationError("node authentication needs TLS")
        for sub in ("logs", "home/cli"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("certs", "keys"):  # they hold private keys
            private_folder(self.workdir / sub)

    # ------------------------------------------------------------------ processes
    def _env(self, home: str) -> dict[str, str]:
        path = self.workdir / "home" / home
        path.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, FLWR_HOME=str(path), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # flwr-serverapp / -clientapp
        return env

    def log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def _spawn(self, name: str, args: list[str], home: str) -> subprocess.Popen:
        handle = open(self.log(name), "ab")
        proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=self._env(home), start_new_session=True)
        handle.close()
        self.processes[name] = proc
        return proc

    def _wait_for(self, what: str, test, timeout: float, proc: subprocess.Popen | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            if proc is not None and proc.poll() is not None:
                raise FederationError(f"{what}: the process exited with code {proc.returncode}")
            if time.monotonic() > deadline:
                raise FederationError(f"{what}: not done after {timeout:.0f} s (logs in {self.workdir / 'logs'})")
            time.sleep(0.2)

    def _link_lines(self, text: str) -> int:
        return self.log("superlink").read_text(errors="replace").count(text) if self.log("superlink").exists() else 0

    # ------------------------------------------------------------------ set-up
    def start(self, timeout: float = 60.0) -> "LocalFederation":
        """Certificates, the SuperLink, the silos' keys registered, every SuperNode active."""
        try:
            from .certificates import make_node_keys, make_tls_files
        except ImportError:
            raise FederationError("a local federation needs Flower: pip install 'fedveil[flower]'") from None
        certs, tls = self.workdir / "certs", []
        if self.tls:
            make_tls_files(certs, ["127.0.0.1", "localhost"])
            tls = ["--ssl-ca-certfile", str(certs / "ca.crt"), "--ssl-certfile", str(certs / "server.crt"),
                   "--ssl-keyfile", str(certs / "server.key")]
        self._write_cli_config()
        link = [_binary("flower-superlink"), *(tls or ["--insecure"]), "--host", "127.0.0.1", "--port", str(self.port),
                "--disable-runtime-dependency-installation", "--database", str(self.workdir / "superlink.db")]
        if self.auth:
            link.append("--enable-supernode-auth")
        proc = self._spawn("superlink", link, "link")
        self._wait_for("SuperLink start", lambda: self._link_lines(READY_LINE) > 0, timeout, proc)
        if self.auth:
            for k in range(self.num_silos):
                _, public = make_node_keys(self.workdir / "keys", f"node-{k}")
                self.register(public)
        for k in range(self.num_silos):
            self.start_silo(k)
        self._wait_for(f"{self.num_silos} SuperNodes active", lambda: self._link_lines(ACTIVATED_LINE) >= self.num_silos, timeout)
        return self

    def _write_cli_config(self) -> None:
        lines = ["[superlink]", f'default = "{FEDERATION}"', "", f"[superlink.{FEDERATION}]",
                 f'address = "127.0.0.1:{self.port}"']
        lines.append(f'root-certificates = "{self.workdir / "certs" / "ca.crt"}"' if self.tls else "insecure = true")
        (self.workdir / "home" / "cli" / "config.toml").write_text("\n".join(lines) + "\n")

    def flwr(self, *args: str, timeout: float = 120.0) -> str:
        """Run the ``flwr`` CLI against this federation's SuperLink; its stdout."""
        done = subprocess.run([_binary("flwr"), *args], env=self._env("cli"), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise FederationError(f"flwr {' '.join(args[:2])} failed: {(done.stderr or done.stdout).strip()[-400:]}")
        return done.stdout

    def register(self, public_key: Path) -> int:
        """Register a SuperNode's public key; returns its node id."""
        out = json.loads(self.flwr("supernode", "register", str(public_key), FEDERATION, "--format", "json"))
        if not out.get("success"):
            raise FederationError(f"registering {public_key.name}: {out}")
        return int(out["node-id"])

    def start_silo(self, k: int, node_config: dict[str, Any] | None = None, key: Path | None = None) -> subprocess.Popen:
        """Start silo ``k``'s SuperNode (again, after a kill: same key, same node config)."""
        self.node_ports.setdefault(k, free_port())
        config = {"silo-dir": str(self.silo_dir(k)), **(node_config or self.node_configs.get(k, {}))}
        args = [_binary("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}", "--port", str(self.node_ports[k]),
                "--node-config", " ".join(f"{name}={json.dumps(value)}" for name, value in config.items())]
        args += ["--root-certificates", str(self.workdir / "certs" / "ca.crt")] if self.tls else ["--insecure"]
        if self.auth or key is not None:
            args += ["--auth-supernode-private-key", str(key or self.workdir / "keys" / f"node-{k}")]
        return self._spawn(f"silo-{k}", args, f"silo-{k}")

    def silo_dir(self, k: int) -> Path:
        return self.silo_root / f"silo-{k}"

    # ------------------------------------------------------------------ runs
    def submit(self, app: str | Path, run_config: dict[str, Any] | None = None) -> int:
        """``flwr run APP``; returns the run id."""
        args = ["run", str(app), FEDERATION, "--format", "json"]
        if run_config:
            args += ["--run-config", " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())]
        return int(json.loads(self.flwr(*args))["run-id"])

    def status(self, run_id: int) -> str:
        runs = json.loads(self.flwr("ls", FEDERATION, "--run-id", str(run_id), "--format", "json"))["runs"]
        return str(runs[0]["status"]) if runs else "unknown"

    def wait(self, run_id: int, timeout: float) -> str:
        """Wait until run ``run_id`` has finished; its final status (e.g. ``finished:completed``)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            if time.monotonic() > deadline:
                raise FederationError(f"run {run_id} still '{status}' after {timeout:.0f} s")
            time.sleep(1.0)

    def run_log(self, run_id: int) -> str:
        return self.flwr("log", str(run_id), FEDERATION, "--show", timeout=60)

    # ------------------------------------------------------------------ faults and clean-up
    def kill_silo(self, k: int) -> None:
        """SIGKILL silo ``k``'s SuperNode and everything it started (its ClientApp)."""
        proc = self.processes.get(f"silo-{k}")
        if proc is not None and proc.poll() is None:
            signal_processes(process_tree(proc.pid), signal.SIGKILL)
            proc.wait(timeout=10)

    def stop(self) -> None:
        """End every process started here and everything they started."""
        trees = {name: process_tree(proc.pid) for name, proc in self.processes.items() if proc.poll() is None}
        for members in trees.values():
            signal_processes(members, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name in trees:
            try:
                self.processes[name].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for members in trees.values():  # whatever ignored SIGTERM
            signal_processes(members, signal.SIGKILL)

    def __enter__(self) -> "LocalFederation":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
