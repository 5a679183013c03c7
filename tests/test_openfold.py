"""Problem `openfold` (SPEC-openfold.md): config, parameters and the v1 converter, the layout
traps, the mask, invariance, the float64 oracle, an independent loop implementation, the input
generator and input checks. CPU, float64 where exactness is asserted, awkward sizes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from variants import problem as simplified
from variants.openfold import PROBLEM
from variants.openfold.problem import (
    HEAD_WEIGHT_INIT,
    V1_KEYS,
    V2_KEYS,
    OpenFoldConfig,
    OpenFoldInputs,
    check_state_dict,
    convert_v1_state_dict,
    convert_v2_state_dict,
    default_lengths,
    flops,
    init_state_dict,
    invariance_rows,
    make_inputs,
    min_bytes,
    output_parts,
    parameter_spec,
    rigid_motion,
    validate_inputs,
)
from variants.openfold.reference import (
    OpenFoldIPA,
    PointProjection,
    Reference,
    chunked_forward,
    make_module,
    oracle_forward,
)
from variants.problem import IPAInputError
from variants.registry import all_variants, get_variant

F64 = torch.float64
# Awkward sizes: nothing a power of two, C != c_s / H, Pq != Pv.
CFG = OpenFoldConfig(c_s=11, c_z=7, c_hidden=5, no_heads=3, no_qk_points=2, no_v_points=3)
LENGTHS = (13, 9, 5)


def inputs64(seed: int = 0, lengths=LENGTHS, config=CFG) -> OpenFoldInputs:
    return make_inputs(config, len(lengths), max(lengths), dtype=F64, seed=seed,
                       lengths=list(lengths))


def module64(sd=None, config=CFG) -> OpenFoldIPA:
    return make_module(init_state_dict(config) if sd is None else sd, config, "cpu", F64)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def concat_input(module: OpenFoldIPA, inputs: OpenFoldInputs) -> torch.Tensor:
    """What linear_out reads: cat[o, X, Y, Z, o_pt_norm, o_pair] (B, N, H(C + 4Pv + c_z))."""
    seen = []
    handle = module.linear_out.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        module(*inputs.as_tuple())
    finally:
        handle.remove()
    return seen[0]


def identity_frames(x: OpenFoldInputs) -> OpenFoldInputs:
    eye = torch.eye(3, dtype=x.rotations.dtype).expand_as(x.rotations).contiguous()
    return OpenFoldInputs(x.s, x.z, torch.zeros_like(x.translations), eye, x.mask)


# ---- configuration -------------------------------------------------------------------------

def test_config_defaults_are_the_spec_af2_sizes():
    c = OpenFoldConfig()
    assert (c.c_s, c.c_z, c.c_hidden, c.no_heads, c.no_qk_points, c.no_v_points) == (
        384, 128, 16, 12, 4, 8)
    assert (c.inf, c.eps) == (1e5, 1e-8)
    assert c.module_args() == (384, 128, 16, 12, 4, 8)
    assert c.out_in_features == 12 * (16 + 32 + 128)
    assert OpenFoldConfig.from_columns(**c.columns()) == c


@pytest.mark.parametrize("kwargs, fragment", [
    ({"c_s": 0}, "c_s: expected a positive integer, got 0"),
    ({"no_heads": 2.5}, "no_heads: expected a positive integer, got 2.5"),
    ({"no_v_points": True}, "no_v_points: expected a positive integer, got True"),
    ({"inf": 0.0}, "inf: expected a positive finite number, got 0.0"),
    ({"inf": math.inf}, "inf: expected a positive finite number, got inf"),
    ({"eps": -1e-8}, "eps: expected a non-negative finite number, got -1e-08"),
])
def test_config_rejects_bad_values_naming_them(kwargs, fragment):
    with pytest.raises(IPAInputError, match=fragment):
        OpenFoldConfig(**kwargs)


# ---- parameters, init, v1 names ------------------------------------------------------------

def test_module_state_dict_is_exactly_the_openfold_v2_keys_and_shapes():
    module = OpenFoldIPA(*CFG.module_args())
    got = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    assert list(got) == [p.key for p in parameter_spec(CFG)] and set(got) == set(V2_KEYS)
    H, C, Pq, Pv = 3, 5, 2, 3
    assert got == {
        "linear_q.weight": (H * C, 11), "linear_q.bias": (H * C,),
        "linear_kv.weight": (2 * H * C, 11), "linear_kv.bias": (2 * H * C,),
        "linear_q_points.linear.weight": (3 * H * Pq, 11),
        "linear_q_points.linear.bias": (3 * H * Pq,),
        "linear_kv_points.linear.weight": (3 * H * (Pq + Pv), 11),
        "linear_kv_points.linear.bias": (3 * H * (Pq + Pv),),
        "linear_b.weight": (H, 7), "linear_b.bias": (H,), "head_weights": (H,),
        "linear_out.weight": (11, H * (C + 4 * Pv + 7)), "linear_out.bias": (11,),
    }


def test_openfold_init_is_the_spec_init():
    config = OpenFoldConfig()
    sd = init_state_dict(config, seed=3, openfold_init=True)
    assert HEAD_WEIGHT_INIT == pytest.approx(0.541324854612918, abs=1e-15)
    assert torch.allclose(F.softplus(sd["head_weights"].double()), torch.ones(12, dtype=F64))
    assert all(not sd[k].any() for k in sd if k.endswith(".bias"))
    assert not sd["linear_out.weight"].any()  # OpenFold's "final" init
    w = sd["linear_q.weight"]  # LeCun normal: variance 1 / fan_in, truncated at 2 sigma
    assert w.std().item() == pytest.approx(1 / math.sqrt(384), rel=0.03)
    assert w.abs().max().item() <= 2 / math.sqrt(384) / 0.8796256610342398 + 1e-6
    # ... which is why benchmarks cannot use it: the output is the bias, whatever the input.
    out = make_module(sd, config, "cpu", torch.float32)(*make_inputs(config, 2, 5).as_tuple())
    assert not out.any()


def test_init_is_seeded():
    a, b, c = init_state_dict(CFG, 0), init_state_dict(CFG, 0), init_state_dict(CFG, 1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["linear_q.weight"], c["linear_q.weight"])
    assert torch.equal(OpenFoldIPA(*CFG.module_args()).linear_q.weight, a["linear_q.weight"])


def test_benchmark_init_moves_linear_out_and_head_weights_off_the_openfold_init():
    sd = init_state_dict(CFG)
    assert sd["linear_out.weight"].abs().min() > 0
    assert len(set(sd["head_weights"].tolist())) == CFG.no_heads  # heads distinguishable
    out = module64(sd)(*inputs64().as_tuple())
    assert (out - sd["linear_out.bias"].double()).abs().amin(dim=-1).max() > 1e-3


# Every bias shows in the output under the benchmark init, except the two that shift a whole
# logit row equally (softmax does not see them).
SHIFT_ONLY = {"linear_b.bias": None, "linear_kv.bias": slice(0, CFG.c_hidden)}


@pytest.mark.parametrize("key", [p.key for p in parameter_spec(CFG) if p.key.endswith("bias")]
                         + ["linear_kv.bias:v-half"])
def test_benchmark_init_makes_each_bias_matter(key):
    sd = init_state_dict(CFG)
    x = inputs64()
    base = module64(sd)(*x.as_tuple())
    changed = dict(sd)
    name, _, part = key.partition(":")
    bias = sd[name].clone().view(-1)
    if name == "linear_kv.bias":  # per head: [k (C) | v (C)]
        per_head = bias.view(CFG.no_heads, 2 * CFG.c_hidden)
        cols = slice(CFG.c_hidden, None) if part else slice(0, CFG.c_hidden)
        per_head[:, cols] = 0
    else:
        bias.zero_()
    changed[name] = bias.view(sd[name].shape)
    diff = rel(module64(changed)(*x.as_tuple()), base)
    if name in SHIFT_ONLY and not part:
        assert diff < 1e-10  # rounding of masked rows' logits at -1e5 (ulp 1.5e-11)
    else:
        assert diff > 1e-3


def test_v1_v2_converter_round_trips_and_loads():
    v2 = init_state_dict(CFG, seed=5)
    v1 = convert_v2_state_dict(v2)
    assert set(v1) == set(V1_KEYS)
    assert "linear_q_points.weight" in v1 and "linear_kv_points.bias" in v1
    assert v1["linear_q_points.weight"] is v2["linear_q_points.linear.weight"]
    back = convert_v1_state_dict(v1)
    assert set(back) == set(v2) and all(back[k] is v2[k] for k in v2)
    x = inputs64()
    assert torch.equal(module64(back)(*x.as_tuple()), module64(v2)(*x.as_tuple()))


def test_v1_converter_names_unknown_and_missing_keys():
    v1 = convert_v2_state_dict(init_state_dict(CFG))
    bad = {k: v for k, v in v1.items() if k != "linear_kv_points.bias"}
    bad["structure_module.ipa.linear_q.weight"] = v1["linear_q.weight"]
    with pytest.raises(IPAInputError, match=r"missing: linear_kv_points\.bias; unknown: "
                       r"structure_module\.ipa\.linear_q\.weight"):
        convert_v1_state_dict(bad)
    with pytest.raises(IPAInputError, match="already the target names; a v2 state_dict loads "
                       "without conversion"):
        convert_v1_state_dict(init_state_dict(CFG))


def test_check_state_dict_names_keys_and_shapes():
    sd = init_state_dict(CFG)
    check_state_dict(CFG, sd)
    with pytest.raises(IPAInputError, match="OpenFold v1 names: convert them"):
        check_state_dict(CFG, convert_v2_state_dict(sd))
    with pytest.raises(IPAInputError, match=r"state_dict\['linear_b.weight'\]: expected shape "
                       r"\(3, 7\), got \(3, 8\)"):
        check_state_dict(CFG, {**sd, "linear_b.weight": torch.zeros(3, 8)})


# ---- layout traps --------------------------------------------------------------------------

@pytest.mark.parametrize("axis, head, point", [(0, 0, 0), (1, 2, 1), (2, 1, 0), (2, 2, 1)])
def test_point_row_is_axis_major_then_head_then_point(axis, head, point):
    H, P = CFG.no_heads, CFG.no_qk_points
    proj = PointProjection(CFG.c_s, P, H).double()
    with torch.no_grad():
        proj.linear.weight.zero_()
        proj.linear.bias.zero_()
        proj.linear.bias[axis * H * P + head * P + point] = 1.0
    rot = torch.eye(3, dtype=F64).expand(1, 4, 3, 3)
    pts = proj(torch.randn(1, 4, CFG.c_s, dtype=F64), rot, torch.zeros(1, 4, 3, dtype=F64))
    expected = torch.zeros(1, 4, H, P, 3, dtype=F64)
    expected[:, :, head, point, axis] = 1.0
    assert torch.equal(pts, expected)


def test_points_use_the_column_convention():
    proj = PointProjection(CFG.c_s, 1, 1).double()
    with torch.no_grad():
        proj.linear.weight.zero_()
        proj.linear.bias.copy_(torch.tensor([1.0, 0.0, 0.0], dtype=F64))  # local e_x
    rz = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=F64)
    t = torch.tensor([10.0, 20.0, 30.0], dtype=F64)
    pts = proj(torch.zeros(1, 1, CFG.c_s, dtype=F64), rz.view(1, 1, 3, 3), t.view(1, 1, 3))
    assert pts.view(3).tolist() == [10.0, 21.0, 30.0]  # R e_x + t = (0, 1, 0) + t


def _one_hot_module(key: str, row: int) -> OpenFoldIPA:
    """Every weight and bias of `key`'s linear zero but one bias row set to 1."""
    sd = init_state_dict(CFG)
    sd[key + ".weight"] = torch.zeros_like(sd[key + ".weight"])
    sd[key + ".bias"] = torch.zeros_like(sd[key + ".bias"])
    sd[key + ".bias"][row] = 1.0
    return module64(sd)


