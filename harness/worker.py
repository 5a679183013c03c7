"""Worker processes: every variant runs in a process of its own, never in the harness's.

A `Worker` is a `spawn`ed process serving one `LocalRunner` (one variant on one device, in
one dtype group), reused across cells. The parent sends method calls with picklable
arguments and waits for the answer with a timeout. The parent keeps the inputs' seeds, the
float64 oracle, the tolerance and the verdict, so nothing the variant imports or patches
(`torch.softmax`, `harness.*`, frames on the stack) reaches the reference's or another
variant's numbers.

Failures are named: an exception inside the variant comes back as `VariantRaised` (its type,
message and whether it ran out of memory); a worker that exits, is killed by a signal (a
segfault, a CUDA fault that poisons its context) or does not answer within the timeout is a
`WorkerFailure` carrying the exit code or signal and the last lines of its output. The next
call then starts a fresh worker.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import traceback
import types
from pathlib import Path

import torch

from harness.runner import LocalRunner, RunOutput, TimedRun
from variants.base import Variant

DEFAULT_TIMEOUT_S = 600.0  # per call: covers a first CUDA extension build (1-2 min on the H200)
STOP = "stop"
LOG_TAIL_LINES = 12


# CPU tensors at least this big cross the pipe as raw bytes after the message (`send`): the
# training check's d pair_repr gradients (8 GiB each at fp32 N = 4096) took ~70 s through
# pickle's copies on the H100's host; raw, 2 GiB took 5 s instead of 29 on the CPU machine.
OUT_OF_BAND_BYTES = 1 << 20


class _Pickler(pickle.Pickler):
    """Pickles a big, contiguous, plain CPU tensor as a reference to an out-of-band buffer of
    its bytes (protocol 5), everything else as pickle does. Such a tensor arrives as one of its
    own: a view arrives without the rest of its storage, and two views of one storage as two."""

    def reducer_override(self, obj):
        if (type(obj) is torch.Tensor and obj.device.type == "cpu"
                and obj.layout is torch.strided and not obj.is_quantized and not obj.requires_grad
                and obj.nbytes >= OUT_OF_BAND_BYTES and obj.is_contiguous()
                and not obj.is_conj() and not obj.is_neg()):
            raw = pickle.PickleBuffer(obj.view(torch.uint8).numpy())
            return _tensor_from_bytes, (raw, obj.dtype, tuple(obj.shape))
        return NotImplemented


def _tensor_from_bytes(buffer, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)


def send(conn, obj) -> None:
    """Send `obj` on `conn`: one message (the pickle and the sizes of its out-of-band
    buffers), then each buffer's bytes written straight to the pipe."""
    head, buffers = io.BytesIO(), []
    _Pickler(head, protocol=5, buffer_callback=buffers.append).dump(obj)
    raws = [b.raw() for b in buffers]
    conn.send_bytes(pickle.dumps(([r.nbytes for r in raws], head.getvalue())))
    stream = io.FileIO(conn.fileno(), "wb", closefd=False)
    for view in raws:
        while view.nbytes:
            view = view[stream.write(view):]


def receive(conn):
    """What `send` sent; the buffers are read into fresh tensors' memory. EOFError when the
    sender goes away, mid-message too."""
    sizes, head = pickle.loads(conn.recv_bytes())
    stream = io.FileIO(conn.fileno(), "rb", closefd=False)
    buffers = []
    for size in sizes:
        buffer = torch.empty(size, dtype=torch.uint8).numpy()
        view = memoryview(buffer)
        while view.nbytes:
            read = stream.readinto(view)
            if not read:
                raise EOFError("the sender went away mid-message")
            view = view[read:]
        buffers.append(buffer)
    return pickle.loads(head, buffers=buffers)


class WorkerFailure(Exception):
    """The worker process died or hung; the message says how, with its last output lines."""


class VariantRaised(Exception):
    """An exception raised by the variant inside its worker, re-raised in the parent."""

    def __init__(self, type_name: str, message: str, oom: bool, trace: str = ""):
        super().__init__(message)
        self.type_name, self.oom, self.trace = type_name, oom, trace

    def __reduce__(self):
        return VariantRaised, (self.type_name, str(self), self.oom, self.trace)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, VariantRaised):
        return exc.oom
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


# Errors after which a process's CUDA context is unusable (CUDA's sticky errors).
CUDA_FAULT_MARKERS = ("device-side assert", "illegal memory access", "misaligned address",
                      "unspecified launch failure", "illegal instruction")


def _cuda_context_lost(exc: VariantRaised) -> bool:
    text = str(exc).lower()
    return "cuda error" in text and any(marker in text for marker in CUDA_FAULT_MARKERS)


def exception_name(exc: BaseException) -> str:
    """The exception's type name, for a `VariantRaised` the original one."""
    return exc.type_name if isinstance(exc, VariantRaised) else type(exc).__name__


