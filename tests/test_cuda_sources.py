"""CPU tests of the CUDA variants' sources and dispatch (run in CI, no GPU needed).

Every kernel source in variants/csrc/ compiles with nvcc alone (no torch headers) for sm_90,
and the ptxas report shows no register spills in the shipped instances; the kernel classes of
variants/cuda_fused.py (ids, limits, which class a layer gets) agree with the C++, printed by a
torch-free host program (tests/csrc/fused_classes.cu); the variants explain why they cannot
run; the Python-side checks reject bad inputs before any launch; the extension builds into the
per-user cache with ninja found. GPU tests: tests/test_cuda.py.
"""


from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from variants.base import _nvcc_path
from variants.cuda_ext import (
    SOURCES,
    Weights,
    Widths,
    build_directory,
    cache_root,
    check_call_inputs,
    gemms_label,
    ninja_on_path,
)
from variants.cuda_fused import (
    AF2,
    CLASS_LIMITS,
    FFMA_BIAS,
    GENERIC,
    LANES,
    MAX_PAIR_DIM,
    MMA_HEAD_ROWS,
    MMA_PAIR_ROWS,
    SMALL,
    TENSOR_CORES,
    CudaFused,
    kernel_class,
)
from variants.cuda_hybrid import CudaHybrid
from variants.problem import IPAConfig, IPAInputError, make_inputs
from variants.reference import init_state_dict

REPO = Path(__file__).resolve().parents[1]
CSRC = REPO / "variants" / "csrc"
KERNEL_SOURCES = sorted(CSRC.glob("*.cu"))
KERNEL_UNITS = [CSRC / name for name in SOURCES if name.endswith(".cu")]  # what the extension links


NVCC = _nvcc_path()  # $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, else nvcc on PATH


def require_nvcc() -> str:
    """nvcc for the CPU compile tests. Where it is absent they skip, except under CI (CI=true):
    the README promises that CI compiles every kernel source and fails on spills, so there a
    missing nvcc fails instead of passing silently."""
    if NVCC is None:
        reason = "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must compile the CUDA sources")
        pytest.skip(reason)
    return NVCC
HAS_GPU = torch.cuda.is_available() and torch.version.cuda is not None and NVCC is not None
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device, CUDA torch and nvcc")


# ---------------------------------------------------------------------------------------------
# CPU: compile every kernel source and read the ptxas report
# ---------------------------------------------------------------------------------------------


@dataclass
class PtxasEntry:
    function: str
    registers: int = -1
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


def parse_ptxas(report: str) -> dict[str, PtxasEntry]:
    """Per-function registers and spills from `nvcc -Xptxas -v` output."""
    entries: dict[str, PtxasEntry] = {}
    current = None
    for line in report.splitlines():
        if m := re.search(r"Function properties for (\S+)", line):
            current = entries.setdefault(m.group(1), PtxasEntry(m.group(1)))
        elif m := re.search(r"Compiling entry function '([^']+)'", line):
            current = entries.setdefault(m.group(1), PtxasEntry(m.group(1)))
        elif current is not None and (
            m := re.search(
                r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
            )
        ):
            current.stack_bytes, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif current is not None and (m := re.search(r"Used (\d+) registers", line)):
            current.registers = int(m.group(1))
    return entries


def test_parse_ptxas_reads_spills():
    report = textwrap.dedent(
        """\
        ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'
        ptxas info    : Function properties for _Z3fooPf
            8 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads
        ptxas info    : Used 128 registers, used 1 barriers, 8 bytes cumulative stack size
        """
    )
    (entry,) = parse_ptxas(report).values()
    assert (entry.registers, entry.spill_stores, entry.spill_loads) == (128, 12, 20)