@pytest.mark.parametrize("head, channel", [(0, 0), (1, 4), (2, 2)])
def test_kv_interleave_per_head(head, channel):
    """Row h*2C + C + c of linear_kv is value channel c of head h; o is head-major."""
    C, H = CFG.c_hidden, CFG.no_heads
    x = inputs64()
    cat = concat_input(_one_hot_module("linear_kv", head * 2 * C + C + channel), x)
    expected = torch.zeros(H * C, dtype=F64)
    expected[head * C + channel] = 1.0
    assert torch.allclose(cat[..., :H * C], expected.expand_as(cat[..., :H * C]), atol=1e-12)
    key_row = concat_input(_one_hot_module("linear_kv", head * 2 * C + channel), x)
    assert not key_row[..., :H * C].any()  # a key channel: v stays zero


@pytest.mark.parametrize("axis, head, point", [(0, 0, 0), (1, 2, 2), (2, 1, 1)])
def test_value_points_follow_the_key_points_within_each_head(axis, head, point):
    H, C, Pq, Pv, eps = CFG.no_heads, CFG.c_hidden, CFG.no_qk_points, CFG.no_v_points, CFG.eps
    x = identity_frames(inputs64())
    row = axis * H * (Pq + Pv) + head * (Pq + Pv) + Pq + point
    cat = concat_input(_one_hot_module("linear_kv_points.linear", row), x)
    o_pt = cat[..., H * C:H * C + 3 * H * Pv].reshape(*cat.shape[:2], 3, H * Pv)  # X, Y, Z
    expected = torch.zeros(3, H * Pv, dtype=F64)
    expected[axis, head * Pv + point] = 1.0
    assert torch.allclose(o_pt, expected.expand_as(o_pt), atol=1e-12)
    norms = cat[..., H * C + 3 * H * Pv:H * C + 4 * H * Pv]
    want = torch.full((H * Pv,), math.sqrt(eps), dtype=F64)
    want[head * Pv + point] = math.sqrt(1 + eps)  # eps inside the sqrt
    assert torch.allclose(norms, want.expand_as(norms), rtol=0, atol=1e-15)

    key_row = axis * H * (Pq + Pv) + head * (Pq + Pv) + (point % Pq)  # a key point
    cat = concat_input(_one_hot_module("linear_kv_points.linear", key_row), x)
    assert not cat[..., H * C:H * C + 3 * H * Pv].abs().gt(1e-12).any()