def _serve(conn, variant: Variant, device: str, threads: int | None, log_path: str) -> None:
    """The worker's main loop: answer (method, args, kwargs) until told to stop or the parent
    goes away. Its stdout and stderr go to `log_path` (the parent quotes its tail)."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if threads:
        torch.set_num_threads(threads)
    runner = LocalRunner(variant, device, to_cpu=True)
    while True:
        try:
            method, args, kwargs = receive(conn)
        except EOFError:  # the parent is gone
            return
        if method == STOP:
            return
        try:
            reply = ("ok", getattr(runner, method)(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the parent
            reply = ("raised", VariantRaised(type(exc).__name__, str(exc), is_oom(exc),
                                             traceback.format_exc(limit=-8)))
        send(conn, reply)
        sys.stdout.flush()
        sys.stderr.flush()


@contextlib.contextmanager
def _main_module_hidden():
    """`spawn` imports the parent's `__main__` in every child (for `ipa-bench`: the CLI with
    every command, pandas and matplotlib, seconds per worker); a worker needs none of it, so
    the child is started while `__main__` is an empty module."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class Worker:
    """A worker process for one variant on one device; `call(method, ...)` runs
    `LocalRunner.method(...)` there. Started on first use and again after a failure."""

    def __init__(self, variant: Variant, device: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 threads: int | None = None):
        self.variant, self.device = variant, device
        self.timeout_s, self.threads = timeout_s, threads
        self.process = None
        self.conn = None
        self.log_path: Path | None = None
        self.starts = 0

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        fd, log_path = tempfile.mkstemp(prefix="ipa-bench-worker-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_path)
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, self.variant, self.device, self.threads, log_path),
            name=f"ipa-bench worker {self.variant.name}")
        with _main_module_hidden():
            self.process.start()
        child.close()
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        """Start the process unless it runs (returns at once: the first call waits for it)."""
        if not self.alive:
            self._cleanup()
            self._start()

    def call(self, method: str, *args, **kwargs):
        self.start()
        try:
            send(self.conn, (method, args, kwargs))
        except (BrokenPipeError, ConnectionResetError):
            raise self._failure(method, "its pipe closed") from None
        if not self.conn.poll(self.timeout_s):
            raise self._failure(method, f"no answer within {self.timeout_s:g} s (--timeout); "
                                "killed it")
        try:
            status, value = receive(self.conn)
        except EOFError:
            raise self._failure(method, "it ended without answering") from None
        if status == "raised":
            if _cuda_context_lost(value):  # every later CUDA call in it would fail too
                self.process.kill()
                self.process.join(10)
                self._cleanup()
                # first, since the row's reason quotes the start of a long CUDA message
                value = VariantRaised(value.type_name, "a CUDA fault: its worker was ended, the "
                                      f"next call starts a fresh one: {value}", value.oom,
                                      value.trace)
            raise value
        return value

    # The LocalRunner's methods (same arguments), run in the worker.
    def build(self, *args, **kwargs) -> float:
        return self.call("build", *args, **kwargs)

    def outputs(self, *args, **kwargs) -> list[RunOutput]:
        return self.call("outputs", *args, **kwargs)

    def time(self, *args, **kwargs) -> TimedRun:
        return self.call("time", *args, **kwargs)

    def wall(self, *args, **kwargs) -> None:
        self.call("wall", *args, **kwargs)

    def kernel(self, *args, **kwargs) -> str:
        return self.call("kernel", *args, **kwargs)

    def ping(self) -> None:
        self.call("ping")

    def release(self) -> None:
        if self.alive:  # nothing to release in a worker that is not running
            self.call("release")

    def _failure(self, method: str, what: str) -> WorkerFailure:
        process = self.process
        if process.is_alive():
            process.kill()
        process.join(10)
        code = process.exitcode
        if code is None:
            how = "still running"
        elif code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}"
        tail = self._log_tail()
        self._cleanup()
        return WorkerFailure(
            f"worker process of {self.variant.name} failed during {method}: {what} ({how})"
            + (f"; its last output: {tail}" if tail else ""))

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-LOG_TAIL_LINES:])[-1500:]

    def _cleanup(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
        self.process = self.conn = self.log_path = None

    def ask_to_stop(self) -> None:
        """Tell the worker to stop, without waiting for it."""
        if self.alive:
            try:
                send(self.conn, (STOP, (), {}))
            except OSError:
                pass

    def wait_for_exit(self) -> None:
        """After `ask_to_stop`: wait for the worker, kill it if it does not end within a few
        seconds, and release its pipe and log."""
        if self.alive:
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
        self._cleanup()

    def close(self) -> None:
        """Ask the worker to stop and wait for it."""
        self.ask_to_stop()
        self.wait_for_exit()


class WorkerPool:
    """One `Worker` per (variant, device, dtype) group, kept for the pool's life."""

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S, threads: int | None = None):
        self.timeout_s, self.threads = timeout_s, threads
        self._workers: dict[tuple[str, str, str], Worker] = {}

    def get(self, variant: Variant, device: str, dtype: str) -> Worker:
        key = (variant.name, device, dtype)
        if key not in self._workers:
            self._workers[key] = Worker(variant, device, timeout_s=self.timeout_s,
                                        threads=self.threads)
        return self._workers[key]

    def prestart(self, groups: list[tuple[Variant, str, str]]) -> None:
        """Start the workers of every (variant, device, dtype) group at once and wait until
        each answers: the processes import torch in parallel, before anything is timed."""
        workers = [self.get(*group) for group in groups]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.ping()

    def close(self) -> None:
        """Stop every worker: all told at once, then each waited for (a process with a CUDA
        context and Inductor's compile workers takes seconds to exit: in turn, they add up)."""
        for worker in self._workers.values():
            worker.ask_to_stop()
        for worker in self._workers.values():
            worker.wait_for_exit()
        self._workers.clear()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
