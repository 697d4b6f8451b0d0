"""A real Flower deployment on this machine: one SuperLink and N SuperNodes over loopback with TLS and SuperNode
authentication, and `flwr run`.

What `bayesadmm flower demo` and the deployment test run, step by step (docs/deploy.md does the same by hand on
separate machines):

1. certificates: a throw-away CA and a server certificate for 127.0.0.1/localhost (`make_certificates`);
2. `flower-superlink` with that certificate and ``--enable-supernode-auth``, on a free port of 127.0.0.1 (Fleet,
   Control and ServerAppIo APIs share it in flwr 1.42), not installing app dependencies at run time (bayesadmm is
   already installed here);
3. a Flower config (``$FLWR_HOME/config.toml``, in the work directory, so the user's own ~/.flwr is untouched)
   naming that SuperLink; per SuperNode an ECDSA key pair (`make_node_key`) whose public key is registered with
   ``flwr supernode register`` (the SuperLink refuses any other node);
4. N `flower-supernode`s trusting the CA and holding their private key, each with its own ``--node-config`` (for
   the demo
   ``partition-id=k num-partitions=N data=client-k.pt``, its file of the preset's split, `write_node_files`) and
   its own free port for its ClientApp API; then `flwr run <the presets' app> <connection> --run-config ...`;
5. wait until the ServerApp writes a final status.json in the run directory (bounded by `timeout`); optionally kill
   one SuperNode (its whole process group, ClientApps included) after a given round, and start it again;
6. stop every process it started, whatever happened (process groups, SIGTERM then SIGKILL).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import resolve
from bayesadmm.flower.certificates import make_certificates, make_node_key
from bayesadmm.flower.loaders import save_tensors
from bayesadmm.flower.preset import preset_app

CONNECTION = "bayesadmm-demo"


class DeploymentError(RuntimeError):
    """The deployment did not come up or the run did not finish; the message says which and where the logs are."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _program(process: subprocess.Popen) -> str:
    """The program a process runs, for messages (its argv[0], or the command it was given as one string)."""
    args = process.args
    return os.fsdecode(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DeploymentError(f"{_program(process)} exited with code {process.returncode}; see {log}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise DeploymentError(f"{_program(process)} did not listen on port {port} within {timeout:g} s; see {log}")


@dataclass
class Deployment:
    """The processes of a loopback deployment; a context manager that always stops them."""

    workdir: Path
    supernodes: int
    node_configs: list[str] = field(default_factory=list)  # each SuperNode's --node-config (default: its partition)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    port: int = 0

    def __post_init__(self):
        self.workdir.mkdir(parents=True, exist_ok=True)
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "FLWR_HOME": str(self.workdir / "flwr-home"),
            "PYTHONUNBUFFERED": "1",
            "FLWR_TELEMETRY_ENABLED": os.environ.get("FLWR_TELEMETRY_ENABLED", "0"),
            "FLWR_DISABLE_UPDATE_CHECK": os.environ.get("FLWR_DISABLE_UPDATE_CHECK", "1"),
        }
        self.bin = Path(bin_dir)

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        self.logs[name] = log
        with log.open("ab") as out:
            # a new session per process: killing its group also ends the ServerApp/ClientApp subprocesses it spawns
            process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,
            )
        self.processes[name], self.argv[name] = process, argv
        return process

    def start(self, timeout: float = 60.0) -> Deployment:
        self.ca, cert, key = make_certificates(self.workdir / "certificates")
        self.port = free_port()
        superlink = self._start(
            "superlink",
            [
                str(self.bin / "flower-superlink"),
                "--ssl-ca-certfile",
                str(self.ca),
                "--ssl-certfile",
                str(cert),
                "--ssl-keyfile",
                str(key),
                "--enable-supernode-auth",  # only SuperNodes whose public key was registered below may connect
                "--host",
                "127.0.0.1",  # Fleet, Control and ServerAppIo APIs share this port in flwr 1.42: loopback only
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
                "--database",
                str(self.workdir / "superlink.db"),
            ],
        )
        _wait_for_port(self.port, superlink, self.logs["superlink"], timeout)
        home = self.workdir / "flwr-home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{self.ca}"\n'
        )
        for k in range(self.supernodes):
            private, public = make_node_key(self.workdir / "keys", f"supernode-{k}")
            self.register(public)
            self.start_supernode(
                f"supernode-{k}",
                self.node_configs[k] if self.node_configs else f"partition-id={k} num-partitions={self.supernodes}",
                private,
            )
        return self

    def register(self, public_key: Path, timeout: float = 60.0) -> None:
        """`flwr supernode register PUBLIC_KEY`: the SuperLink lets in a SuperNode holding the matching private key."""
        argv = [str(self.bin / "flwr"), "supernode", "register", str(public_key), CONNECTION]
        done = subprocess.run(argv, env=self.env, cwd=self.workdir, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise DeploymentError(f"flwr supernode register {public_key.name} failed: {done.stdout}{done.stderr}")

    def start_supernode(self, name: str, node_config: str, private_key: Path) -> subprocess.Popen:
        """A SuperNode authenticating with `private_key` (its public key must be registered, or the SuperLink
        refuses it and it exits)."""
        return self._start(
            name,
            [
                str(self.bin / "flower-supernode"),
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--root-certificates",
                str(self.ca),
                "--auth-supernode-private-key",
                str(private_key),
                "--port",
                str(free_port()),
                "--node-config",
                node_config,
            ],
        )

    def flwr_run(self, app_dir: Path, run_config: dict) -> subprocess.Popen:
        """`flwr run APP CONNECTION --run-config ... --stream`: starts the run, then streams its log."""
        pairs = " ".join(f"{key}={json.dumps(value)}" for key, value in run_config.items())
        return self._start(
            "flwr-run", [str(self.bin / "flwr"), "run", str(app_dir), CONNECTION, "--run-config", pairs, "--stream"]
        )

    def kill(self, name: str) -> None:
        """SIGKILL a process and everything it started (a SuperNode dies with its ClientApps)."""
        process = self.processes[name]
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=10)

    def restart(self, name: str) -> subprocess.Popen:
        """Start a killed process again with its arguments. A SuperNode comes back as the same node (its key names
        it), but only once the SuperLink has marked the killed one offline (up to a minute: two missed heartbeats of
        30 s); until then the SuperLink refuses it and it exits, so `run_deployment` starts it again."""
        return self._start(name, self.argv[name])

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # the group may outlive its leader (a ServerApp or ClientApp subprocess): end it too
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if process.poll() is None:
                process.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _rounds_done(run_dir: Path) -> int:
    try:
        return sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def run_demo(
    scenario: str = "fmnist-heterog10",
    overrides: tuple[str, ...] = (),
    supernodes: int = 3,
    rounds: int = 3,
    out: Path | None = None,
    workdir: Path | None = None,
    kill_after_round: int | None = None,
    round_timeout: float = 120.0,
    timeout: float = 900.0,
    echo=print,
) -> dict:
    """Run `scenario` on a loopback deployment, each SuperNode reading only its own file of the preset's split
    (`write_node_files`); returns {"status", "run_dir", "metrics" (last line), "workdir", "killed"}.

        `kill_after_round`: SIGKILL the last SuperNode once that round's metrics line is written (the run must then
        complete with the others). `timeout` bounds the whole run."""
    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="bayesadmm-flower-"))
    out = Path(out).resolve() if out else (workdir / "run").resolve()
    run_config = {
        "scenario": scenario,
        "out": str(out),
        "round-timeout": float(round_timeout),
        "overrides": " ".join([f"clients={supernodes}", f"rounds={rounds}", *map(shlex.quote, overrides)]),
    }
    node_configs = [
        f'partition-id={k} num-partitions={supernodes} data="{path}"'
        for k, path in enumerate(write_node_files(scenario, str(run_config["overrides"]), workdir / "data"))
    ]
    return run_deployment(
        preset_app(), run_config, node_configs, workdir, kill_after_round=kill_after_round, timeout=timeout, echo=echo
    )