def test_pair_values_read_z_ij_and_are_head_major():
    """z constant along j: o_pair[i, h] = z[i, 0] for every head, whatever the attention."""
    H, C, Pv, cz = CFG.no_heads, CFG.c_hidden, CFG.no_v_points, CFG.c_z
    x = inputs64()
    f = torch.randn(3, 13, 1, cz, dtype=F64)
    x = OpenFoldInputs(x.s, f.expand(3, 13, 13, cz).contiguous(), x.translations,
                       x.rotations, x.mask)
    o_pair = concat_input(module64(), x)[..., H * (C + 4 * Pv):]
    assert o_pair.shape[-1] == H * cz
    assert torch.allclose(o_pair.view(3, 13, H, cz), f.expand(3, 13, H, cz), atol=1e-12)


# ---- the mask --------------------------------------------------------------------------------

def test_masked_query_rows_are_computed_as_if_unmasked():
    x = inputs64()
    module = module64()
    out = module(*x.as_tuple())
    unmasked = module(*OpenFoldInputs(x.s, x.z, x.translations, x.rotations,
                                      torch.ones_like(x.mask)).as_tuple())
    masked = x.mask == 0
    assert masked.sum() == (13 - 9) + (13 - 5)
    assert rel(out[masked], unmasked[masked]) < 1e-9  # shifted by -1e5 everywhere: same row
    assert rel(out[masked], module.linear_out.bias.expand_as(out[masked])) > 0.1  # not zeroed
    uniform = loop_ipa(init_state_dict(CFG), CFG, x, bug="uniform-masked-rows")
    assert rel(out[masked], uniform[masked]) > 1e-2  # not uniform attention


