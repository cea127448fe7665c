"""A whole Flower federation on this machine's loopback: one SuperLink, and per silo its
silo service (:mod:`.silo_service`) and its SuperNode, each its own process, with TLS and
node authentication on by default (``fedveil deploy local``; the end-to-end test). It drives the same binaries and the same
``flwr`` CLI steps a consortium runs on separate machines (docs/deployment.md), so what
works here is the recipe there.

Every process gets its own ``FLWR_HOME`` and log file under the work folder and runs in
its own session, so :meth:`LocalFederation.kill_silo` can SIGKILL a silo's processes with
everything they started, and :meth:`LocalFederation.stop` leaves nothing behind. With
``hide_silos`` (root, Linux) every SuperNode, and so every ClientApp it starts, runs in
its own mount namespace where the silos' folder is an empty tmpfs: it reaches the silo
service's socket but not the silo's files, the separation the deployment guide asks of a
silo machine (there with a separate account or a container without the data volume).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .private_files import private_folder
from .silo_service import READY

FEDERATION = "local"
READY_LINE = "Application startup complete"
ACTIVATED_LINE = "Activated"


class FederationError(RuntimeError):
    """A Flower process did not start, a node was not registered, a run did not finish."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
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


HIDE = 'mount -t tmpfs -o size=1m,mode=0700 fedveil-hidden "$0" && exec "$@"'  # $0: the folder to hide


def hidden_from(folder: Path, args: list[str]) -> list[str]:
    """``args`` run in a new mount namespace where ``folder`` is an empty tmpfs (Linux, root)."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDE, str(folder), *args]


def can_hide_folders() -> bool:
    """Whether :func:`hidden_from` works here (root with mount namespaces: not in every container)."""
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "hidden"
        probe.mkdir()
        (probe / "secret").write_text("x")
        try:
            done = subprocess.run(hidden_from(probe, ["ls", "-A", str(probe)]), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return False
    return done.returncode == 0 and done.stdout.strip() == ""


def _binary(name: str) -> str:
    """A Flower executable: beside this interpreter (a virtual environment), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise FederationError(f"'{name}' not found: pip install 'fedveil[flower]'")
    return found


