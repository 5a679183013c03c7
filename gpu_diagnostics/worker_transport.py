"""Time a worker's reply of big CPU tensors crossing the pipe to the harness: pickle's path
(`pickle.dumps` then `send_bytes`, as before 2026-12-06) against `harness.worker.send` /
`receive` (out-of-band raw bytes), from a spawned process as the worker is. No GPU needed.

    PYTHONPATH=. python3 gpu_diagnostics/worker_transport.py [MiB per tensor] [tensors]

Prints one line per path: seconds from the request to the tensors in this process.
"""

from __future__ import annotations

import multiprocessing
import pickle
import sys
import time

import torch

from harness.worker import receive, send


def _serve(conn, mib: int, count: int, raw: bool) -> None:
    tensors = [torch.randn(mib << 18) for _ in range(count)]  # fp32: 2^18 a MiB
    conn.send_bytes(b"drawn")
    conn.recv_bytes()  # the request, from which the parent's clock runs
    if raw:
        send(conn, ("ok", tensors))
    else:
        conn.send_bytes(pickle.dumps(("ok", tensors)))


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    context = multiprocessing.get_context("spawn")
    for raw in (False, True):
        parent, child = context.Pipe()
        process = context.Process(target=_serve, args=(child, mib, count, raw))
        process.start()
        parent.recv_bytes()  # the tensors are drawn
        started = time.perf_counter()
        parent.send_bytes(b"go")
        status, tensors = receive(parent) if raw else pickle.loads(parent.recv_bytes())
        took = time.perf_counter() - started
        process.join()
        assert status == "ok" and len(tensors) == count
        path = "out-of-band (send/receive)" if raw else "pickle"
        print(f"{path:28s} {count} x {mib} MiB: {took:.2f} s")


if __name__ == "__main__":
    main()