@pytest.mark.parametrize("source", KERNEL_SOURCES, ids=lambda p: p.name)
def test_kernel_compiles_for_sm90_without_spills(source: Path, tmp_path: Path):
    # No torch include paths: the kernels must stand alone (the binding .cpp is separate).
    cmd = [
        require_nvcc(), "-std=c++17", "-O3", "-arch=sm_90", "-Xptxas", "-v", "-I", str(CSRC),
        "-c", str(source), "-o", str(tmp_path / (source.stem + ".o")),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    entries = parse_ptxas(proc.stderr)
    kernels = [e for e in entries.values() if e.registers >= 0]
    assert kernels, f"no ptxas report for {source.name}:\n{proc.stderr}"
    spilling = [
        f"{e.function}: {e.registers} registers, {e.spill_stores} B spill stores, "
        f"{e.spill_loads} B spill loads"
        for e in entries.values()
        if e.spill_stores or e.spill_loads
    ]
    assert not spilling, "register spills:\n" + "\n".join(spilling)


def cuda_runtime_include() -> Path | None:
    """A folder holding cuda_runtime.h: nvcc's toolkit's, else the copy Triton ships."""
    candidates = [Path(NVCC).resolve().parent.parent / "include"] if NVCC else []
    if (triton := importlib.util.find_spec("triton")) and triton.origin:
        candidates.append(Path(triton.origin).parent / "backends" / "nvidia" / "include")
    return next((c for c in candidates if (c / "cuda_runtime.h").is_file()), None)


def test_binding_compiles_against_this_torch(tmp_path: Path):
    """ipa_binding.cpp, which torch's cpp_extension builds only where a GPU is, parses and
    type-checks against this torch's headers (`g++ -fsyntax-only`), with the CUDA runtime's
    headers and a stub for the one header a CPU build of torch lacks
    (c10/cuda/impl/cuda_cmake_macros.h). A wrong argument type found here would otherwise cost
    a GPU session (the thirty-third session's: an aggregate initialiser shifted by a new field)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    cuda_include = cuda_runtime_include()
    missing = [what for what, found in (("a C++ compiler", cxx), ("cuda_runtime.h", cuda_include))
               if found is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{' and '.join(missing)} not found; CI must check the binding")
        pytest.skip(f"{' and '.join(missing)} not found")
    stub = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    stub.parent.mkdir(parents=True)
    stub.write_text("#pragma once\n")
    torch_include = Path(torch.__file__).parent / "include"
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-I", str(tmp_path), "-I", str(torch_include),
           "-I", str(torch_include / "torch" / "csrc" / "api" / "include"), "-I", str(cuda_include),
           "-I", sysconfig.get_paths()["include"], "-DTORCH_EXTENSION_NAME=ipa_bench_check",
           str(CSRC / "ipa_binding.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n" + "\n".join(errors[:20])


def test_binding_messages_never_stream_through_torch_check():
    """Every refusal in the binding goes through IPA_CHECK, whose message is one string built
    with std::to_string: a TORCH_CHECK that streamed a number itself segfaulted instead of
    raising on the GPU machine's torch 2.11 (thirty-fourth session). Comments aside, the one
    TORCH_CHECK left is IPA_CHECK's definition."""
    code = [line.split("//")[0] for line in (CSRC / "ipa_binding.cpp").read_text().splitlines()]
    uses = [line.strip() for line in code if "TORCH_CHECK" in line or "AT_ERROR" in line]
    assert uses == ["#define IPA_CHECK(cond, ...) TORCH_CHECK(cond, message(__VA_ARGS__))"], uses


def test_extension_builds_every_kernel_source():
    """cuda_ext.SOURCES, what the extension compiles and links, names every .cu in csrc/."""
    assert sorted(KERNEL_UNITS) == KERNEL_SOURCES
    assert all((CSRC / name).is_file() for name in SOURCES)


def test_kernel_sources_do_not_include_torch():
    for path in KERNEL_SOURCES + sorted(CSRC.glob("*.cuh")) + sorted(CSRC.glob("*.h")):
        text = path.read_text()
        assert not re.search(r"#include\s*[<\"](torch|ATen|c10)/", text), path.name


# ---------------------------------------------------------------------------------------------
# CPU: capabilities, reasons, dispatch and input checks (no extension build)
# ---------------------------------------------------------------------------------------------

VARIANTS = [CudaHybrid(), CudaFused()]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_cpu_is_not_supported_with_a_reason(variant):
    reasons = variant.not_supported_reasons(IPAConfig(), "cpu", "fp32")
    assert any("device 'cpu' not supported" in r for r in reasons)
    if not torch.cuda.is_available():
        cuda_reasons = variant.not_supported_reasons(IPAConfig(), "cuda", "fp32")
        assert any("no CUDA device" in r for r in cuda_reasons)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_unsupported_precision_and_sizes_have_reasons(variant):
    assert any("fp16" in r for r in variant.not_supported_reasons(IPAConfig(), "cuda", "fp16"))
    too_many_points = IPAConfig(query_points=17)
    assert any("query_points" in r for r in variant.not_supported_reasons(too_many_points,
                                                                          "cuda", "fp32"))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_missing_ninja_is_a_reason(variant, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(shutil, "which", lambda cmd, *args, **kwargs: None)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "ninja" else find_spec(name, *args))
    reasons = variant.not_supported_reasons(IPAConfig(), "cuda", "fp32")
    assert any("ninja not found" in r for r in reasons), reasons


def test_ninja_of_the_pypi_package_is_put_on_path_for_the_build(monkeypatch, tmp_path):
    """A venv used without activation: the ninja package's BIN_DIR is not on PATH."""
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    executable = bin_dir / "ninja"
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    monkeypatch.setitem(sys.modules, "ninja", types.SimpleNamespace(BIN_DIR=str(bin_dir)))
    bare = str(tmp_path / "nothing-here")
    monkeypatch.setenv("PATH", bare)
    with ninja_on_path():
        assert shutil.which("ninja") == str(executable)
    assert os.environ["PATH"] == bare
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), bare]))  # already there: untouched
    with ninja_on_path():
        assert os.environ["PATH"] == os.pathsep.join([str(bin_dir), bare])