def test_masked_keys_get_zero_weight():
    """Anything in the padded tail (features, pair entries, frames) leaves present rows
    unchanged, and a padded element equals the same residues run unpadded."""
    x = inputs64()
    module = module64()
    out = module(*x.as_tuple())
    tail = x.mask == 0
    s, z, t, r = x.s.clone(), x.z.clone(), x.translations.clone(), x.rotations.clone()
    s[tail] = 1e3
    z.transpose(1, 2)[tail] = -1e3  # z[b, i, j] for masked keys j
    t[tail] = -500.0
    r[tail] = simplified.random_rotations(int(tail.sum()), torch.Generator().manual_seed(9))
    spoiled = module(s, z, t, r, x.mask)
    present = x.mask != 0
    assert (spoiled[present] - out[present]).abs().max() < 1e-12
    for b, n in enumerate(LENGTHS):
        alone = module(x.s[b:b + 1, :n], x.z[b:b + 1, :n, :n], x.translations[b:b + 1, :n],
                       x.rotations[b:b + 1, :n], x.mask[b:b + 1, :n])
        assert (alone[0] - out[b, :n]).abs().max() < 1e-12


# ---- invariance, precision, oracle ---------------------------------------------------------

class InverseFrameBug(OpenFoldIPA):
    """Planted bug: back-rotation by R where R^T belongs."""

    def to_local(self, o_pt_g, rotations, translations):
        return super().to_local(o_pt_g, rotations.transpose(-1, -2), translations)


def test_se3_invariance_on_present_rows():
    x = inputs64(seed=2)
    moved = rigid_motion(x, seed=2)
    rows = invariance_rows(x)
    assert torch.equal(rows, x.mask != 0)
    assert (moved.translations - x.translations).norm(dim=-1).min() > 1.0  # it moved
    simplified.check_input_values(x.s, x.z, moved.translations, moved.rotations)
    sd = init_state_dict(CFG)
    module = module64(sd)
    assert rel(module(*moved.as_tuple())[rows], module(*x.as_tuple())[rows]) < 1e-12
    bug = InverseFrameBug(*CFG.module_args()).double()
    bug.load_state_dict(sd)
    assert rel(bug(*moved.as_tuple())[rows], bug(*x.as_tuple())[rows]) > 1e-3


def test_fp16_needs_the_low_precision_inf():
    """inf = 1e5 overflows fp16: masked query rows are NaN (why fp16 is unsupported there)."""
    x = make_inputs(CFG, 3, 13, dtype=torch.float16, lengths=list(LENGTHS))
    sd = init_state_dict(CFG)
    out = make_module(sd, CFG, "cpu", torch.float16)(*x.as_tuple())
    assert torch.isnan(out).any(dim=-1).equal(x.mask == 0)
    low = OpenFoldConfig(**{**CFG.__dict__, "inf": 1e4})
    assert torch.isfinite(make_module(sd, low, "cpu", torch.float16)(*x.as_tuple())).all()


def test_float32_reference_against_the_float64_oracle_by_part():
    """Present rows are fp32-accurate; masked query rows carry the -1e5 shift's rounding,
    hence judged apart (output_parts)."""
    sd = init_state_dict(CFG)
    x32 = make_inputs(CFG, 3, 13, dtype=torch.float32, seed=4, lengths=list(LENGTHS))
    oracle = oracle_forward(sd, CFG, x32)
    out = make_module(sd, CFG, "cpu", torch.float32)(*x32.as_tuple())
    assert out.dtype == torch.float32
    parts = output_parts(x32)
    err = {name: rel(out[rows], oracle[rows]) for name, rows in parts.items()}
    assert err["present"] < simplified.PRECISIONS["fp32"].tol_floor
    assert err["masked"] > 10 * err["present"]