@dataclass
class LocalFederation:
    """A SuperLink and, per silo, its service and SuperNode as processes
    on this machine, with their folders, ports and logs under ``workdir``."""

    workdir: Path
    num_silos: int
    tls: bool = True
    auth: bool = True
    silo_root: Path | None = None  # the folders of `fedveil deploy prepare` (default: workdir/silos)
    silo_options: dict[int, dict[str, Any]] = field(default_factory=dict)  # per silo: `fedveil deploy silo` flags
    hide_silos: bool = False  # run every SuperNode (and its ClientApps) where silo_root is empty; needs root
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
        for sub in ("certs", "keys", "sockets"):  # private keys; sockets only this account may use
            private_folder(self.workdir / sub)
        if self.hide_silos and not can_hide_folders():
            raise FederationError("hide_silos: this machine cannot mount a private tmpfs in a new mount namespace (needs root)")

    # ------------------------------------------------------------------ processes
    def _env(self, home: str) -> dict[str, str]:
        path = self.workdir / "home" / home
        path.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, FLWR_HOME=str(path), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # flwr-serverapp / -clientapp
        return env

    def log(self, name: str) -> Path:
        """The log file of process ``name``."""
        return self.workdir / "logs" / f"{name}.log"

    def _spawn(self, name: str, args: list[str], home: str | Path) -> subprocess.Popen:
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

    def _lines(self, name: str, text: str) -> int:
        return self.log(name).read_text(errors="replace").count(text) if self.log(name).exists() else 0

    def _link_lines(self, text: str) -> int:
        return self._lines("superlink", text)

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
        self._start_link(tls, timeout)
        if self.auth:
            for k in range(self.num_silos):
                _, public = make_node_keys(self.workdir / "keys", f"node-{k}")
                self.register(public)
        for k in range(self.num_silos):
            self.start_silo(k)
        self._wait_for(f"{self.num_silos} SuperNodes active", lambda: self._link_lines(ACTIVATED_LINE) >= self.num_silos, timeout)
        return self

    def _start_link(self, tls: list[str], timeout: float) -> None:
        """The SuperLink, its state in ``workdir/superlink.db`` (so a restart keeps nodes and runs)."""
        self._tls_args = tls
        link = [_binary("flower-superlink"), *(tls or ["--insecure"]), "--host", "127.0.0.1", "--port", str(self.port),
                "--disable-runtime-dependency-installation", "--database", str(self.workdir / "superlink.db")]
        if self.auth:
            link.append("--enable-supernode-auth")
        ready = self._link_lines(READY_LINE)
        proc = self._spawn("superlink", link, "link")
        self._wait_for("SuperLink start", lambda: self._link_lines(READY_LINE) > ready, timeout, proc)

    def restart_link(self, timeout: float = 120.0) -> None:
        """SIGKILL the SuperLink with everything it started (a running ServerApp), start it
        again on the same port and database. The SuperNodes reconnect by themselves (their
        registration is in the database); a ServerApp waits for them when it looks for its silos."""
        proc = self.processes["superlink"]
        signal_processes(process_tree(proc.pid), signal.SIGKILL)
        proc.wait(timeout=10)
        self._start_link(self._tls_args, timeout)

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

    def start_silo(self, k: int, key: Path | None = None, with_service: bool = True, timeout: float = 60.0) -> subprocess.Popen:
        """Start silo ``k``'s service, unless it runs or ``with_service`` is false (a node
        without a silo), then its SuperNode (again, after a kill: same key, same options);
        returns the SuperNode's process."""
        socket_path = self.socket(k)
        service = self.processes.get(f"service-{k}")
        if with_service and (service is None or service.poll() is not None):
            ready = self._lines(f"service-{k}", READY)
            service = self._spawn(f"service-{k}", self._service_args(k, socket_path), f"service-{k}")
            self._wait_for(f"silo {k}'s service", lambda: self._lines(f"service-{k}", READY) > ready, timeout, service)
        args = [_binary("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}", "--port", str(self.node_ports.setdefault(k, free_port())),
                "--node-config", f"silo-socket={json.dumps(str(socket_path))}"]
        args += ["--root-certificates", str(self.workdir / "certs" / "ca.crt")] if self.tls else ["--insecure"]
        if self.auth or key is not None:
            args += ["--auth-supernode-private-key", str(key or self.workdir / "keys" / f"node-{k}")]
        return self._spawn(f"silo-{k}", hidden_from(self.silo_root, args) if self.hide_silos else args, f"silo-{k}")

    def _service_args(self, k: int, socket_path: Path) -> list[str]:
        args = [sys.executable, "-m", "fedveil", "deploy", "silo", "--silo-dir", str(self.silo_dir(k)), "--socket", str(socket_path)]
        for name, value in self.silo_options.get(k, {}).items():
            flag = "--" + name.replace("_", "-")
            args += [flag, json.dumps(value) if isinstance(value, bool) else str(value)]
        return args

    def socket(self, k: int) -> Path:
        """Silo ``k``'s service socket."""
        return self.workdir / "sockets" / f"silo-{k}.sock"

    def silo_dir(self, k: int) -> Path:
        """Silo ``k``'s folder under ``silo_root``."""
        return self.silo_root / f"silo-{k}"

    # ------------------------------------------------------------------ runs
    def submit(self, app: str | Path, run_config: dict[str, Any] | None = None) -> int:
        """``flwr run APP``; returns the run id."""
        args = ["run", str(app), FEDERATION, "--format", "json"]
        if run_config:
            args += ["--run-config", " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())]
        out = json.loads(self.flwr(*args))
        if not out.get("success"):
            raise FederationError(f"flwr run {app}: {str(out.get('error-message', out)).strip()[-400:]}")
        return int(out["run-id"])

    def status(self, run_id: int) -> str:
        """The status of run ``run_id`` as ``flwr ls`` reports it (``"unknown"`` if not listed)."""
        runs = json.loads(self.flwr("ls", FEDERATION, "--run-id", str(run_id), "--format", "json"))["runs"]
        return str(runs[0]["status"]) if runs else "unknown"

    def wait(self, run_id: int, timeout: float, poll: float = 3.0) -> str:
        """Wait until run ``run_id`` has finished; its final status (e.g. ``finished:completed``).
        Each poll is a ``flwr`` process (about a CPU-second), hence every ``poll`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            if time.monotonic() > deadline:
                raise FederationError(f"run {run_id} still '{status}' after {timeout:.0f} s")
            time.sleep(poll)

    def run_log(self, run_id: int) -> str:
        """The log of run ``run_id`` (``flwr log``)."""
        return self.flwr("log", str(run_id), FEDERATION, "--show", timeout=60)

    # ------------------------------------------------------------------ faults and clean-up
    def kill_silo(self, k: int) -> None:
        """SIGKILL silo ``k``'s SuperNode and service, and everything they started (its ClientApp)."""
        for name in (f"silo-{k}", f"service-{k}"):
            proc = self.processes.get(name)
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
