"""Pieces every Triton kernel family here shares: argument checks, the dot modes of one
(dtype, math mode), padding, ranges split over programs, and autotuning on the GPU versus one
fixed config under the interpreter.

`triton.jit` decides when a kernel is defined whether it is interpreted: it reads
`TRITON_INTERPRET` then, that is when the kernel modules of this package are first imported.
`INTERPRET` is read at the same moment (every kernel module imports this one first), so the
launchers and the kernels agree. The Makefile sets `TRITON_INTERPRET=1` for the whole CPU test
process; a process that sets it later gets compiled kernels, and the variants say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from variants.problem import IPAInputError
from variants.triton.launch import DirectLaunch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HEADS_PAD = 16  # the bias GEMM's head axis and the fully fused kernel's (tl.dot needs >= 16)

# Every kernel wrapped by `autotuned`, by name (the GPU script prints their chosen configs).
TUNED: dict[str, object] = {}


@triton.jit
def multiple_of_16(x, ALIGNED: tl.constexpr):
    """x as the compiler may see it divisible by 16 when ALIGNED (the launcher's promise,
    `aligned`): (x // 16) * 16 == x. The kernels do not specialise their lengths (one compile
    serves every N), so without it a row of an N-long axis looks 4-byte aligned and a key mask
    changes at every element, and each tile is loaded by 4-byte copies (sm_90 proxy, the
    `triton` attention kernel: 224 of its 230 async copies; with it 8- and 16-byte copies,
    fp32 2.62 -> 2.25 instructions per pair, triton-train's key kernel 2.15 -> 1.27)."""
    if ALIGNED:
        x = (x // 16) * 16
    return x


def aligned(*lengths: int) -> bool:
    """Whether every length is a multiple of 16 (`multiple_of_16`'s promise)."""
    return all(n % 16 == 0 for n in lengths)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host code: `triton.cdiv` costs ~1.5 us a call (a constexpr function's
    wrapper), ten calls a forward."""
    return -(-a // b)


def pow2(x: int, at_least: int = 16) -> int:
    """The smallest power of two >= max(x, at_least)."""
    return max(at_least, 1 << (max(1, x) - 1).bit_length())


class _FixedConfig:
    """A jitted kernel launched with one fixed set of meta-parameters: `kernel[grid](...)`
    is `kernel[grid](..., **meta)`."""

    def __init__(self, kernel, meta: dict[str, int]):
        self.kernel = kernel
        self.meta = meta

        self.launched = False

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        self.launched = True
        return lambda *args, **kwargs: launch(*args, **kwargs, **self.meta)


def direct(kernel):
    """`kernel` launched through its compiled kernel's own launcher after the first call of
    each call signature (`launch.DirectLaunch`); under the interpreter, `kernel` itself."""
    return kernel if INTERPRET else DirectLaunch(kernel)


def autotuned(name: str, kernel, *, configs: list, key: list[str], interpreted: dict[str, int],
              restore_value: list[str] | None = None):
    """`kernel` autotuned over `configs` (keyed on `key`) on the GPU; under the interpreter,
    where `triton.autotune` with several configs fails, `kernel` with the meta-parameters
    `interpreted` and no autotuner. Launch either as `result[grid](...)` (on the GPU through
    `direct`). `restore_value`: arguments the kernel writes over, restored after each trial
    run."""
    if INTERPRET:
        tuned = _FixedConfig(kernel, interpreted)
    else:
        tuned = DirectLaunch(triton.autotune(configs=configs, key=key,
                                             restore_value=restore_value)(kernel))
    TUNED[name] = tuned
    return tuned


def block_configs(blocks: list[tuple[int, ...]],
                  names: tuple[str, ...] = ("BLOCK_M", "BLOCK_N")) -> list:
    """Autotune configs from (one block size per name in `names`, warps, stages[, register
    cap]) tuples; by default (BLOCK_M, BLOCK_N, ...)."""
    k = len(names)
    return [triton.Config(dict(zip(names, b[:k], strict=True)), num_warps=b[k],
                          num_stages=b[k + 1], maxnreg=b[k + 2] if len(b) > k + 2 else None)
            for b in blocks]


def whole_blocks(length: int, tuned, *names: str) -> bool:
    """Whether `length` is a multiple of every block size that the `autotuned` kernel's
    meta-parameters `names` may take along it: the kernels' EVEN promise, no partial block."""
    return all(length % largest_meta(tuned, name) == 0 for name in names)


def largest_meta(tuned, name: str) -> int:
    """The largest value of the meta-parameter `name` that an `autotuned` kernel may launch
    with (a range split over programs must be a multiple of every block size)."""
    configs = getattr(tuned, "configs", None)
    return max(c.kwargs[name] for c in configs) if configs else tuned.meta[name]


def chosen_configs() -> str:
    """The meta-parameters of every autotuned kernel launched so far in this process (the
    autotuner's choice for its last key): which kernel a row's timing measured. A worker
    process runs one variant, so there these are that variant's kernels."""
    chosen = []
    for name, tuned in TUNED.items():
        if isinstance(tuned, _FixedConfig):
            if tuned.launched:
                chosen.append(f"{name}: interpreted {tuned.meta}")
        elif getattr(tuned, "best_config", None) is not None:
            chosen.append(f"{name}: {tuned.best_config}")
    return "; ".join(chosen)


def check_runnable(name: str, t: torch.Tensor) -> None:
    """Compiled kernels need CUDA tensors; only interpreted ones run on the CPU."""
    require(INTERPRET or t.is_cuda,
            f"{name}: expected a CUDA tensor, got device {t.device}: the Triton kernels were "
            "defined without TRITON_INTERPRET=1 (read when variants.triton's kernel modules "
            "are first imported)")


def cast_f32(dtype: torch.dtype) -> bool:
    """Whether the kernels cast their dot operands to fp32: under the interpreter, whose bf16
    and fp16 `tl.dot` is wrong, for every input that is not fp32 already."""
    return INTERPRET and dtype != torch.float32


# ---- ranges split over programs ------------------------------------------------------------


def split_range(length: int, split: int, multiple: int = 64) -> tuple[int, int]:
    """About `split` ranges of `length` rows: (their number, rows per range). Each range covers a
    multiple of `multiple` rows (every block size must divide it) and none is empty."""
    split_len = multiple * cdiv(cdiv(length, split), multiple)
    return cdiv(length, split_len), split_len


def split_for_sms(programs: int, length: int, device: torch.device, per_sm: int,
                  min_range: int = 256) -> int:
    """Ranges to split the loop of each of a grid's `programs` into, so that the grid has
    about `per_sm` programs per SM, each range at least `min_range` of `length` rows long; 1
    off the GPU."""
    if device.type != "cuda":
        return 1
    return max(1, min(cdiv(per_sm * sm_count(device), programs), length // min_range))


def sm_count(device: torch.device) -> int:
    """The CUDA device's streaming multiprocessors."""
    return torch.cuda.get_device_properties(device).multi_processor_count


# ---- how the dots run ----------------------------------------------------------------------


class SideStream:
    """Kernels launched inside `with side:` run on a second CUDA stream that starts after the
    work queued on the caller's stream when `side` was made, so that they run beside what the
    caller launches after that on its own (made before the caller's launch that they are to run
    beside, entered after it); `side.join(*tensors)` then makes the caller's stream wait for
    them, and marks the tensors made on the side stream as used by the caller's (the caching
    allocator then keeps their memory until the caller's work is done). Both streams are
    captured alike in a CUDA graph. Where `enabled` is false, or off the GPU, the block runs
    on the caller's stream and `join` does nothing."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.stream = None
        if enabled and device.type == "cuda" and not INTERPRET:
            self.main = torch.cuda.current_stream(device)
            index = torch.cuda.current_device() if device.index is None else device.index
            if index not in _side_streams:
                _side_streams[index] = torch.cuda.Stream(index, priority=-1)
            self.stream = _side_streams[index]
            self.stream.wait_stream(self.main)
        self._context = None

    def __enter__(self) -> SideStream:
        if self.stream is not None:
            self._context = torch.cuda.stream(self.stream)
            self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)

    def join(self, *tensors: torch.Tensor) -> None:
        if self.stream is not None:
            self.main.wait_stream(self.stream)
            for t in tensors:
                t.record_stream(self.main)


_side_streams: dict[int, torch.cuda.Stream] = {}


@dataclass(frozen=True)
class Modes:
    """How each dot of the kernels runs for one (dtype, math mode)."""

    dot: str  # q.k, p.v and a fused kernel's pair bias
    points: str  # p.v_pts (fp32 operands)
    points_dot: bool  # distances as a centred 3xTF32 dot (else computed directly)
    bias: str  # the separate (B, H, N, N) pair-bias GEMM (`pair_bias.py`)
    split_dots: bool = False  # fp32: the attention kernel's q.k, p.v, p.v_pts as 3xTF32
    # 16-bit inputs: the attention kernel's point cross term and p.v_pts as 3xBF16 (one
    # tensor-core layout with its bf16 dots), not 3xTF32 and TF32 (`triton_ipa(half_points=)`)
    split_bf16: bool = False


def dot_modes(dtype: torch.dtype, math_mode: str) -> Modes:
    """fp32 "ieee": fp32-accurate dots, distances computed directly; the separate pair-bias
    GEMM and the attention kernel's q.k, p.v and p.v_pts as 3xTF32 on tensor cores (the row's
    math_mode says `fp32-3xtf32`), the fused kernels' dots as IEEE FMAs. fp32 "tf32": TF32
    tensor cores, distances as a centred 3xTF32 dot. bf16/fp16: tensor cores, distances as a
    centred dot; in the attention kernel its cross term and p.v_pts as 3xBF16 (`split_bf16`),
    elsewhere the points in 3xTF32 and TF32.
    """
    require(math_mode in ("ieee", "tf32"),
            f"math_mode: expected 'ieee' or 'tf32', got {math_mode!r}")
    if dtype == torch.float32:
        if math_mode == "ieee":
            return Modes("ieee", "ieee", False, "tf32x3", split_dots=True)
        return Modes("tf32", "tf32", True, "tf32")
    require(math_mode == "ieee", f"math_mode: {math_mode!r} applies to fp32 inputs only")
    return Modes("ieee", "tf32", True, "ieee", split_bf16=True)


# ---- argument checks -----------------------------------------------------------------------


def require(ok: bool, message: str) -> None:
    if not ok:
        raise IPAInputError(message)


def check_split(split) -> None:
    require(split is None or (isinstance(split, int) and not isinstance(split, bool)
                              and split >= 1),
            f"split: expected None or an int >= 1, got {split!r}")


def check_tensor(name, t, shape, *, dtype=None, device=None, contiguous=False):
    require(
        isinstance(t, torch.Tensor), f"{name}: expected a torch.Tensor, got {type(t).__name__}"
    )
    require(
        tuple(t.shape) == tuple(shape),
        f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}",
    )
    require(dtype is None or t.dtype == dtype, f"{name}: expected dtype {dtype}, got {t.dtype}")
    require(
        device is None or t.device == device, f"{name}: expected device {device}, got {t.device}"
    )
    require(
        not contiguous or t.is_contiguous(),
        f"{name}: expected a contiguous tensor, got strides {t.stride()}",
    )


def check_pair_repr(pair_repr, weight, *, weight_name: str):
    """pair_repr (B, N, N, C), any strides; `weight` (H, C) contiguous in its dtype and on its
    device, 1 <= H <= HEADS_PAD. Returns (B, N, C, H)."""
    require(isinstance(pair_repr, torch.Tensor) and pair_repr.dim() == 4,
            f"pair_repr: expected a 4-dim tensor (B, N, N, C), got "
            f"{tuple(pair_repr.shape) if isinstance(pair_repr, torch.Tensor) else pair_repr}")
    b, n, _, c = pair_repr.shape
    check_tensor("pair_repr", pair_repr, (b, n, n, c))
    require(isinstance(weight, torch.Tensor) and weight.dim() == 2,
            f"{weight_name}: expected a 2-dim tensor (H, C)")
    h = weight.shape[0]
    check_tensor(weight_name, weight, (h, c), dtype=pair_repr.dtype, device=pair_repr.device,
                 contiguous=True)
    require(1 <= h <= HEADS_PAD, f"{weight_name}: expected 1..{HEADS_PAD} heads, got {h}")
    return b, n, c, h


def _check_heads_view(name, t, shape, device):
    """(B, N, H, D) views into a wider row: innermost strides (D, 1) are what the kernels assume."""
    check_tensor(name, t, shape, device=device)
    require(
        t.stride(3) == 1 and t.stride(2) == shape[3],
        f"{name}: expected strides (*, *, {shape[3]}, 1) (heads packed in a row), got {t.stride()}",
    )


def check_attention_args(q, k, v, q_pts, k_pts, v_pts, centred_t, point_weight, out_s=None):
    """The operands every attention kernel shares (`out_s` where the caller passes the output);
    see `attention.ipa_attention` for their shapes."""
    require(isinstance(q, torch.Tensor) and q.dim() == 4, "q: expected 4 dims (B, N, H, D)")
    b, n, h, d = q.shape
    dev = q.device
    views = (("q", q), ("k", k), ("v", v)) + ((("out_s", out_s),) if out_s is not None else ())
    for name, t in views:
        _check_heads_view(name, t, (b, n, h, d), dev)
    for name, t in views[1:]:
        require(t.dtype == q.dtype, f"{name}: expected dtype {q.dtype} (as q), got {t.dtype}")
    require(q_pts.dim() == 4, f"q_pts: expected 4 dims (B, H, 3*Qp, N), got {q_pts.dim()}")
    p3 = q_pts.shape[2]
    require(p3 % 3 == 0, f"q_pts: expected 3*Qp point coordinates in dim 2, got {p3}")
    check_tensor("q_pts", q_pts, (b, h, p3, n), dtype=torch.float32, device=dev, contiguous=True)
    check_tensor("k_pts", k_pts, (b, h, p3, n), dtype=torch.float32, device=dev, contiguous=True)
    require(v_pts.dim() == 4, f"v_pts: expected 4 dims (B, H, N, 3*Vp), got {v_pts.dim()}")
    vp3 = v_pts.shape[3]
    require(vp3 % 3 == 0, f"v_pts: expected 3*Vp point coordinates in dim 3, got {vp3}")
    check_tensor("v_pts", v_pts, (b, h, n, vp3), dtype=torch.float32, device=dev,
                 contiguous=True)
    check_tensor("centred_t", centred_t, (b, n, 3), dtype=torch.float32, device=dev,
                 contiguous=True)
    check_tensor("point_weight", point_weight, (h,), dtype=torch.float32, device=dev,
                  contiguous=True)
    require(1 <= h <= HEADS_PAD, f"q: expected 1..{HEADS_PAD} heads, got {h}")
    require(8 <= d <= 128, f"q: expected head_dim in [8, 128], got {d}")


def check_fused_pair_args(q, pair_repr, pair_weight):
    """pair_repr (B, N, N, C) in q's dtype and device, any strides, and its weight (H, C), for
    the kernels that compute the pair bias themselves (q: (B, N, H, D))."""
    b, n, h, _ = q.shape
    require(isinstance(pair_repr, torch.Tensor) and pair_repr.dim() == 4,
            "pair_repr: expected a 4-dim tensor (B, N, N, C)")
    check_tensor("pair_repr", pair_repr, (b, n, n, pair_repr.shape[3]), dtype=q.dtype,
                 device=q.device)
    _, _, c, _ = check_pair_repr(pair_repr, pair_weight, weight_name="pair_weight")
    check_tensor("pair_weight", pair_weight, (h, c))