def test_chunked_oracle_equals_the_whole():
    sd = init_state_dict(CFG)
    x = inputs64()
    whole = oracle_forward(sd, CFG, x)
    chunked = oracle_forward(sd, CFG, x, max_elements=3 * 13 * 3 * 2 * 3 * 4)  # 4 rows a chunk
    assert (whole - chunked).abs().max() < 1e-12
    assert torch.equal(whole, chunked_forward(module64(sd), x))


# ---- an independent implementation ---------------------------------------------------------

def loop_ipa(state_dict, cfg: OpenFoldConfig, x: OpenFoldInputs, bug: str | None = None
             ) -> torch.Tensor:
    """SPEC-openfold.md in plain Python floats: weight rows picked by the SPEC's index
    formulas, explicit 3x3 frame algebra, explicit softmax. `bug` plants a known mistake."""
    W = {k: v.double().tolist() for k, v in state_dict.items()}
    s, z, t, R, mask = (v.double().tolist() for v in x.as_tuple())
    B, N = x.batch, x.length
    H, C, Pq, Pv, cz = cfg.no_heads, cfg.c_hidden, cfg.no_qk_points, cfg.no_v_points, cfg.c_z
    Pkv = Pq + Pv

    def linear(name, vec):
        w, b = W[name + ".weight"], W[name + ".bias"]
        return [sum(wr[c] * vec[c] for c in range(len(vec))) + br
                for wr, br in zip(w, b, strict=True)]

    def to_global(Rn, tn, p):  # R p + t (column convention)
        if bug == "row-convention":
            return [sum(p[y] * Rn[y][xx] for y in range(3)) + tn[xx] for xx in range(3)]
        return [sum(Rn[xx][y] * p[y] for y in range(3)) + tn[xx] for xx in range(3)]

    def to_local(Rn, tn, g):  # R^T (g - t)
        d = [g[y] - tn[y] for y in range(3)]
        if bug == "row-convention":
            return [sum(Rn[xx][y] * d[y] for y in range(3)) for xx in range(3)]
        return [sum(Rn[y][xx] * d[y] for y in range(3)) for xx in range(3)]

    def point(flat, P, h, p):  # local point (h, p): rows c*H*P + h*P + p
        if bug == "points-interleaved":
            return [flat[(h * P + p) * 3 + c] for c in range(3)]
        return [flat[c * H * P + h * P + p] for c in range(3)]

    softplus = (lambda w: w if w > 20 else math.log1p(math.exp(w)))
    point_scale = math.sqrt(1 / (3 * (Pq * 9 / 2)))
    if bug == "point-scale":
        point_scale = 1.0
    w_h = [softplus(W["head_weights"][h]) * point_scale for h in range(H)]
    bias_scale = 1.0 if bug == "bias-scale" else math.sqrt(1 / 3)

    out = []
    for b in range(B):
        q, k, v, qp, kp, vp = [], [], [], [], [], []
        for n in range(N):
            ql, kvl = linear("linear_q", s[b][n]), linear("linear_kv", s[b][n])
            qpl = linear("linear_q_points.linear", s[b][n])
            kvpl = linear("linear_kv_points.linear", s[b][n])
            q.append([[ql[h * C + c] for c in range(C)] for h in range(H)])
            if bug == "kv-blocked":
                k.append([[kvl[h * C + c] for c in range(C)] for h in range(H)])
                v.append([[kvl[H * C + h * C + c] for c in range(C)] for h in range(H)])
            else:
                k.append([[kvl[h * 2 * C + c] for c in range(C)] for h in range(H)])
                v.append([[kvl[h * 2 * C + C + c] for c in range(C)] for h in range(H)])
            glob = (lambda p, Rn=R[b][n], tn=t[b][n]: to_global(Rn, tn, p))
            qp.append([[glob(point(qpl, Pq, h, p)) for p in range(Pq)] for h in range(H)])
            if bug == "kv-points-split-blocked":  # keys = first H*Pq points of all heads
                flat = [point(kvpl, Pkv, hp // Pkv, hp % Pkv) for hp in range(H * Pkv)]
                kp.append([[glob(flat[h * Pq + p]) for p in range(Pq)] for h in range(H)])
                vp.append([[glob(flat[H * Pq + h * Pv + p]) for p in range(Pv)]
                           for h in range(H)])
            else:
                kp.append([[glob(point(kvpl, Pkv, h, p)) for p in range(Pq)] for h in range(H)])
                vp.append([[glob(point(kvpl, Pkv, h, Pq + p)) for p in range(Pv)]
                           for h in range(H)])
        rows = []
        for i in range(N):
            o = [[0.0] * C for _ in range(H)]
            og = [[[0.0] * 3 for _ in range(Pv)] for _ in range(H)]
            opair = [[0.0] * cz for _ in range(H)]
            for h in range(H):
                logits = []
                for j in range(N):
                    pair = linear("linear_b", z[b][i][j])[h]
                    dist = sum((qp[i][h][p][c] - kp[j][h][p][c]) ** 2
                               for p in range(Pq) for c in range(3))
                    lg = (sum(q[i][h][c] * k[j][h][c] for c in range(C)) * math.sqrt(1 / (3 * C))
                          + bias_scale * pair - 0.5 * w_h[h] * dist)
                    logits.append(lg + cfg.inf * (mask[b][i] * mask[b][j] - 1))
                if bug == "uniform-masked-rows" and mask[b][i] == 0:
                    logits = [0.0] * N
                top = max(logits)
                e = [math.exp(lg - top) for lg in logits]
                a = [ej / sum(e) for ej in e]
                if bug == "zero-masked-rows" and mask[b][i] == 0:
                    a = [0.0] * N
                for j in range(N):
                    for c in range(C):
                        o[h][c] += a[j] * v[j][h][c]
                    for p in range(Pv):
                        for c in range(3):
                            og[h][p][c] += a[j] * vp[j][h][p][c]
                    for c in range(cz):
                        opair[h][c] += a[j] * z[b][i][j][c]
            feat = [0.0] * cfg.out_in_features
            base = H * C
            for h in range(H):
                for c in range(C):
                    feat[h * C + c] = o[h][c]
                for p in range(Pv):
                    local = to_local(R[b][i], t[b][i], og[h][p])
                    sq = sum(c * c for c in local)
                    for c in range(3):  # X block, then Y, then Z; index h*Pv + p
                        feat[base + c * H * Pv + h * Pv + p] = local[c]
                    norm = math.sqrt(sq) + cfg.eps if bug == "eps-outside" else math.sqrt(
                        sq + cfg.eps)
                    feat[base + 3 * H * Pv + h * Pv + p] = norm
                for c in range(cz):
                    index = c * H + h if bug == "o-pair-channel-major" else h * cz + c
                    feat[base + 4 * H * Pv + index] = opair[h][c]
            rows.append(linear("linear_out", feat))
        out.append(rows)
    return torch.tensor(out, dtype=F64)


@pytest.fixture(scope="module")
def loop_case():
    sd, x = init_state_dict(CFG, seed=7), inputs64(seed=7)
    return sd, x, module64(sd)(*x.as_tuple())


def test_independent_loop_implementation_agrees_in_float64(loop_case):
    sd, x, out = loop_case
    ref = loop_ipa(sd, CFG, x)
    present = x.mask != 0
    assert rel(out[present], ref[present]) < 1e-12
    assert rel(out[~present], ref[~present]) < 1e-9  # logits at -1e5: ulp 1.5e-11 there


BUGS = ("row-convention", "points-interleaved", "kv-blocked", "kv-points-split-blocked",
        "point-scale", "bias-scale", "eps-outside", "o-pair-channel-major",
        "uniform-masked-rows", "zero-masked-rows")


@pytest.mark.parametrize("bug", BUGS)
def test_loop_implementation_sees_each_trap(loop_case, bug):
    """The agreement above means something: each trap taken the wrong way disagrees by far
    more than 1e-12 (eps outside the sqrt moves the output by about 1e-9)."""
    sd, x, out = loop_case
    assert rel(loop_ipa(sd, CFG, x, bug=bug), out) > 1e-10


# ---- the input generator -------------------------------------------------------------------

def test_generator_makes_padded_batches_with_different_lengths():
    assert default_lengths(3, 13) == [13, 10, 7]
    assert default_lengths(2, 97) == [97, 49]
    assert default_lengths(1, 50) == [50]
    x = make_inputs(CFG, 3, 13, seed=1)
    assert x.lengths == [13, 10, 7] and len(set(x.lengths)) == 3
    x = make_inputs(CFG, 3, 13, seed=1, lengths=[13, 9, 5])
    assert x.lengths == [13, 9, 5]
    for b, n in enumerate([13, 9, 5]):
        assert x.mask[b, :n].eq(1).all() and x.mask[b, n:].eq(0).all()
    assert x.mask.dtype == x.s.dtype == torch.float32
    assert x.s[0, 12].abs().sum() > 0 and x.s[2, 12].abs().sum() > 0  # tails hold values


def test_generator_frames_are_the_simplified_problems_rounded_to_float32():
    x = make_inputs(CFG, 3, 13, dtype=F64, seed=4)
    ref = simplified.make_inputs(simplified.IPAConfig(8, 4, 2, 1, 1), 3, 13, dtype=F64, seed=4)
    for ours, theirs in ((x.rotations, ref.rotations), (x.translations, ref.translations)):
        assert torch.equal(ours, theirs.float().double())  # float32-representable
    steps = (x.translations[:, 1:] - x.translations[:, :-1]).norm(dim=-1)
    assert torch.allclose(steps, torch.full_like(steps, simplified.CA_STEP_ANGSTROM), atol=1e-5)
    assert x.translations.mean(dim=1).norm(dim=-1).sub(100).abs().max() < 1e-4  # 100 A away
    validate_inputs(CFG, *x.as_tuple())


def test_generator_is_seeded():
    a, b, c = make_inputs(CFG, 2, 7, seed=3), make_inputs(CFG, 2, 7, seed=3), make_inputs(
        CFG, 2, 7, seed=4)
    assert all(torch.equal(u, w) for u, w in zip(a.as_tuple(), b.as_tuple(), strict=True))
    assert not torch.equal(a.z, c.z) and not torch.equal(a.rotations, c.rotations)


@pytest.mark.parametrize("lengths", [[13, 9], [13, 0, 5], [13, 14, 5], [13, 9.0, 5]])
def test_generator_rejects_bad_lengths(lengths):
    with pytest.raises(IPAInputError, match=r"lengths: expected 3 integers in \[1, 13\]"):
        make_inputs(CFG, 3, 13, lengths=lengths)


# ---- input checks --------------------------------------------------------------------------

def _reflect(r):
    r[0, 1] = -r[0, 1]
    return r


def _nan(t):
    t.view(-1)[5] = math.nan
    return t


BAD_INPUTS = [
    ("s", lambda t: t[..., :-1], r"s: expected shape \(3, 13, 11\)"),
    ("z", lambda t: t.transpose(1, 2)[:, :, :12], r"z: expected shape \(3, 13, 13, 7\)"),
    ("translations", lambda t: t.to(F64), r"translations: expected dtype torch.float32"),
    ("rotations", _reflect, r"rotations: expected proper rotations \(det \+1\)"),
    ("rotations", lambda t: t * 1.01, r"rotations: expected orthonormal matrices"),
    ("mask", lambda t: t[:, :12], r"mask: expected shape \(3, 13\)"),
    ("mask", lambda t: t.bool(), r"mask: expected dtype torch.float32 \(as s\), got torch.bool"),
    ("mask", lambda t: t * 0.5, r"mask: expected values in \{0, 1\}, got .* others"),
    ("z", _nan, r"z: expected finite values, got 1 NaN/Inf"),
    ("s", _nan, r"s: expected finite values, got 1 NaN/Inf"),
    ("mask", _nan, r"mask: expected finite values"),
]


@pytest.mark.parametrize("name, spoil, message", BAD_INPUTS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD_INPUTS)])
def test_bad_inputs_raise_naming_the_argument(name, spoil, message):
    x = make_inputs(CFG, 3, 13, seed=0, lengths=list(LENGTHS))
    fields = dict(zip(("s", "z", "translations", "rotations", "mask"), x.as_tuple(), strict=True))
    fields[name] = spoil(fields[name].clone())
    with pytest.raises(IPAInputError, match=message):
        validate_inputs(CFG, **fields)


