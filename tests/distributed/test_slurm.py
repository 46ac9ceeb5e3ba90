"""launch/slurm/pretrain_gpt.sbatch under a real single-node Slurm cluster (Debian's slurm-wlm
and munge, installed here when missing), 2 tasks, to a checkpoint; a second submission resumes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, _base_env

pytestmark = pytest.mark.slow

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]


def _ensure_installed() -> None:
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**_base_env(), "SLURM_CONF": str(self.conf)}
        self.processes: list[subprocess.Popen] = []

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def start(self) -> None:
        root, host = self.root, socket.gethostname().split(".")[0]
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = root / "munge.socket"
        munged = subprocess.run(
            ["munged", "--force", f"--key-file={key}", f"--socket={socket_path}",
             f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
             f"--seed-file={root}/munged.seed"], capture_output=True, text=True, timeout=30)
        assert munged.returncode == 0, munged.stderr
        for sub in ("state", "spool"):
            (root / sub).mkdir()
        cpus = os.cpu_count() or 2
        self.conf.write_text(f"""ClusterName=lgs-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={max(cpus, 2)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        for daemon in ("slurmctld", "slurmd"):
            self.processes.append(subprocess.Popen(
                [daemon, "-D", "-f", str(self.conf)], env=self.env, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=open(root / f"{daemon}.stderr", "w")))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    log = (root / f"{proc.args[0]}.stderr").read_text()
                    raise AssertionError(f"{proc.args[0]} exited: {log[-2000:]}")
            state = self.run("sinfo", "-h", "-o", "%t").stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise AssertionError(f"node never became idle: {self.run('sinfo').stdout}")

    def sbatch(self, *args: str, env: dict[str, str]) -> tuple[str, str]:
        """Submit, wait for the end; returns (JobState, ExitCode) from scontrol."""
        proc = subprocess.run(["sbatch", "--parsable", *args], env={**self.env, **env},
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            info = self.run("scontrol", "show", "job", job).stdout
            fields = dict(item.split("=", 1) for item in info.split() if "=" in item)
            if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                          "NODE_FAIL", "OUT_OF_MEMORY"):
                return fields["JobState"], fields["ExitCode"]
            time.sleep(1)
        raise AssertionError(f"job {job} did not finish")

    def stop(self) -> None:
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
        pid_file = self.root / "munged.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    _ensure_installed()
    # munged wants o+x on its socket's directory and all above it; pytest's tmp_path is 0700.
    root = Path(tempfile.mkdtemp(prefix="lgs-slurm-", dir="/tmp"))
    root.chmod(0o755)
    c = Cluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_sbatch_trains_two_tasks_to_a_checkpoint_then_resumes(cluster, data_cache):
    save = cluster.root / "ckpt"
    out = cluster.root / "job-%j.out"
    small = ["--num-layers", "2", "--vocab-size", "512", "--data-cache-dir", data_cache,
             "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1"]
    env = {"SAVE": str(save), "CONFIG": "tiny-cpu", "PYTHON": str(REPO / ".venv/bin/python")
           if (REPO / ".venv/bin/python").exists() else shutil.which("python3")}

    state, code = cluster.sbatch("--ntasks=2", f"--output={out}",
                                 "launch/slurm/pretrain_gpt.sbatch", "--train-iters", "4",
                                 *small, env=env)
    logs = "\n".join(p.read_text() for p in cluster.root.glob("job-*.out"))
    assert (state, code) == ("COMPLETED", "0:0"), logs[-4000:]
    assert "2 ranks on 1 node(s)" in logs and "x DP 2" in logs
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "4"

    state, code = cluster.sbatch("--ntasks=2", f"--output={out}",
                                 "launch/slurm/pretrain_gpt.sbatch", "--train-iters", "6",
                                 *small, env=env)
    logs = "\n".join(p.read_text() for p in cluster.root.glob("job-*.out"))
    assert (state, code) == ("COMPLETED", "0:0"), logs[-4000:]
    assert f"loaded checkpoint from {save} at iteration 4" in logs
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "6"


def test_preempted_job_saves_requeues_itself_and_finishes(cluster, data_cache):
    save = cluster.root / "ckpt-preempt"
    out = cluster.root / "preempt-%j.out"
    env = {"SAVE": str(save), "CONFIG": "tiny-cpu", "PYTHON": str(REPO / ".venv/bin/python")
           if (REPO / ".venv/bin/python").exists() else shutil.which("python3")}
    submit = subprocess.run(
        ["sbatch", "--parsable", "--ntasks=2", f"--output={out}",
         "launch/slurm/pretrain_gpt.sbatch", "--train-iters", "300", "--num-layers", "2",
         "--vocab-size", "512", "--data-cache-dir", data_cache, "--log-interval", "1",
         "--eval-interval", "1000", "--eval-iters", "1"],
        env={**cluster.env, **env}, capture_output=True, text=True, timeout=60, cwd=REPO)
    job = submit.stdout.strip()
    metrics = save / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 5):
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.5)
    # What Slurm does before a time limit (--signal=B:TERM@120), delivered now.
    cluster.run("scancel", "--batch", "--signal=TERM", job)
    deadline = time.monotonic() + 900
    while True:
        info = cluster.run("scontrol", "show", "job", job).stdout
        fields = dict(item.split("=", 1) for item in info.split() if "=" in item)
        if fields.get("JobState") == "COMPLETED" and fields.get("Restarts") == "1":
            break
        if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
            # Slurm holds a requeued job for a while before it may start again; an admin's
            # `StartTime=now` shortens the wait without changing what happens next.
            cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now")
        assert fields.get("JobState") not in ("FAILED", "CANCELLED", "TIMEOUT"), info
        assert time.monotonic() < deadline, info
        time.sleep(1)
    logs = "\n".join(p.read_text() for p in cluster.root.glob("preempt-*.out"))
    assert "received SIGTERM" in logs and "preempted; requeueing" in logs
    resumed_at = int(logs.split(f"loaded checkpoint from {save} at iteration ")[1].split()[0])
    assert 5 <= resumed_at < 300
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "300"