def test_extension_builds_into_the_per_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("IPA_BENCH_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "ipa-bench"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert cache_root() == tmp_path / "home" / ".cache" / "ipa-bench"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "ipa-bench"
    monkeypatch.setenv("IPA_BENCH_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    directory = build_directory()
    assert directory.parent == tmp_path / "mine" / "cuda-ext"
    assert directory.name.startswith(f"sm90-torch{torch.__version__.split('+')[0]}-cuda")


def test_fused_limits():
    fused = CudaFused()
    assert any("heads=24" in r for r in fused.not_supported_reasons(
        IPAConfig(heads=24), "cuda", "fp32"))
    assert any("pair_dim=132" in r for r in fused.not_supported_reasons(
        IPAConfig(pair_dim=132), "cuda", "fp32"))
    assert any("multiple of 8" in r for r in fused.not_supported_reasons(
        IPAConfig(pair_dim=100), "cuda", "fp32"))


@pytest.mark.parametrize("forms, dtype, config, label", [
    ({}, "fp32", IPAConfig(), "fp32-3xtf32"),  # the defaults: the tensor-core kernel
    ({}, "bf16", IPAConfig(), "bf16-tf32"),
    ({"FP32_BIAS": FFMA_BIAS}, "fp32", IPAConfig(), "ieee"),
    ({"BF16_BIAS": MMA_HEAD_ROWS}, "bf16", IPAConfig(), "ieee"),  # the bias alone on mma: exact
    ({"FP32_BIAS": MMA_HEAD_ROWS}, "fp32", IPAConfig(), "fp32-3xtf32"),
    ({"FP32_BIAS": TENSOR_CORES}, "fp32", IPAConfig(), "fp32-3xtf32"),
    ({"BF16_BIAS": TENSOR_CORES}, "bf16", IPAConfig(), "bf16-tf32"),
    ({"FP32_BIAS": TENSOR_CORES}, "fp32", IPAConfig(pair_dim=64), "ieee"),  # small class: FFMA
    ({"FP32_BIAS": TENSOR_CORES}, "tf32", IPAConfig(), "tf32"),
    ({"FP32_BIAS": TENSOR_CORES}, "fp32", None, "ieee"),
], ids=str)
def test_rows_name_the_tf32_forms(monkeypatch, forms, dtype, config, label):
    """A row's math_mode names the af2 forms that run fp32 products on TF32 tensor cores, for
    the configs that run the af2 class."""
    for name, value in forms.items():
        monkeypatch.setattr(f"variants.cuda_fused.{name}", value)
    assert CudaFused().math_mode_label(dtype, config) == label


@pytest.mark.parametrize("tensor_cores", [True, False])
@pytest.mark.parametrize("dtype, split, label", [
    (torch.bfloat16, False, "bfloat16 tensor cores"),
    (torch.float16, False, "float16 tensor cores"),
    (torch.float32, True, "3xTF32 (Triton)"),
    (torch.float32, False, "cuBLAS SGEMM"),
], ids=str)
def test_rows_name_the_gemms_around_the_kernel(monkeypatch, dtype, split, label, tensor_cores):
    """kernel_info's `GEMMs ...`: how the projections ran (`cuda_ext.TENSOR_CORE_GEMMS`)."""
    monkeypatch.setattr("variants.cuda_ext.TENSOR_CORE_GEMMS", tensor_cores)
    config = IPAConfig(node_dim=32, heads=2, pair_dim=8)
    weights = Weights(init_state_dict(config), config, "cpu", dtype)
    assert gemms_label(weights, split) == (label if tensor_cores else "cuBLAS SGEMM")


@pytest.mark.parametrize(
    "config, expected",
    [
        (IPAConfig(), AF2),
        (IPAConfig(node_dim=256, heads=8), AF2),  # head_dim 32, fewer heads
        (IPAConfig(pair_dim=64), SMALL),  # AF2 takes pair_dim 128 only
        (IPAConfig(heads=14, node_dim=448), GENERIC),  # head_dim 32 but 14 heads
        (IPAConfig(query_points=16, value_points=16), SMALL),
        (IPAConfig(node_dim=64, heads=8), SMALL),
        (IPAConfig(heads=16), GENERIC),  # more heads than the small class's 12 warps
        (IPAConfig(heads=4), GENERIC),  # head_dim 96
        (IPAConfig(heads=3), GENERIC),  # odd heads, head_dim 128
        (IPAConfig(node_dim=120, heads=5), GENERIC),
    ],
    ids=str,
)
def test_kernel_class(config, expected):
    assert kernel_class(config) == expected
    widths = Widths.for_lanes(config, LANES[expected])
    assert widths.dqp % (4 * LANES[expected]) == 0 and widths.wv >= widths.dv


CLASS_PROGRAM_SOURCE = REPO / "tests" / "csrc" / "fused_classes.cu"


@pytest.fixture(scope="module")
def fused_classes_program(tmp_path_factory) -> Path:
    """tests/csrc/fused_classes.cu linked with the cuda-fused sources: host code only, prints the
    C++ class ids, limits and picks as JSON, and runs without a GPU."""
    nvcc = require_nvcc()
    out = tmp_path_factory.mktemp("classes") / "fused_classes"
    # ipa_frames.cu: fused_launch ends in its merging finish
    fused = [str(p) for p in KERNEL_UNITS
             if p.name.startswith("ipa_fused") or p.name == "ipa_frames.cu"]
    cmd = [nvcc, "-std=c++17", "-arch=sm_90", "-I", str(CSRC), "-o", str(out),
           str(CLASS_PROGRAM_SOURCE), *fused]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return out


def cxx_classes(program: Path, configs=()) -> dict:
    """The C++ view: class ids, max pair_dim, limits per class, and fused_kernel_class per config
    (-1: no class)."""
    lines = "".join(
        f"{c.heads} {c.head_dim} {c.query_points} {c.value_points} {c.pair_dim}\n"
        for c in configs
    )
    proc = subprocess.run([str(program)], input=lines, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def python_class(config: IPAConfig) -> int:
    try:
        return kernel_class(config)
    except ValueError:
        return -1


def test_class_ids_and_limits_match_the_cxx(fused_classes_program):
    cxx = cxx_classes(fused_classes_program)
    assert cxx["class_ids"] == {"small": SMALL, "generic": GENERIC, "af2": AF2}
    assert cxx["bias_ids"] == {"ffma": FFMA_BIAS, "mma_pair_rows": MMA_PAIR_ROWS,
                               "mma_head_rows": MMA_HEAD_ROWS, "tensor_cores": TENSOR_CORES}
    assert cxx["max_pair_dim"] == MAX_PAIR_DIM == CudaFused.limits["pair_dim"][1]
    limits = {int(klass): fields for klass, fields in cxx["limits"].items()}
    assert limits == {klass: dataclasses.asdict(lim) for klass, lim in CLASS_LIMITS.items()}


# Sizes at and just past each class's edges (node_dim = heads * head_dim).
AWKWARD_CONFIGS = [
    IPAConfig(),  # af2
    IPAConfig(node_dim=64, heads=2),  # af2, fewest heads
    IPAConfig(node_dim=320, heads=10),  # af2, odd key tile
    IPAConfig(node_dim=352, heads=11),  # AF2's widths, odd heads: generic
    IPAConfig(pair_dim=120),  # af2 takes pair_dim 128 only: small
    IPAConfig(pair_dim=8),
    IPAConfig(query_points=5),  # one point past af2: small
    IPAConfig(value_points=7),
    IPAConfig(node_dim=372, heads=12),  # head_dim 31: small (dqp 32)
    IPAConfig(node_dim=396, heads=12),  # head_dim 33: past small's 32, generic
    IPAConfig(query_points=16, value_points=16),  # small at its widest (pqp 48, wv 80)
    IPAConfig(value_points=17),  # wv 88 > 80: generic
    IPAConfig(query_points=17),  # pqp 56 > 48: generic (outside the variant's limits)
    IPAConfig(node_dim=12, heads=12),  # head_dim 1
    IPAConfig(node_dim=11, heads=11),  # head_dim 1, odd heads
    IPAConfig(node_dim=448, heads=14),  # head_dim 32, 14 heads: generic
    IPAConfig(heads=16),
    IPAConfig(heads=4),  # head_dim 96
    IPAConfig(heads=3),  # head_dim 128, odd heads
    IPAConfig(node_dim=2048, heads=16, query_points=16, value_points=16),  # generic at its widest
    IPAConfig(node_dim=120, heads=5, pair_dim=8),
    IPAConfig(node_dim=64, heads=8, pair_dim=32),  # head_dim 8
    IPAConfig(node_dim=387, heads=3),  # head_dim 129: no class
    IPAConfig(heads=24),  # no class
    IPAConfig(node_dim=544, heads=17),  # no class
    IPAConfig(pair_dim=136),  # no class
    IPAConfig(pair_dim=100),  # not a multiple of 8: no class
    IPAConfig(node_dim=2048, heads=16, query_points=22),  # pqp 96 > 64: no class
]


def test_kernel_class_picks_what_the_cxx_picks(fused_classes_program):
    cxx = cxx_classes(fused_classes_program, AWKWARD_CONFIGS)
    picks = [row[-1] for row in cxx["picks"]]
    assert len(picks) == len(AWKWARD_CONFIGS)
    mismatches = [
        f"{config}: python {python_class(config)}, C++ {pick}"
        for config, pick in zip(AWKWARD_CONFIGS, picks, strict=True)
        if python_class(config) != pick
    ]
    assert not mismatches, "\n".join(mismatches)
    assert {AF2, SMALL, GENERIC, -1} <= set(picks)  # the list reaches every outcome


def test_every_config_inside_the_variant_limits_has_a_class(fused_classes_program):
    """CudaFused.limits promise nothing the kernels cannot run: the C++ dispatch has a class
    for every corner of them (and the Python side picks the same)."""
    lim = CudaFused.limits
    configs = [
        IPAConfig(node_dim=heads * head_dim, heads=heads, query_points=qp, value_points=vp,
                  pair_dim=pair_dim)
        for heads, head_dim, qp, vp, pair_dim in itertools.product(
            (*lim["heads"], 2, 12), (*lim["head_dim"], 32, 33), lim["query_points"],
            lim["value_points"], lim["pair_dim"])
    ]
    cxx = cxx_classes(fused_classes_program, configs)
    for config, row in zip(configs, cxx["picks"], strict=True):
        assert row[-1] != -1, f"no C++ kernel class for {config}, inside CudaFused.limits"
        assert python_class(config) == row[-1], config
        reasons = CudaFused().not_supported_reasons(config, "cuda", "fp32")
        assert not [r for r in reasons if "range" in r or "multiple of 8" in r], reasons


def test_call_checks_reject_bad_inputs_before_launch():
    config = IPAConfig(node_dim=32, pair_dim=8, heads=2, query_points=1, value_points=1)
    inputs = make_inputs(config, 1, 5)
    args = inputs.as_tuple()
    with pytest.raises(IPAInputError, match="expected device cuda"):
        check_call_inputs(config, torch.device("cuda"), torch.float32, *args)
    cpu = torch.device("cpu")
    check_call_inputs(config, cpu, torch.float32, *args)  # the same inputs on their own device
    with pytest.raises(IPAInputError, match="node_repr: expected dtype"):
        check_call_inputs(config, cpu, torch.bfloat16, *args)
    with pytest.raises(IPAInputError, match="pair_repr: expected shape"):
        check_call_inputs(config, cpu, torch.float32, args[0], args[1][:, :4], *args[2:])
    strided = args[1].transpose(1, 2)
    with pytest.raises(IPAInputError, match="pair_repr: expected a contiguous tensor"):
        check_call_inputs(config, cpu, torch.float32, args[0], strided, *args[2:])