def test_reference_variant_checks_metadata_and_runs():
    variant = Reference()
    assert variant.problems == ("openfold",) and variant.is_baseline
    assert variant.not_supported_reasons(CFG, "cpu", "fp32") == []
    assert variant.not_supported_reasons(CFG, "cpu", "bf16") == []
    (reason,) = variant.not_supported_reasons(CFG, "cpu", "fp16")
    assert reason.startswith("inf=100000 overflows torch.float16 (max 65504)")
    assert variant.not_supported_reasons(OpenFoldConfig(inf=1e4), "cpu", "fp16") == []
    fn = variant.build(init_state_dict(CFG), CFG, "cpu", "fp32")
    x = make_inputs(CFG, 3, 13, seed=0)
    assert fn(*x.as_tuple()).shape == (3, 13, CFG.c_s)
    with pytest.raises(IPAInputError, match=r"s: expected dtype in \[torch.float32\]"):
        fn(*x.to(dtype=F64).as_tuple())
    with pytest.raises(IPAInputError, match="mask: expected shape"):
        fn(x.s, x.z, x.translations, x.rotations, x.mask[:, :5])


# ---- cost model ----------------------------------------------------------------------------

def test_min_bytes_counts_every_weight_and_is_dominated_by_z():
    config = OpenFoldConfig()
    weights = sum(t.numel() for t in init_state_dict(config).values())
    b, n = 2, 100
    activations = b * n * 384 * 2 + b * n * n * 128 + 12 * b * n + b * n
    assert min_bytes(config, b, n, 4) == 4 * (activations + weights)
    z_bytes = 4 * 4096 * 4096 * 128
    assert z_bytes / min_bytes(config, 1, 4096, 4) > 0.99


