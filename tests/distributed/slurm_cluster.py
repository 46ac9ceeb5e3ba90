"""A real Slurm cluster for tests (Debian's slurm-wlm and munge, installed when missing): one
slurmctld and one slurmd per node, each node either this machine (single-node, 127.0.0.1) or a
network namespace of an emulated cluster (`launch/emulate_cluster.py`), where each slurmd has its
own NodeName, address, spool, log and pid file and slurmctld runs beside node 0's.

    with SlurmCluster.single_node(root) as c: c.sbatch("--ntasks=2", script, env=...)
    with SlurmCluster.on(emulated, root) as c: c.sbatch("--nodes=2", ...)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, _base_env

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def ensure_installed() -> None:
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("Slurm is not installed and apt-get as root is not available here")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"],
                    ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.skip(f"cannot install Slurm ({' '.join(command)}): {proc.stderr[-500:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str
    prefix: tuple[str, ...] = ()  # how to run a command "on" it (ip netns exec NS)


def job_fields(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split() if "=" in item)


class SlurmCluster:
    """slurmctld + one slurmd per node + munged, all in `root`; clients run on node 0."""

    def __init__(self, root: Path, nodes: list[SlurmNode], cpus_per_node: int) -> None:
        self.root = root
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.conf = root / "slurm.conf"
        self.env = {**_base_env(), "SLURM_CONF": str(self.conf)}
        self.processes: list[subprocess.Popen] = []
        self._held_since: dict[tuple[str, str | None], float] = {}

    @classmethod
    def single_node(cls, root: Path) -> SlurmCluster:
        host = socket.gethostname().split(".")[0]
        return cls(root, [SlurmNode(host, "127.0.0.1")], max(os.cpu_count() or 2, 2))

    @classmethod
    def on(cls, emulated, root: Path, cpus_per_node: int | None = None) -> SlurmCluster:
        """One slurmd in each namespace of an `EmulatedCluster`."""
        nodes = [SlurmNode(n.hostname, n.address, tuple(emulated.daemon_args(n, [])))
                 for n in emulated.nodes]
        return cls(root, nodes, cpus_per_node or emulated.gpus_per_node)

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A client command (sinfo, scontrol, scancel, ...) on node 0."""
        return subprocess.run([*self.nodes[0].prefix, *command], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def _conf_text(self, socket_path: Path) -> str:
        # slurmctld insists on the machine's own name; it listens on node 0's address.
        root, head = self.root, self.nodes[0]
        multi = len(self.nodes) > 1
        # %n: each slurmd's own node name, so daemons of one machine never share a file.
        per_node = "-%n" if multi else ""
        node_lines = "".join(f"NodeName={n.name} NodeAddr={n.address} "
                             f"CPUs={self.cpus_per_node} State=UNKNOWN\n" for n in self.nodes)
        return f"""ClusterName=lgs-test
SlurmctldHost={socket.gethostname().split(".")[0]}({head.address})
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool{per_node}
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd{per_node}.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd{per_node}.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0
{"SlurmdParameters=config_overrides" if multi else ""}
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

    def start(self) -> None:
        root = self.root
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = root / "munge.socket"
        munged = subprocess.run(
            ["munged", "--force", f"--key-file={key}", f"--socket={socket_path}",
             f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
             f"--seed-file={root}/munged.seed"], capture_output=True, text=True, timeout=30)
        assert munged.returncode == 0, munged.stderr
        (root / "state").mkdir()
        multi = len(self.nodes) > 1
        for node in self.nodes:
            (root / (f"spool-{node.name}" if multi else "spool")).mkdir()
        self.conf.write_text(self._conf_text(socket_path))
        daemons = [("slurmctld", self.nodes[0], [])]
        daemons += [("slurmd", n, ["-N", n.name] if multi else []) for n in self.nodes]
        for daemon, node, extra in daemons:
            log = root / (f"{daemon}-{node.name}.stderr" if daemon == "slurmd" and multi
                          else f"{daemon}.stderr")
            self.processes.append(subprocess.Popen(
                [*node.prefix, daemon, "-D", "-f", str(self.conf), *extra], env=self.env,
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(log, "w")))
            self.processes[-1].log = log  # type: ignore[attr-defined]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    text = proc.log.read_text()  # type: ignore[attr-defined]
                    raise AssertionError(f"{proc.args} exited: {text[-2000:]}")
            states = self.run("sinfo", "-h", "-N", "-o", "%t").stdout.split()
            if states == ["idle"] * len(self.nodes):
                return
            time.sleep(0.5)
        raise AssertionError(f"nodes never became idle: {self.run('sinfo').stdout}")

    def submit(self, *args: str, env: dict[str, str]) -> str:
        proc = subprocess.run([*self.nodes[0].prefix, "sbatch", "--parsable", *args],
                              env={**self.env, **env}, capture_output=True, text=True,
                              timeout=60, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    def job(self, job: str) -> dict[str, str]:
        return job_fields(self.run("scontrol", "show", "job", job).stdout)

    def wait(self, job: str, timeout: float = 900) -> tuple[str, str]:
        """Wait for the end; returns (JobState, ExitCode) from scontrol."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job(job)
            if fields.get("JobState") in FINAL_STATES:
                return fields["JobState"], fields["ExitCode"]
            self.hurry_requeued(fields)
            time.sleep(0.5)
        raise AssertionError(f"job {job} did not finish")

    def hurry_requeued(self, fields: dict[str, str]) -> None:
        """Start a requeued job at once instead of after Slurm's hold of a credential lifetime
        (~2 min) - but only 1.5 s after we first saw it held. A requeue revokes the job's
        credential on its nodes, and slurmd compares a credential's creation time with the
        revocation at one-second resolution: a restart within the same second is refused
        ("Killing non-startable batch JobId=N: Job credential revoked") and the job ends
        FAILED with exit 1. Releasing the hold at once was the suite's "1 preemption in 4
        ends FAILED" (Slurm's own hold exists to avoid exactly this)."""
        if fields.get("JobState") != "PENDING" or fields.get("Reason") != "BeginTime":
            return
        key = (fields["JobId"], fields.get("Restarts"))
        first_seen = self._held_since.setdefault(key, time.monotonic())
        if time.monotonic() - first_seen >= 1.5:
            self.run("scontrol", "update", f"JobId={fields['JobId']}", "StartTime=now")

    def sbatch(self, *args: str, env: dict[str, str]) -> tuple[str, str]:
        """Submit, wait for the end; returns (JobState, ExitCode) from scontrol."""
        return self.wait(self.submit(*args, env=env))

    def stop(self) -> None:
        if self.conf.exists():
            self.run("scancel", "--full", "--user=root")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.run("squeue", "-h").stdout.strip():
                time.sleep(0.5)
            self.run("scontrol", "shutdown")
        for proc in self.processes:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        pid_file = self.root / "munged.pid"
        if pid_file.exists():
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                return
            # munged writes its seed file on the way out: wait, or it recreates the root the
            # fixtures remove next.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.05)


def python_for_jobs() -> str:
    venv = REPO / ".venv/bin/python"
    return str(venv) if venv.exists() else shutil.which("python3") or "python3"


def make_root(prefix: str) -> Path:
    """munged wants o+x on its socket's directory and all above it; pytest's tmp_path is 0700."""
    import tempfile
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    return root
