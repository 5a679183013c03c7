"""`variants.triton.launch.DirectLaunch` on the CPU: which calls take Triton's own path and
which the compiled kernel's launcher, and the argument list the launcher gets. The kernel
behind it is a stand-in that records; on the GPU every Triton variant's correctness test
launches through it (`common.direct`, `common.autotuned`)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from variants.triton import launch


def _kernel(X, Y, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = 0):
    pass


class _Compiled:
    """A compiled kernel's stand-in: records each launch's grid and arguments."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, launches: list):
        self.launches = launches

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, g0, g1, g2, stream, function, packed, metadata, enter, exit_, *args):
        self.launches.append(("direct", (g0, g1, g2), stream, list(args)))


class _Tuned:
    """`triton.autotune`'s stand-in: one config, chosen for every key."""

    def __init__(self, block: int = 64):
        self.fn = JITFunction(_kernel)
        self.configs = [triton.Config({"BLOCK": block})]
        self.best_config = self.configs[0]
        self.launches: list = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches.append(("triton", grid, args, kwargs))
            return _Compiled(self.launches)
        return run


@pytest.fixture
def tuned(monkeypatch):
    monkeypatch.setattr(launch, "device_and_stream", lambda: (0, 123))
    return _Tuned()


def _paths(tuned: _Tuned) -> list[str]:
    return [entry[0] for entry in tuned.launches]


def test_second_call_goes_direct_with_every_parameter_in_order(tuned):
    direct = launch.DirectLaunch(tuned)
    x, y = torch.zeros(64), torch.zeros(64)
    grid = lambda meta: (triton.cdiv(100, meta["BLOCK"]),)  # noqa: E731
    direct[grid](x, y, 100, scale=0.5)
    direct[grid](x, y, 100, scale=0.5)
    assert _paths(tuned) == ["triton", "direct"]
    _, launched_grid, stream, args = tuned.launches[1]
    # the config's BLOCK and FLAG's default fill the constexprs; the grid saw BLOCK = 64
    assert launched_grid == (2, 1, 1) and stream == 123
    assert args[:2] == [x, y] and args[2:] == [100, 0.5, 64, 0]
    assert direct.direct_launches == 1 and direct.best_config is tuned.configs[0]


def test_switched_off_every_call_takes_triton_path(tuned, monkeypatch):
    monkeypatch.setattr(launch, "ENABLED", False)
    direct = launch.DirectLaunch(tuned)
    x, y = torch.zeros(64), torch.zeros(64)
    for _ in range(3):
        direct[(1,)](x, y, 100, scale=0.5)
    assert _paths(tuned) == ["triton"] * 3
    assert direct.triton_launches == 3 and direct.direct_launches == 0


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int value", "int to bool",
                                    "keyword order"])
def test_a_new_call_signature_takes_triton_path(tuned, change):
    direct = launch.DirectLaunch(tuned)
    buf, y = torch.zeros(65), torch.zeros(64)
    x = buf[:64]
    direct[(1,)](x, y, 1, scale=0.5, FLAG=1)
    changed = {
        "misaligned": ((buf[1:], y, 1), {"scale": 0.5, "FLAG": 1}),  # 4 bytes off 16
        "dtype": ((x.double(), y, 1), {"scale": 0.5, "FLAG": 1}),
        "int value": ((x, y, 16), {"scale": 0.5, "FLAG": 1}),
        "int to bool": ((x, y, True), {"scale": 0.5, "FLAG": 1}),
        "keyword order": ((x, y, 1), {"FLAG": 1, "scale": 0.5}),
    }[change]
    direct[(1,)](*changed[0], **changed[1])
    assert _paths(tuned) == ["triton", "triton"]
    direct[(1,)](*changed[0], **changed[1])  # and that signature goes direct from then on
    assert _paths(tuned) == ["triton", "triton", "direct"]
    assert tuned.launches[2][3][2:] == [*changed[0][2:], 0.5, 64, 1]