def test_flops_carry_the_pair_value_term():
    """d flops / d c_z: pair bias, pair-value aggregation and linear_out's wider input."""
    b, n, c = 2, 50, CFG
    wider = OpenFoldConfig(c.c_s, c.c_z + 1, c.c_hidden, c.no_heads, c.no_qk_points,
                           c.no_v_points)
    H = c.no_heads
    assert flops(wider, b, n) - flops(c, b, n) == (2 * b * n * n * H + 2 * b * H * n * n
                                                  + 2 * b * n * H * c.c_s)


def test_problem_object_gathers_the_interface():
    assert PROBLEM.name == "openfold"
    assert PROBLEM.config_class() == OpenFoldConfig()
    assert PROBLEM.tol_floors["fp32"] == 2e-5 and PROBLEM.tol_floors["bf16"] == 5e-2
    assert PROBLEM.input_names == ("s", "z", "translations", "rotations", "mask")


# ---- the harness judges the problem (check --problem openfold) ------------------------------


class MaskIgnored(Reference):
    """Planted: attends to the padded keys (the mask replaced by ones)."""

    name = "planted-mask-ignored"

    def build(self, *args):
        fn = super().build(*args)
        return lambda s, z, translations, rotations, mask: fn(
            s, z, translations, rotations, torch.ones_like(mask))


