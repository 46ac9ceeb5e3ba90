"""A short TCP blast that measures the bandwidth between two addresses.

    python launch/netprobe.py serve ADDR PORT      # prints "ready", then one result per client
    python launch/netprobe.py blast ADDR PORT NBYTES   # prints the measured bits per second

The client times from the first byte sent to the server's one-byte acknowledgement that it has
read all of them, so the figure includes everything the link and both kernels do. The emulated
cluster (`launch/emulate_cluster.py`) runs the two ends in two network namespaces (inter-node)
or in one (intra-node, the node's own address).
"""

from __future__ import annotations

import socket
import sys
import time

CHUNK = 4 << 20


def serve(addr: str, port: int) -> None:
    """Accept one client, read the byte count it announces, read that many bytes, answer."""
    with socket.create_server((addr, port)) as server:
        print("ready", flush=True)
        conn, _ = server.accept()
        with conn:
            total = int.from_bytes(_read_exactly(conn, 8), "big")
            buffer = memoryview(bytearray(CHUNK))  # recv_into: no allocation per read
            left = total
            while left:
                got = conn.recv_into(buffer, min(CHUNK, left))
                if not got:
                    raise ConnectionError(f"client closed with {left} bytes unsent")
                left -= got
            conn.sendall(b"k")


def blast(addr: str, port: int, nbytes: int) -> float:
    """Send `nbytes` to a `serve` at addr:port; the measured bandwidth in bits per second."""
    payload = memoryview(bytes(CHUNK))
    with socket.create_connection((addr, port), timeout=60) as conn:
        conn.sendall(nbytes.to_bytes(8, "big"))
        start = time.perf_counter()
        left = nbytes
        while left:
            n = min(CHUNK, left)
            conn.sendall(payload[:n])
            left -= n
        _read_exactly(conn, 1)
        elapsed = time.perf_counter() - start
    return nbytes * 8 / elapsed


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            raise ConnectionError("connection closed early")
        data += got
    return data


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "serve":
        serve(argv[1], int(argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "blast":
        print(f"{blast(argv[1], int(argv[2]), int(argv[3])):.6g}", flush=True)
        return 0
    print("usage: netprobe.py serve ADDR PORT | blast ADDR PORT NBYTES", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
