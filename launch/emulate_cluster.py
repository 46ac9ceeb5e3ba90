"""N emulated "nodes" on one machine: one Linux network namespace per node, joined by veth links
whose egress a `tbf` qdisc limits to the inter-node bandwidth. Needs root and iproute2.

Command line (the interface checks outside the repository use):

    python launch/emulate_cluster.py --nodes 2 --gpus-per-node 2 --inter-gbit 1 -- CMD ...

runs CMD once per node inside that node's namespace with NNODES, NODE_RANK, MASTER_ADDR,
MASTER_PORT, GLOO_SOCKET_IFNAME (and GPUS_PER_NODE) set, e.g.

    ... -- sh -c 'torchrun --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node 2 \\
        --master-addr $MASTER_ADDR --master-port $MASTER_PORT pretrain_gpt.py ...'

It prints the measured inter-node bandwidth once at start (the best of three TCP blasts of a
few MB from node 0 to node 1, well under a second), and exits with the first non-zero exit
status of any node (0 when all succeed). When a node fails, the others get `--failure-timeout`
seconds (default 60) to end on their own, then SIGTERM, then SIGKILL 10 s later: a lost peer
never leaves the rest hanging.

Topology. Node i is namespace `lgsec-<pid>-<hex>-n<i>` with interface `ecl0` at 10.77.0.<i+1>
and hostname `node<i>` (in the namespace's own /etc/hosts, through `ip netns exec`'s /etc/netns/
files, where the machine's own name resolves to the node's address). Two nodes share one veth
pair; more go through a bridge that lives in its own namespace (`...-br`), so nothing is added
to the host's network. Every inter-node hop is limited both ways (node egress, and the bridge
port's egress towards the node). Traffic between the ranks of one node goes to the node's own
address and takes the kernel's local path (fast, unlimited). Addresses exist only inside these
namespaces; nothing is routed out of them.

Clean-up. Every namespace, link, hosts file and process (anything still running inside a
namespace, e.g. a slurmd's job steps) is removed on exit, on an exception, on Ctrl-C and on
SIGTERM (the command line turns SIGTERM into an exception). Namespaces left by an owner that
was SIGKILLed are removed by the next cluster that starts (the owner's pid is in the name).

Python API (tests and benchmarks):

    from launch.emulate_cluster import emulated_cluster

    with emulated_cluster(nodes=2, gpus_per_node=2, inter_gbit=1.0) as c:
        c.inter_bandwidth()                  # measured bits/s, node 0 -> node 1
        c.intra_bandwidth()                  # measured bits/s inside node 0
        exits = c.run_on_nodes(["sh", "-c", "..."], log_dir=tmp)  # .codes, .status
        proc = c.popen(c.nodes[1], ["slurmd", ...])                # a process in node 1
        c.kill_node(c.nodes[1])              # SIGKILL everything running in node 1
        c.cut_link(c.nodes[1])               # or take its link down
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "lgsec-"
IFNAME = "ecl0"
SUBNET = "10.77.0"
DEFAULT_MASTER_PORT = 29500  # each namespace has its own port space: no clash with other runs
PROBE_PORT = 29400
NETPROBE = Path(__file__).resolve().with_name("netprobe.py")


class ClusterError(RuntimeError):
    """The cluster cannot be built here (not root, no iproute2, a command failed)."""


@dataclass(frozen=True)
class Node:
    index: int
    netns: str
    address: str
    hostname: str


@dataclass
class EmulatedCluster:
    """Namespaces, links and processes of one emulated cluster; build with `emulated_cluster`."""

    num_nodes: int
    gpus_per_node: int
    inter_gbit: float
    run_id: str = field(default_factory=lambda: f"{os.getpid()}-{secrets.token_hex(3)}")
    nodes: list[Node] = field(default_factory=list)
    bridge_netns: str | None = None
    _processes: list[subprocess.Popen] = field(default_factory=list)
    _next_port: int = DEFAULT_MASTER_PORT

    # -- building and removing ------------------------------------------------------------------
    def create(self) -> None:
        check_prerequisites()
        remove_orphans()
        base = f"{PREFIX}{self.run_id}"
        self.nodes = [Node(i, f"{base}-n{i}", f"{SUBNET}.{i + 1}", f"node{i}")
                      for i in range(self.num_nodes)]
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.hostname}\n"
                                                  for n in self.nodes)
        for node in self.nodes:
            _ip("netns", "add", node.netns)
            etc = Path("/etc/netns") / node.netns
            etc.mkdir(parents=True, exist_ok=True)
            # The machine's own name resolves to the node's address inside the node, as on a
            # real host (gloo, Slurm's srun and torch look themselves up by it).
            (etc / "hosts").write_text(f"{hosts}{node.address} {socket.gethostname()}\n")
            self._in(node.netns, "ip", "link", "set", "lo", "up")
        if self.num_nodes == 2:
            a, b = self.nodes
            self._in(a.netns, "ip", "link", "add", IFNAME, "type", "veth",
                     "peer", "name", IFNAME, "netns", b.netns)
        else:
            self.bridge_netns = f"{base}-br"
            _ip("netns", "add", self.bridge_netns)
            br = self.bridge_netns
            self._in(br, "ip", "link", "add", "br0", "type", "bridge")
            self._in(br, "ip", "link", "set", "br0", "up")
            for node in self.nodes:
                port = f"p{node.index}"
                self._in(br, "ip", "link", "add", port, "type", "veth",
                         "peer", "name", IFNAME, "netns", node.netns)
                self._in(br, "ip", "link", "set", port, "master", "br0")
                self._in(br, "ip", "link", "set", port, "up")
                self._limit(br, port)
        for node in self.nodes:
            self._in(node.netns, "ip", "addr", "add", f"{node.address}/24", "dev", IFNAME)
            self._in(node.netns, "ip", "link", "set", IFNAME, "up")
            self._limit(node.netns, IFNAME)
        self._wait_for_carrier()

    def _wait_for_carrier(self, timeout: float = 10.0) -> None:
        """A veth reports NO-CARRIER for a moment after both ends are up."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            while True:
                state = _run(self.exec_args(node, ["cat", f"/sys/class/net/{IFNAME}/operstate"]))
                if state.stdout.strip() == "up":
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"{node.hostname}: {IFNAME} has no carrier")
                time.sleep(0.05)

    def _limit(self, netns: str, dev: str) -> None:
        """tbf on dev's egress at the inter-node rate. The bucket holds 2 ms of traffic (at
        least 128 KB, more than one 64 KB GSO packet) so a short probe measures the rate."""
        rate_bytes = self.inter_gbit * 1e9 / 8
        burst = max(128 * 1024, int(rate_bytes * 0.002))
        self._in(netns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                 "rate", f"{self.inter_gbit * 1e9:.0f}bit", "burst", str(burst),
                 "latency", "50ms")

    def destroy(self) -> None:
        """Stop every process we started or that runs in our namespaces, remove the namespaces
        (their links go with them) and hosts files. Signals are held off meanwhile."""
        blocked = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            for proc in self._processes:
                _kill_group(proc)
            names = [n.netns for n in self.nodes] + ([self.bridge_netns]
                                                    if self.bridge_netns else [])
            for name in names:
                remove_netns(name)
            self._processes.clear()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    # -- running things inside nodes ------------------------------------------------------------
    def node_env(self, node: Node, master_port: int | None = None) -> dict[str, str]:
        return {"NNODES": str(self.num_nodes), "NODE_RANK": str(node.index),
                "MASTER_ADDR": self.nodes[0].address,
                "MASTER_PORT": str(master_port or DEFAULT_MASTER_PORT),
                "GLOO_SOCKET_IFNAME": IFNAME, "GPUS_PER_NODE": str(self.gpus_per_node)}

    def exec_args(self, node: Node | str, command: Sequence[str]) -> list[str]:
        netns = node.netns if isinstance(node, Node) else node
        return ["ip", "netns", "exec", netns, *command]

    def daemon_args(self, node: Node, command: Sequence[str]) -> list[str]:
        """Like `exec_args`, but entering only the node's network (and its /etc/hosts): `ip
        netns exec` mounts a fresh /sys without the cgroup file systems a slurmd needs."""
        hosts = Path("/etc/netns") / node.netns / "hosts"
        return ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--mount",
                "--propagation", "slave", "sh", "-c",
                f'mount --bind {hosts} /etc/hosts && exec "$@"', "sh", *command]

    def popen(self, node: Node, command: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `command` inside node's namespace, in its own session; stopped on exit."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.exec_args(node, command), **kwargs)
        self._processes.append(proc)
        return proc

    def run_on_nodes(self, command: Sequence[str], *, env: dict[str, str] | None = None,
                     log_dir: Path | None = None, timeout: float | None = None,
                     failure_timeout: float = 60.0) -> NodeExits:
        """Run `command` once per node with the rendezvous variables set; wait for all.

        Returns the nodes' exit codes and their order (`.status`: the CLI's). After the first
        failure the others get `failure_timeout` seconds, then SIGTERM, then SIGKILL; after
        `timeout` seconds in all, every node is stopped the same way."""
        port = self._next_port
        self._next_port += 1  # a later run must not meet this one's TIME_WAIT sockets
        procs = []
        for node in self.nodes:
            full_env = {**os.environ, **(env or {}), **self.node_env(node, port)}
            out = open(log_dir / f"node{node.index}.log", "w") if log_dir else None
            try:
                procs.append(self.popen(node, command, env=full_env, stdout=out,
                                        stderr=subprocess.STDOUT if out else None))
            finally:
                if out:
                    out.close()
        return wait_nodes(procs, timeout=timeout, failure_timeout=failure_timeout)

    def pids(self, node: Node) -> list[int]:
        out = _ip("netns", "pids", node.netns).stdout.split()
        return [int(p) for p in out]

    def kill_node(self, node: Node) -> list[int]:
        """SIGKILL every process in node's namespace (a node lost at once); returns the pids."""
        pids = self.pids(node)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def cut_link(self, node: Node) -> None:
        self._in(node.netns, "ip", "link", "set", IFNAME, "down")

    # -- measuring -----------------------------------------------------------------------------
    def bandwidth(self, src: Node, dst: Node, nbytes: int) -> float:
        """Bits per second of a TCP blast of nbytes from src to dst's address."""
        server = subprocess.Popen(
            self.exec_args(dst, [sys.executable, str(NETPROBE), "serve", dst.address,
                                 str(PROBE_PORT)]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            ready = server.stdout.readline().strip()
            if ready != "ready":
                raise ClusterError(f"bandwidth probe did not start: {server.stderr.read()}")
            client = subprocess.run(
                self.exec_args(src, [sys.executable, str(NETPROBE), "blast", dst.address,
                                     str(PROBE_PORT), str(nbytes)]),
                capture_output=True, text=True, timeout=120)
            if client.returncode != 0:
                raise ClusterError(f"bandwidth probe failed: {client.stderr.strip()}")
            server.wait(timeout=30)
            return float(client.stdout.strip())
        finally:
            _kill_group(server)

    def inter_bandwidth(self, repeats: int = 3) -> float:
        """Node 0 -> node 1, the best of `repeats` blasts of about 0.05 s of the set rate (at
        least 2 MB) after a 1 MB one that takes ARP and TCP slow start out of the figure. The
        best, because on a busy machine a descheduled sender only ever lowers a blast's rate."""
        src, dst = self.nodes[0], self.nodes[1]
        self.bandwidth(src, dst, 1 << 20)
        nbytes = max(2 << 20, int(self.inter_gbit * 1e9 / 8 * 0.05))
        return max(self.bandwidth(src, dst, nbytes) for _ in range(repeats))

    def intra_bandwidth(self, nbytes: int = 64 << 20, repeats: int = 3) -> float:
        """Inside node 0, to its own address (the kernel's local path); best of `repeats`."""
        node = self.nodes[0]
        return max(self.bandwidth(node, node, nbytes) for _ in range(repeats))

    def _in(self, netns: str, *command: str) -> None:
        _run(["ip", "netns", "exec", netns, *command])


@contextmanager
def emulated_cluster(nodes: int, gpus_per_node: int,
                     inter_gbit: float) -> Iterator[EmulatedCluster]:
    """Build the cluster, yield it, and remove everything it made whatever happens."""
    if nodes < 2:
        raise ValueError(f"an emulated cluster needs at least 2 nodes, got {nodes}")
    if gpus_per_node < 1 or inter_gbit <= 0:
        raise ValueError("--gpus-per-node must be >= 1 and --inter-gbit > 0")
    cluster = EmulatedCluster(nodes, gpus_per_node, inter_gbit)
    restore = _sigterm_raises()
    try:
        cluster.create()
        yield cluster
    finally:
        cluster.destroy()
        restore()


def _sigterm_raises():
    """While a cluster exists, SIGTERM raises SystemExit in the main thread (so the `finally`
    above removes the cluster; the default action would kill the owner and leave it behind),
    unless the program has its own handler. Returns the undo."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return lambda: None
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


# -- helpers ------------------------------------------------------------------------------------
def check_prerequisites() -> None:
    """Raise ClusterError with the reason when namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (ip netns, tc)")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise ClusterError(f"the emulated cluster needs iproute2 ('{tool}' not found)")


def unavailable_reason() -> str | None:
    """Why an emulated cluster cannot be built here, or None (for test skips)."""
    try:
        check_prerequisites()
    except ClusterError as e:
        return str(e)
    probe = f"{PREFIX}{os.getpid()}-probe-{secrets.token_hex(2)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    remove_netns(probe)
    return None


def remove_netns(name: str) -> None:
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for pid in listed.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


def remove_orphans() -> None:
    """Remove namespaces whose owner (the pid in the name) is gone, e.g. after a SIGKILL."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX):].split("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            remove_netns(name)


@dataclass(frozen=True)
class NodeExits:
    """Each node's exit code (negative: killed by that signal) and the order they ended in."""

    codes: list[int]
    order: list[int]

    @property
    def status(self) -> int:
        """The first non-zero code to happen, as a shell reports it (signal k: 128 + k)."""
        for i in self.order:
            if self.codes[i] != 0:
                return self.codes[i] if self.codes[i] > 0 else 128 - self.codes[i]
        return 0


def wait_nodes(procs: list[subprocess.Popen], *, timeout: float | None,
               failure_timeout: float) -> NodeExits:
    """Wait for all; after a failure (or the overall timeout) stop the rest, TERM then KILL."""
    stop_at = time.monotonic() + timeout if timeout else None
    order: list[int] = []
    failed_seen = False
    while True:
        for i, p in enumerate(procs):
            if i not in order and p.poll() is not None:
                order.append(i)
        if len(order) == len(procs):
            break
        first_bad = next((i for i in order if procs[i].returncode != 0), None)
        if first_bad is not None and not failed_seen:
            failed_seen = True
            deadline = time.monotonic() + failure_timeout
            stop_at = min(stop_at, deadline) if stop_at else deadline
            print(f"emulate_cluster: node {first_bad} exited with {procs[first_bad].returncode};"
                  f" the others get {failure_timeout:g} s before they are stopped",
                  file=sys.stderr, flush=True)
        if stop_at is not None and time.monotonic() >= stop_at:
            for i, p in enumerate(procs):
                if p.poll() is None:
                    print(f"emulate_cluster: node {i} still running; stopping it",
                          file=sys.stderr, flush=True)
                    _kill_group(p)
                    order.append(i)
            break
        time.sleep(0.1)
    return NodeExits([p.wait() for p in procs], order)


def _kill_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _ip(*args: str) -> subprocess.CompletedProcess:
    return _run(["ip", *args])


def _run(command: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(command)}: {proc.stderr.strip()}")
    return proc


# -- command line -------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit(_usage_error("give the command after '--'"))
    split = argv.index("--")
    parser = argparse.ArgumentParser(
        prog="emulate_cluster.py", description=__doc__.split("\n\n")[0],
        usage="%(prog)s --nodes N --gpus-per-node G --inter-gbit X -- CMD ...")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--inter-gbit", type=float, required=True)
    parser.add_argument("--failure-timeout", type=float, default=60.0,
                        help="seconds the other nodes get after one fails (default 60)")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise SystemExit(_usage_error("give the command after '--'"))
    if args.nodes < 2:
        raise SystemExit(_usage_error(f"--nodes must be >= 2, got {args.nodes}"))
    if args.gpus_per_node < 1:
        raise SystemExit(_usage_error(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}"))
    if not 0 < args.inter_gbit < math.inf:
        raise SystemExit(_usage_error(f"--inter-gbit must be finite and > 0, got "
                                      f"{args.inter_gbit}"))
    if not 0 <= args.failure_timeout < math.inf:
        raise SystemExit(_usage_error(f"--failure-timeout must be finite and >= 0, got "
                                      f"{args.failure_timeout}"))
    return args, command


def _usage_error(message: str) -> int:
    print(f"emulate_cluster.py: {message}", file=sys.stderr)
    return 2


def _raise_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    args, command = parse_args(argv)
    try:
        with emulated_cluster(args.nodes, args.gpus_per_node, args.inter_gbit) as cluster:
            measured = cluster.inter_bandwidth()
            print(f"emulate_cluster: {args.nodes} nodes x {args.gpus_per_node} GPUs, inter-node "
                  f"link set to {args.inter_gbit:g} Gbit/s, measured {measured / 1e9:.3f} Gbit/s "
                  f"(node0 -> node1)", flush=True)
            exits = cluster.run_on_nodes(command, failure_timeout=args.failure_timeout)
            return exits.status
    except ClusterError as e:
        print(f"emulate_cluster.py: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