class MaskedRowsZeroed(Reference):
    """Planted: right on every present residue, zero on the masked query rows (SPEC step 5
    defines them: computed as if unmasked)."""

    name = "planted-masked-rows-zeroed"

    def build(self, *args):
        fn = super().build(*args)
        return lambda s, z, translations, rotations, mask: (
            fn(s, z, translations, rotations, mask) * mask[..., None])


def test_check_variant_judges_openfold_by_part():
    from harness.correctness import check_variant

    check = lambda variant: check_variant(variant, CFG, batch=3, length=13, seeds=2)  # noqa: E731
    honest = check(Reference())
    assert honest.passed and 0 < honest.rel_l2 < honest.tol and honest.err_ratio == 1.0
    ignored = check(MaskIgnored())
    assert not ignored.passed and ignored.rel_l2 > 100 * ignored.tol
    zeroed = check(MaskedRowsZeroed())
    assert not zeroed.passed
    assert zeroed.rel_l2 < zeroed.tol  # the present rows are right: the row's figure is theirs
    assert any("masked rows: rel_l2" in f for f in zeroed.failures), zeroed.failures


def test_a_variant_of_another_problem_is_refused():
    from harness.correctness import check_variant

    with pytest.raises(IPAInputError, match="implements \\['simplified'\\], not problem "
                                            "'openfold'"):
        check_variant(get_variant("reference"), CFG, batch=1, length=5, seeds=1)


def test_cli_check_and_list_take_the_problem(capsys):
    import json

    from harness.cli import main as cli_main

    size = ["--node-dim", "11", "--pair-dim", "7", "--heads", "3", "--head-dim", "5",
            "--query-points", "2", "--value-points", "3"]
    assert cli_main(["check", "--problem", "openfold", "--variant", "reference", "--device",
                     "cpu", "--length", "9", "--seeds", "2", "--json", *size]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["problem"] == "openfold" and doc["config"]["c_hidden"] == 5
    assert [(r["variant"], r["status"]) for r in doc["results"]] == [("reference", "pass")]
    assert cli_main(["list", "--problem", "openfold", "--device", "cpu", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in listed["variants"]] == list(all_variants("openfold"))
    assert all(v["problems"] == ["openfold"] for v in listed["variants"])
    # contradicting the problem: a usage error before anything runs
    assert cli_main(["check", "--device", "cpu", "--head-dim", "8"]) == 2
    assert "--head-dim: the simplified problem derives it" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(all_variants("openfold")))
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_every_openfold_variant_passes_the_protocol(name, precision):
    """Generated from the registry: awkward sizes, a padded batch with three true lengths."""
    from harness.correctness import check_variant

    variant = get_variant(name, "openfold")
    reasons = variant.not_supported_reasons(CFG, "cpu", precision)
    if reasons:
        pytest.skip("; ".join(reasons))
    result = check_variant(variant, CFG, batch=3, length=13, seeds=2, precision=precision)
    assert result.passed, result.failures


@pytest.mark.parametrize("name", [name for name, variant in all_variants("openfold").items()
                                  if variant.supports_backward])
def test_every_openfold_training_variant_passes_the_gradient_protocol(name):
    """Generated from the registry: a training step of each variant with a backward, every
    gradient against the float64 oracle's, on a padded batch with three true lengths."""
    from harness.correctness import check_variant

    variant = get_variant(name, "openfold")
    reasons = variant.not_supported_reasons(CFG, "cpu", "fp32")
    if reasons:
        pytest.skip("; ".join(reasons))
    result = check_variant(variant, CFG, batch=3, length=13, seeds=1, precision="fp32",
                           pass_name="forward+backward")
    assert result.passed, (result.failures, result.grad_worst, result.grad_rel_l2)
