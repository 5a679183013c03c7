"""What ran the measurement: versions, device, clocks, code identity.

Versions and the machine come from `torch.utils.collect_env` (what PyTorch's own bug reports
use); git and nvidia-smi fill in what it does not know (the commit, the clocks). One call per
process is enough: its probes run subprocesses (lscpu, nvidia-smi).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch.utils import collect_env

from variants.base import source_digest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "triton", "numpy", "pandas", "ipa-bench")


@functools.cache
def _collected() -> dict:
    # collect_env's own probes, without get_env_info's `pip list` and conda (seconds each).
    run = collect_env.run
    cpu_info = collect_env.get_cpu_info(run) or ""
    cpu_model = next((line.split(":", 1)[1].strip() for line in cpu_info.splitlines()
                      if line.startswith("Model name:")), None)
    return {
        "os": collect_env.get_os(run), "python_platform": collect_env.get_python_platform(),
        "nvcc": collect_env.get_running_cuda_version(run),
        "cudnn": collect_env.get_cudnn_version(run),
        "nvidia_driver": collect_env.get_nvidia_driver_version(run),
        "gpu_models": collect_env.get_gpu_info(run), "cpu_model": cpu_model,
    }


def package_versions() -> dict[str, str | None]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def cpu_name() -> str:
    """The CPU's model name (lscpu's), or the machine type when unknown."""
    return _collected()["cpu_model"] or platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).name
    return cpu_name()


def git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              timeout=10, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_smi(query: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=20)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def gpu_clocks() -> str | None:
    """SM and memory clocks, temperature, power and throttle reasons, as nvidia-smi says."""
    return _nvidia_smi(
        "clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active")


def describe(device: torch.device) -> dict:
    """The metadata of one invocation on `device` (results/README.md, `metadata.json`)."""
    device = torch.device(device)
    meta: dict = {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "platform": platform.platform(),
        "packages": package_versions(), **_collected(),
        "command": " ".join(sys.argv), "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain")),
        "source_digest": source_digest([REPO / "variants", REPO / "harness"]),
        "device_name": device_name(device),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
    }
    meta["triton"] = meta["packages"]["triton"]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(gpu_name=props.name, sm_count=props.multi_processor_count,
                    l2_bytes=getattr(props, "L2_cache_size", None),
                    memory_gib=props.total_memory / 2**30,
                    driver=_nvidia_smi("driver_version"), clocks_at_start=gpu_clocks())
    return meta
