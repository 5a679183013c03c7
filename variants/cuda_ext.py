"""Shared plumbing of the two CUDA variants (`cuda-hybrid`, `cuda-fused`): the lazily built
extension and the PyTorch side of the computation around the kernels.

Not a variant. The extension is `variants/csrc/` (kernels in `ipa_fused*.cu`, `ipa_hybrid.cu`,
`ipa_frames.cu`, which compile with nvcc alone, plus the thin torch binding `ipa_binding.cpp`).
It is compiled on first use with `torch.utils.cpp_extension.load` for the running GPU's
architecture only (sm_90 on an H200) into a per-user cache, never into the source tree (which
may be a read-only site-packages): `cuda-ext/<arch>-torch<version>-cuda<version>-<digest of
csrc>/` under `$IPA_BENCH_CACHE`, else `$XDG_CACHE_HOME/ipa-bench`, else `~/.cache/ipa-bench`.
A later process, or a later call in this one, never pays the build again; editing any file in
`csrc/` picks a fresh directory. `build_seconds()` says what the first load cost here.

Around the kernels: LayerNorm, one fused projection GEMM for q, k, v and the three point sets,
the local -> global frame transform and padding into float32 operand rows, and after the kernel
the global -> local transform of the aggregated points and the output projection. `project` /
`finish` write these steps in PyTorch, in float32 (the specification, tested on CPU);
`project_on_gpu` / `finish_on_gpu`, which the variants run (cuda-fused has its kernel call end
in finish_frames' output: `cuda_fused.fused_attention`'s `local`), do the same in five launches with
the extension's `ipa_frames.cu` instead of ~30 small ops (eager PyTorch ops cost the host 20-40
us each on the H200, more than the attention kernel itself up to N ~ 1000), with the two GEMMs
on tensor cores (`TENSOR_CORE_GEMMS`): for bf16/fp16 inputs in the input dtype (the
projection's products exact, accumulated and returned in float32, so the points stay float32;
the output projection reads its input rounded to the input dtype, as the reference does), for
float32 with `split_gemms` as 3xTF32 (`variants.triton.linear`, about as accurate as cuBLAS's
IEEE SGEMM), else cuBLAS's SGEMM. The only 16-bit tensor a kernel reads is `pair_repr`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from variants.base import source_digest
from variants.problem import IPAConfig, IPAInputError, validate_inputs

CSRC = Path(__file__).resolve().parent / "csrc"
# What the CUDA variants' numbers depend on besides their own module (Variant.code_paths).
CODE_PATHS = (Path(__file__).resolve(), CSRC)
SOURCES = (
    "ipa_binding.cpp",
    "ipa_fused.cu",  # cuda-fused: class limits, launch plan, split-K combine
    "ipa_fused_small_generic.cu",  # cuda-fused kernel classes small and generic
    "ipa_fused_af2.cu",  # cuda-fused kernel class af2
    "ipa_fused_af2_tc.cu",  # its tensor-core form (bias warps, TF32 attention)
    "ipa_openfold.cu",  # problem openfold's cuda-fused core
    "ipa_hybrid.cu",
    "ipa_frames.cu",
)

# Read at each call (an A/B switch): the GEMMs around the kernels on tensor cores (module doc).
# False: float32 cuBLAS SGEMMs whatever the dtype (the code before the thirty-third session).
TENSOR_CORE_GEMMS = True
HALF_DTYPES = (torch.bfloat16, torch.float16)

_lock = threading.Lock()
_extension = None
_build_seconds: float | None = None


def cache_root() -> Path:
    """The per-user cache of ipa-bench: $IPA_BENCH_CACHE if set, else $XDG_CACHE_HOME/ipa-bench
    (an absolute XDG_CACHE_HOME only, as the XDG spec says), else ~/.cache/ipa-bench."""
    explicit = os.environ.get("IPA_BENCH_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "ipa-bench"


def build_directory() -> Path:
    """Where the extension for the current GPU, torch and csrc contents is cached."""
    major, minor = torch.cuda.get_device_capability()
    torch_version = torch.__version__.split("+")[0]
    digest = source_digest([CSRC], (".cu", ".cuh", ".h", ".cpp"))
    tag = f"sm{major}{minor}-torch{torch_version}-cuda{torch.version.cuda}-{digest}"
    return cache_root() / "cuda-ext" / tag


@contextlib.contextmanager
def ninja_on_path():
    """torch's cpp_extension runs the `ninja` executable found on PATH. The `ninja` PyPI package
    installs it in `ninja.BIN_DIR` (a venv's bin/), which is not on PATH when the venv's python
    runs without activation: put that folder first for the build, and restore PATH after."""
    saved = os.environ.get("PATH")
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            ninja = None  # torch's own check then says that ninja is missing
        bin_dir = getattr(ninja, "BIN_DIR", None)
        if bin_dir and shutil.which("ninja", path=bin_dir):
            os.environ["PATH"] = os.pathsep.join([bin_dir, saved] if saved else [bin_dir])
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved


def load_extension():
    """Build (first call) or load the extension for the current GPU; thread-safe, cached."""
    global _extension, _build_seconds
    with _lock:
        if _extension is not None:
            return _extension
        from torch.utils.cpp_extension import load

        major, minor = torch.cuda.get_device_capability()
        directory = build_directory()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RuntimeError(
                f"cannot create the CUDA extension's build directory {directory} ({err}); set "
                "IPA_BENCH_CACHE to a writable folder"
            ) from err
        saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"  # this GPU's architecture only
        start = time.perf_counter()
        try:
            with ninja_on_path():
                _extension = load(
                    name=f"ipa_cuda_sm{major}{minor}",
                    sources=[str(CSRC / s) for s in SOURCES],
                    extra_include_paths=[str(CSRC)],
                    extra_cflags=["-O3"],
                    extra_cuda_cflags=["-O3", "-lineinfo"],
                    build_directory=str(directory),
                    verbose=False,
                )
        finally:
            if saved is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = saved
        _build_seconds = time.perf_counter() - start
        return _extension


def build_seconds() -> float | None:
    """Seconds the first `load_extension()` of this process took (compile or cache load)."""
    return _build_seconds


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Widths:
    """Padded row widths of the kernel operands (floats); pads are zero."""

    dqp: int  # scalar q/k part, >= head_dim
    pqp: int  # point part, >= 3 * query_points
    wv: int  # value row [v | value points], >= dv
    dv: int  # head_dim + 3 * value_points: what the kernels write per (row, head)

    @property
    def wq(self) -> int:
        return self.dqp + self.pqp

    @staticmethod
    def for_lanes(config: IPAConfig, lanes: int) -> Widths:
        """Widths for kernels that split a row over `lanes` lanes in 16-byte chunks."""
        m = 4 * lanes
        d = config.head_dim
        dv = d + 3 * config.value_points
        return Widths(round_up(d, m), round_up(3 * config.query_points, m), round_up(dv, m), dv)


class Weights:
    """The state_dict in float32 on one device, in the forms the CUDA variants use; for a
    16-bit `dtype` also the LayerNorm and the two GEMMs' weights in that dtype (`half`)."""

    def __init__(self, state_dict: dict[str, torch.Tensor], config: IPAConfig, device,
                 dtype: torch.dtype = torch.float32):
        def get(key: str) -> torch.Tensor:
            return state_dict[key].detach().to(device=device, dtype=torch.float32).contiguous()

        self.config = config
        self.device = torch.device(device)
        self.ln_weight, self.ln_bias = get("layer_norm.weight"), get("layer_norm.bias")
        names = ("q_proj", "k_proj", "v_proj", "q_pts", "k_pts", "v_pts")
        self.projection = torch.cat([get(f"{n}.weight") for n in names]).contiguous()
        h, d = config.heads, config.head_dim
        qp3, vp3 = 3 * config.query_points, 3 * config.value_points
        self.split_sizes = [h * d, h * d, h * d, h * qp3, h * qp3, h * vp3]
        self.pair_bias = get("pair_bias.weight")  # (H, pair_dim), natural units
        self.head_weights = get("head_weights")  # (H,), for variants.base2.base2_units
        self.point_weight = -F.softplus(self.head_weights) / 2.0  # (H,), natural units
        self.out_weight, self.out_bias = get("out_proj.weight"), get("out_proj.bias")
        self.half = None
        if dtype in HALF_DTYPES:
            self.half = HalfWeights(*(t.to(dtype) for t in (
                self.ln_weight, self.ln_bias, self.projection, self.out_weight, self.out_bias)))


@dataclass(frozen=True)
class HalfWeights:
    """`Weights`' LayerNorm and GEMM weights in a 16-bit dtype, for its tensor-core GEMMs."""

    ln_weight: torch.Tensor
    ln_bias: torch.Tensor
    projection: torch.Tensor
    out_weight: torch.Tensor
    out_bias: torch.Tensor


def check_call_inputs(
    config: IPAConfig,
    device: torch.device,
    dtype: torch.dtype,
    node_repr: torch.Tensor,
    pair_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
) -> None:
    """Shapes, dtype and device of one call (rotations are not read back: no host sync);
    pair_repr must be contiguous because the kernels read it in place."""
    validate_inputs(
        config, node_repr, pair_repr, translations, rotations,
        dtypes=(dtype,), device=device, check_values=False,
    )
    if not pair_repr.is_contiguous():
        raise IPAInputError(
            f"pair_repr: expected a contiguous tensor, got strides {pair_repr.stride()} for "
            f"shape {tuple(pair_repr.shape)} (call .contiguous(); the kernels never copy it)"
        )


@dataclass
class Operands:
    """Kernel operands of one call (float32, contiguous) and the frames to go back with."""

    q: torch.Tensor  # (B, H, N, wq): [q * q_scale, pad | query points (global), pad]
    k: torch.Tensor  # (B, H, N, wq): [k, pad | key points (global), pad]
    v: torch.Tensor  # (B, H, N, wv): [v | value points (global) | pad]
    rotations: torch.Tensor  # (B, N, 3, 3) float32 (`project`), or the inputs' (`project_on_gpu`)
    translations: torch.Tensor  # (B, N, 3), as rotations
    widths: Widths


def _projection(weights: Weights, node_repr: torch.Tensor, linear=F.linear) -> torch.Tensor:
    """LayerNorm, then the one projection GEMM (`linear`): (B, N, features) float32."""
    cfg = weights.config
    x = F.layer_norm(node_repr.float(), (cfg.node_dim,), weights.ln_weight, weights.ln_bias)
    return linear(x, weights.projection)


def project(
    weights: Weights,
    node_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    *,
    widths: Widths,
    q_scale: float,
) -> Operands:
    """LayerNorm, one projection GEMM, local -> global points, padded (B, H, N, *) rows."""
    cfg = weights.config
    b, n, _ = node_repr.shape
    h, d = cfg.heads, cfg.head_dim
    q, k, v, q_pts, k_pts, v_pts = _projection(weights, node_repr).split(weights.split_sizes, -1)
    rot, trans = rotations.float(), translations.float()

    def to_global(points: torch.Tensor, count: int) -> torch.Tensor:  # p @ R + t, per head
        local = points.reshape(b, n, h * count, 3)
        world = torch.einsum("bnpc,bncd->bnpd", local, rot) + trans.unsqueeze(2)
        return world.reshape(b, n, h, 3 * count)

    def rows(parts: list[tuple[torch.Tensor, int]]) -> torch.Tensor:  # -> (B, H, N, width)
        padded = [F.pad(t, (0, width - t.shape[-1])) for t, width in parts]
        return torch.cat(padded, dim=-1).permute(0, 2, 1, 3).contiguous()

    qp_w, kp_w = to_global(q_pts, cfg.query_points), to_global(k_pts, cfg.query_points)
    vp_w = to_global(v_pts, cfg.value_points)
    q = q.reshape(b, n, h, d) * q_scale
    k, v = k.reshape(b, n, h, d), v.reshape(b, n, h, d)
    return Operands(
        q=rows([(q, widths.dqp), (qp_w, widths.pqp)]),
        k=rows([(k, widths.dqp), (kp_w, widths.pqp)]),
        v=rows([(torch.cat([v, vp_w], dim=-1), widths.wv)]),
        rotations=rot,
        translations=trans,
        widths=widths,
    )


def _split_linear():
    """`variants.triton.linear.linear_3xtf32`, imported on first use (Triton is not needed
    to import this module)."""
    from variants.triton.linear import linear_3xtf32

    return linear_3xtf32


def _projection_on_gpu(weights: Weights, node_repr: torch.Tensor, split_gemms: bool):
    """`_projection` with its GEMM on tensor cores where `TENSOR_CORE_GEMMS` (module doc)."""
    cfg = weights.config
    half = weights.half
    if TENSOR_CORE_GEMMS and half is not None and node_repr.dtype == half.projection.dtype:
        x = F.layer_norm(node_repr, (cfg.node_dim,), half.ln_weight, half.ln_bias)
        rows = torch.mm(x.view(-1, cfg.node_dim), half.projection.t(), out_dtype=torch.float32)
        return rows.view(*node_repr.shape[:-1], rows.shape[-1])
    if TENSOR_CORE_GEMMS and split_gemms:
        return _projection(weights, node_repr, _split_linear())
    return _projection(weights, node_repr)


def project_on_gpu(
    weights: Weights,
    node_repr: torch.Tensor,
    translations: torch.Tensor,
    rotations: torch.Tensor,
    *,
    widths: Widths,
    q_scale: float,
    split_gemms: bool = False,
) -> Operands:
    """`project` in three launches: LayerNorm, the projection GEMM (on tensor cores: module
    doc; `split_gemms`: float32 as 3xTF32), the extension's prepare_operands (q scale,
    local -> global points, padded rows; it reads the frames in their dtype, as finish_frames
    does: no casts)."""
    cfg = weights.config
    rot, trans = rotations.contiguous(), translations.contiguous()
    q, k, v = load_extension().prepare_operands(
        _projection_on_gpu(weights, node_repr, split_gemms), rot, trans, cfg.heads,
        cfg.head_dim, cfg.query_points, cfg.value_points, widths.dqp, widths.pqp, widths.wv,
        q_scale,
    )
    return Operands(q=q, k=k, v=v, rotations=rot, translations=trans, widths=widths)


def gemms_label(weights: Weights, split_gemms: bool) -> str:
    """How a call's two GEMMs around the kernels run now (module doc), for the rows'
    `kernel_info`."""
    if TENSOR_CORE_GEMMS and weights.half is not None:
        return f"{str(weights.half.projection.dtype).removeprefix('torch.')} tensor cores"
    return "3xTF32 (Triton)" if TENSOR_CORE_GEMMS and split_gemms else "cuBLAS SGEMM"


def local_dtype(weights: Weights, dtype: torch.dtype) -> torch.dtype:
    """The dtype finish_frames writes for a call in `dtype`: the output projection's input,
    16-bit where that GEMM runs on tensor cores in the input dtype (module doc)."""
    return dtype if TENSOR_CORE_GEMMS and weights.half is not None else torch.float32


def output_projection(weights: Weights, local: torch.Tensor, dtype: torch.dtype,
                      split_gemms: bool = False) -> torch.Tensor:
    """out_proj of finish_frames' output `local` (in `local_dtype`) -> (B, N, node_dim) in
    `dtype`: on tensor cores (module doc; `split_gemms`: float32 as 3xTF32) or an SGEMM."""
    if local.dtype != torch.float32:
        return F.linear(local, weights.half.out_weight, weights.half.out_bias)
    if TENSOR_CORE_GEMMS and split_gemms:
        return _split_linear()(local, weights.out_weight, weights.out_bias)
    return F.linear(local, weights.out_weight, weights.out_bias).to(dtype)


def finish_on_gpu(weights: Weights, attended: torch.Tensor, ops: Operands, dtype: torch.dtype,
                  split_gemms: bool = False):
    """`finish` in two launches: the extension's finish_frames, then `output_projection`.
    attended: (B, N, H, >= dv) float32, contiguous."""
    cfg = weights.config
    local = load_extension().finish_frames(attended, ops.rotations, ops.translations,
                                           cfg.head_dim, cfg.value_points,
                                           local_dtype(weights, dtype))
    return output_projection(weights, local, dtype, split_gemms)


def finish(weights: Weights, attended: torch.Tensor, ops: Operands, dtype: torch.dtype):
    """attended (B, N, H, >= dv) float32 [o_s | o_p (global)] -> out (B, N, node_dim) in dtype:
    points back to each residue's local frame, (g - t) @ R^T, then the output projection."""
    cfg = weights.config
    b, n = attended.shape[:2]
    h, d, vp = cfg.heads, cfg.head_dim, cfg.value_points
    o_s = attended[..., :d].reshape(b, n, h * d)
    o_p = attended[..., d : d + 3 * vp].reshape(b, n, h * vp, 3)
    centred = o_p - ops.translations.unsqueeze(2)
    local = torch.einsum("bnpc,bndc->bnpd", centred, ops.rotations).reshape(b, n, h * vp * 3)
    out = F.linear(torch.cat([o_s, local], dim=-1), weights.out_weight, weights.out_bias)
    return out.to(dtype)