def write_node_files(scenario: str, overrides: str, folder: Path) -> list[Path]:
    """Each client's examples of a preset in a file of its own, `folder/client-K.pt` (the preparation step of a
    deployment: each SuperNode then reads only its file)."""
    config, _ = resolve(scenario, shlex.split(overrides))
    clients = build(config).federation.clients
    files = []
    for k in sorted(clients.sizes):
        data = clients(k)
        files.append(save_tensors(folder / f"client-{k}.pt", data.X, data.y))  # type: ignore[attr-defined]
    return files


def run_deployment(
    app_dir: Path,
    run_config: dict,
    node_configs: list[str],
    workdir: Path,
    kill_after_round: int | None = None,
    restart: bool = False,
    timeout: float = 900.0,
    echo=print,
) -> dict:
    """`flwr run app_dir` on a loopback deployment with TLS and SuperNode authentication, one SuperNode per node
    config, until the run directory (run_config["out"]) has a final status; returns {"status", "run_dir", "metrics"
    (last line), "workdir", "killed"}. `kill_after_round`: SIGKILL the last SuperNode once that round's metrics line
    is written, and with `restart` start it again (it comes back as the same node, named by its key, and gets its
    client's state)."""
    out = Path(run_config["out"])
    with Deployment(Path(workdir), len(node_configs), list(node_configs)) as deployment:
        deployment.start()
        echo(
            f"SuperLink on 127.0.0.1:{deployment.port} (TLS, CA {deployment.ca}; SuperNode authentication); "
            f"{len(node_configs)} SuperNodes; "
            f"logs in {workdir}"
        )
        runner = deployment.flwr_run(app_dir, run_config)
        deadline, killed, ended = time.monotonic() + timeout, False, 0.0
        victim = f"supernode-{len(node_configs) - 1}"
        while True:
            status = _status(out)
            if status.get("status") in ("completed", "stopped", "diverged", "failed"):
                break
            if kill_after_round is not None and not killed and _rounds_done(out) >= kill_after_round:
                deployment.kill(victim)
                killed = True
                echo(f"killed {victim} (client {len(node_configs) - 1}) after round {kill_after_round}")
                if restart:
                    deployment.restart(victim)
                    echo(f"started {victim} again")
            if restart and killed and deployment.processes[victim].poll() is not None:
                time.sleep(5)  # refused while the SuperLink still counts the killed node as online: try again
                deployment.restart(victim)
            if runner.poll() is not None and runner.returncode != 0:
                raise DeploymentError(f"flwr run failed (code {runner.returncode}); see {deployment.logs['flwr-run']}")
            if runner.poll() is not None:  # the run ended: its final status is written before, give it a moment
                ended = ended or time.monotonic()
                if time.monotonic() - ended > 10:
                    raise DeploymentError(f"the run ended without a final status; see {deployment.logs['flwr-run']}")
            if time.monotonic() > deadline:
                raise DeploymentError(f"the run did not finish within {timeout:g} s; logs in {workdir}")
            time.sleep(0.5)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        "status": status,
        "run_dir": out,
        "metrics": lines[-1] if lines else {},
        "workdir": workdir,
        "killed": killed,
    }