def test_a_grid_that_reads_a_positional_argument(tuned):
    direct = launch.DirectLaunch(tuned)
    grid = lambda meta: (meta["n"] // meta["BLOCK"], 3)  # noqa: E731
    for _ in range(2):
        direct[grid](torch.zeros(4), torch.zeros(4), 256, 0.5, num_warps=8)
    assert _paths(tuned) == ["triton", "direct"] and tuned.launches[1][1] == (4, 3, 1)
    assert len(tuned.launches[1][3]) == 6  # parameters only: num_warps is a compile option


def test_heuristics_and_unknown_parameters_always_take_triton_path(tuned):
    """A `triton.heuristics` kernel may derive a meta-parameter from a tensor's shape, and a
    parameter no call, config or default gives cannot be rebuilt: neither is cached."""
    from triton.runtime.autotuner import Heuristics

    class _Heuristic(Heuristics):
        def __init__(self, inner):  # Triton's own constructor is not needed for the type
            self.fn = inner

    tuned.fn = _Heuristic(tuned.fn)  # autotune(heuristics(jit)), as Triton stacks them
    heuristic = launch.DirectLaunch(tuned)
    for _ in range(2):
        heuristic[(1,)](torch.zeros(4), torch.zeros(4), 4, 0.5)
    assert _paths(tuned) == ["triton"] * 2 and heuristic.direct_launches == 0
    bare = _Tuned()
    bare.configs, bare.best_config = [], None  # no config gives BLOCK
    unknown = launch.DirectLaunch(bare)
    for _ in range(2):
        unknown[(1,)](torch.zeros(4), torch.zeros(4), 4, 0.5)
    assert _paths(bare) == ["triton"] * 2


@pytest.mark.parametrize("value", [[0.5], (0.5,), {0.5: 1}])
def test_a_list_tuple_or_unhashable_argument_always_takes_triton_path(tuned, value):
    direct = launch.DirectLaunch(tuned)
    for _ in range(3):
        direct[(1,)](torch.zeros(4), torch.zeros(4), 4, value)
    assert _paths(tuned) == ["triton"] * 3


def test_new_configs_forget_the_compiled_kernels(tuned):
    direct = launch.DirectLaunch(tuned)
    args = (torch.zeros(4), torch.zeros(4), 4, 0.5)
    direct[(1,)](*args)
    direct.configs = [triton.Config({"BLOCK": 128})]
    tuned.best_config = direct.configs[0]
    direct[(1,)](*args)
    direct[(1,)](*args)
    assert _paths(tuned) == ["triton", "triton", "direct"]
    assert tuned.launches[2][3][4] == 128 and direct.best_config.kwargs == {"BLOCK": 128}


def test_a_plain_jit_kernel_uses_its_defaults(monkeypatch):
    monkeypatch.setattr(launch, "device_and_stream", lambda: (0, 7))
    launches: list = []

    class _Jit(JITFunction):
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append("triton") or _Compiled(launches)

    direct = launch.DirectLaunch(_Jit(_kernel))
    for _ in range(2):
        direct[(3, 2)](torch.zeros(4), torch.zeros(4), 4, 0.5, BLOCK=32)
    assert launches[0] == "triton" and launches[1][:3] == ("direct", (3, 2, 1), 7)
    assert launches[1][3][2:] == [4, 0.5, 32, 0] and direct.best_config is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_triton_forward_repeats_bit_for_bit_through_direct_launches(precision):
    """The `triton` forward's second call, every launch direct, gives the first call's output
    bit for bit; a pair_repr 4 bytes off 16 (a new signature: Triton's path, a kernel without
    the alignment promise) gives the aligned call's values."""
    from variants.problem import IPAConfig, get_precision, make_inputs
    from variants.reference import init_state_dict
    from variants.registry import get_variant

    config, dtype = IPAConfig(), get_precision(precision).dtype
    fn = get_variant("triton").build(init_state_dict(config, seed=3), config, "cuda", precision)
    node, pair, t, r = make_inputs(config, 1, 200, dtype=dtype, device="cuda", seed=2).as_tuple()
    first = fn(node, pair, t, r)
    before = sum(k.direct_launches for k in launch.INSTANCES)
    second = fn(node, pair, t, r)
    assert sum(k.direct_launches for k in launch.INSTANCES) - before >= 4
    assert torch.equal(first, second)
    shifted = torch.empty(pair.numel() + 1, dtype=dtype, device="cuda")[1:].view(pair.shape)
    shifted.copy_(pair)
    assert shifted.data_ptr() % 16 != 0
    torch.testing.assert_close(fn(node, shifted, t, r), first, rtol=1e-5, atol=1e-5)
