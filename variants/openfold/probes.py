"""`diagnose` probes and verdict rules of problem `openfold` (SPEC-openfold.md), as data.

A probe changes the inputs, the weights or the sizes so that one part of the layer is off,
dominates, or is isolated; a rule names a suspect part from which probes fail and which pass.
Both are written here as keyword dicts of `harness.probes.Probe` and `harness.probes.Rule`
(this module imports nothing of the harness: data flows harness -> variants), and the harness
reads them from `variants.openfold.PROBLEM.probes` / `.rules`. The frame and term probes are
the simplified problem's with OpenFold's keys; the rest follow the layer's own parts:

- the pair tensor z feeds two terms: the pair bias (`pair-bias-off`: linear_b.weight = 0) and
  the pair-value output o_pair (`pair-values-off`: its linear_out columns zeroed); `pair-off`
  (z = 0) switches both, so a z read shared by the two (a fused kernel's one tile) shows;
- linear_out reads cat[o, X, Y, Z, o_pt_norm, o_pair]: zeroing one group's columns
  (`norms-off`, `pair-values-off`) clears any error made in that group alone;
- `norms-at-origin` makes o_pt = 0, so the output is sqrt(eps) times the norm columns: the
  only probe where eps (1e-8, inside the sqrt) is visible;
- the mask: `no-padding` (mask all ones), `padding-bias-large` (the padded keys' pair bias
  near +7e4: only inf = 1e5 keeps them out), `one-residue` (an element of length 1), and the
  masked query rows judged apart from the present ones (outcome `PROBE:masked`, SPEC step 5:
  they are computed as if unmasked);
- layouts: with one head, k|v interleave per head and head-major outputs are the identity
  (`heads-1`); with one head, every point projection row the same and identity frames,
  every point of a residue is (u, u, u), so no point layout matters ([X | Y | Z] rows, the
  key/value split of the kv points, o_pt's X | Y | Z split: `points-symmetric`);
- the frame convention: a kernel that uses the row convention throughout (p R + t, back as
  (g - t) R^T) is self-consistent, so a single key comes back exact while rotations fail.

Every value change keeps the inputs valid (finite, mask in {0, 1}, proper rotations).

For `diagnose --pass forward+backward` (at the end): `GRADIENT_TERMS` (each input and
parameter's term; z, linear_kv and linear_kv_points feed two terms each and are named for
both), `GRADIENT_SHARED_TERMS` and `GRADIENT_RULES` (keyword dicts of
`harness.probes.GradientRule`): the simplified problem's rules, with the pair bias confirmed by
`pair-bias-off`, the pair values by `pair-values-off`, the key points by `qk-points-at-origin`
and `point-term-off`, k by `scalar-term-off`, the logits by `single-key`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from variants.openfold.problem import OpenFoldInputs

StateDict = dict[str, torch.Tensor]

# softplus(-40) = 4e-18: the point term is ~0 at any distance; softplus(6) ~ 6 makes it drown
# the other logits (the simplified problem's constants).
POINT_TERM_OFF_WEIGHT = -40.0
POINT_TERM_DOMINANT_WEIGHT = 6.0
# linear_b.weight scale: the pair bias' std goes from ~0.6 to ~60.
PAIR_DOMINANT_SCALE = 100.0
# z[..., 0] on every pair with a padded residue, and linear_b.weight[:, 0] = 1: the padded
# keys' pair bias is sqrt(1/3) * 1.2e5 ~ 6.9e4 in every head. With inf = 1e5 their logits
# stay near -3e4 (weight exactly 0); with a mask constant below ~7e4 they win the softmax.
PADDING_PAIR_VALUE = 1.2e5


# ---- shapes read from the weights (a weights transform gets the state_dict only) ------------

@dataclasses.dataclass(frozen=True)
class _Shape:
    heads: int
    c_hidden: int
    qk_points: int
    v_points: int
    c_z: int

    @classmethod
    def of(cls, sd: StateDict) -> _Shape:
        h = sd["head_weights"].shape[0]
        pq = sd["linear_q_points.linear.weight"].shape[0] // (3 * h)
        pv = sd["linear_kv_points.linear.weight"].shape[0] // (3 * h) - pq
        return cls(h, sd["linear_q.weight"].shape[0] // h, pq, pv, sd["linear_b.weight"].shape[1])

    def kv_point_rows(self, keys: bool) -> torch.Tensor:
        """Rows of linear_kv_points.linear of the key points (else the value points): row
        c*H*P + h*P + p with P = Pq + Pv, keys p < Pq (SPEC step 2)."""
        p_all = self.qk_points + self.v_points
        c, h, p = torch.meshgrid(torch.arange(3), torch.arange(self.heads),
                                 torch.arange(p_all), indexing="ij")
        chosen = p < self.qk_points if keys else p >= self.qk_points
        return (c * self.heads * p_all + h * p_all + p)[chosen]

    def out_columns(self, group: str) -> slice:
        """Columns of linear_out that read `group` of cat[o, X, Y, Z, o_pt_norm, o_pair]."""
        h = self.heads
        widths = {"o": h * self.c_hidden, "xyz": 3 * h * self.v_points,
                  "norm": h * self.v_points, "pair": h * self.c_z}
        start = 0
        for name, width in widths.items():
            if name == group:
                return slice(start, start + width)
            start += width
        raise KeyError(group)


def _with(sd: StateDict, **changes) -> StateDict:
    """A copy of `sd` with `key` (`__` for `.`) replaced by `fn(sd[key])`."""
    out = dict(sd)
    for key, fn in changes.items():
        key = key.replace("__", ".")
        out[key] = fn(sd[key])
    return out


def _zero_rows(rows: torch.Tensor):
    def fn(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[rows] = 0
        return t
    return fn


def _zero_out_columns(sd: StateDict, *groups: str) -> StateDict:
    shape = _Shape.of(sd)
    weight = sd["linear_out.weight"].clone()
    for group in groups:
        weight[:, shape.out_columns(group)] = 0
    return _with(sd, linear_out__weight=lambda _: weight)


# ---- weights transforms ----------------------------------------------------------------------

def point_term_off(sd: StateDict) -> StateDict:
    return _with(sd, head_weights=lambda w: torch.full_like(w, POINT_TERM_OFF_WEIGHT))


def point_term_dominant(sd: StateDict) -> StateDict:
    return _with(sd, head_weights=lambda w: torch.full_like(w, POINT_TERM_DOMINANT_WEIGHT))


def qk_points_zero(sd: StateDict) -> StateDict:
    keys = _zero_rows(_Shape.of(sd).kv_point_rows(keys=True))
    return _with(sd, linear_q_points__linear__weight=torch.zeros_like,
                 linear_q_points__linear__bias=torch.zeros_like,
                 linear_kv_points__linear__weight=keys, linear_kv_points__linear__bias=keys)


def v_points_zero(sd: StateDict) -> StateDict:
    values = _zero_rows(_Shape.of(sd).kv_point_rows(keys=False))
    return _with(sd, linear_kv_points__linear__weight=values,
                 linear_kv_points__linear__bias=values)


def norms_only_at_origin(sd: StateDict) -> StateDict:
    """Value points zero, and linear_out reads o_pt_norm alone (no bias): with t = 0 the
    output is linear_out.weight[:, norms] @ sqrt(eps)."""
    sd = _zero_out_columns(v_points_zero(sd), "o", "xyz", "pair")
    return _with(sd, linear_out__bias=torch.zeros_like)


def norms_off(sd: StateDict) -> StateDict:
    return _zero_out_columns(sd, "norm")


def pair_values_off(sd: StateDict) -> StateDict:
    return _zero_out_columns(sd, "pair")


def scalar_term_off(sd: StateDict) -> StateDict:
    return _with(sd, linear_q__weight=torch.zeros_like, linear_q__bias=torch.zeros_like)


def pair_bias_off(sd: StateDict) -> StateDict:
    """linear_b.weight = 0: the bias left is constant over keys, which the softmax ignores."""
    return _with(sd, linear_b__weight=torch.zeros_like)


def pair_dominant(sd: StateDict) -> StateDict:
    return _with(sd, linear_b__weight=lambda w: w * PAIR_DOMINANT_SCALE)


def points_symmetric(sd: StateDict) -> StateDict:
    """Every row of both point projections = linear_q_points' row 0 (weight and bias)."""
    w = sd["linear_q_points.linear.weight"][0]
    b = sd["linear_q_points.linear.bias"][0]
    return _with(sd, linear_q_points__linear__weight=lambda t: w.expand_as(t).clone(),
                 linear_q_points__linear__bias=lambda t: b.expand_as(t).clone(),
                 linear_kv_points__linear__weight=lambda t: w.expand_as(t).clone(),
                 linear_kv_points__linear__bias=lambda t: b.expand_as(t).clone())


def padding_bias_weights(sd: StateDict) -> StateDict:
    def first_column_one(w: torch.Tensor) -> torch.Tensor:
        w = w.clone()
        w[:, 0] = 1.0
        return w
    return _with(sd, linear_b__weight=first_column_one)


# ---- inputs transforms -----------------------------------------------------------------------

def _eye(x: OpenFoldInputs) -> torch.Tensor:
    eye = torch.eye(3, dtype=x.rotations.dtype, device=x.rotations.device)
    return eye.expand_as(x.rotations).contiguous()


def identity_frames(x: OpenFoldInputs) -> OpenFoldInputs:
    return dataclasses.replace(x, translations=torch.zeros_like(x.translations),
                               rotations=_eye(x))


def rotations_only(x: OpenFoldInputs) -> OpenFoldInputs:
    return dataclasses.replace(x, translations=torch.zeros_like(x.translations))


def translations_only(x: OpenFoldInputs) -> OpenFoldInputs:
    return dataclasses.replace(x, rotations=_eye(x))


def pair_zero(x: OpenFoldInputs) -> OpenFoldInputs:
    return dataclasses.replace(x, z=torch.zeros_like(x.z))


def no_padding(x: OpenFoldInputs) -> OpenFoldInputs:
    return dataclasses.replace(x, mask=torch.ones_like(x.mask))


def masked_tail(x: OpenFoldInputs) -> OpenFoldInputs:
    """The last third of every element masked (the generator pads nothing when B = 1)."""
    mask = x.mask.clone()
    mask[:, max(1, (2 * x.length + 2) // 3):] = 0
    return dataclasses.replace(x, mask=mask)


def one_residue(x: OpenFoldInputs) -> OpenFoldInputs:
    """The last element holds one residue, the rest of it padding."""
    mask = x.mask.clone()
    mask[-1, 1:] = 0
    return dataclasses.replace(x, mask=mask)


def padding_pair_large(x: OpenFoldInputs) -> OpenFoldInputs:
    """z[..., 0] = PADDING_PAIR_VALUE on every pair (i, j) with a padded residue."""
    padded = (x.mask[:, :, None] * x.mask[:, None, :]) == 0
    z = x.z.clone()
    z[..., 0] = torch.where(padded, torch.full_like(z[..., 0], PADDING_PAIR_VALUE), z[..., 0])
    return dataclasses.replace(x, z=z)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values with stride 2 in the last dim, NaN in the gaps."""
    buffer = torch.full((*t.shape[:-1], 2 * t.shape[-1]), math.nan, dtype=t.dtype,
                        device=t.device)
    view = buffer[..., ::2]
    view.copy_(t)
    return view


def non_contiguous(x: OpenFoldInputs) -> OpenFoldInputs:
    return OpenFoldInputs(*(_strided(t) for t in x.as_tuple()))


def _one_head(c):
    return dataclasses.replace(c, no_heads=1)


def _one_point(c):
    return dataclasses.replace(c, no_qk_points=1, no_v_points=1)


# ---- the probes (keyword arguments of harness.probes.Probe), in table order --------------------

PROBES: tuple[dict, ...] = (
    dict(name="baseline", isolates="everything random (B > 1, ragged N, padded elements)"),
    dict(name="identity-frames", isolates="R = I, t = 0", inputs=identity_frames),
    dict(name="rotations-only", isolates="random R, t = 0", inputs=rotations_only),
    dict(name="translations-only", isolates="R = I, random t", inputs=translations_only),
    dict(name="point-term-off",
         isolates=f"head_weights = {POINT_TERM_OFF_WEIGHT:g} (softplus ~ 0)",
         weights=point_term_off),
    dict(name="point-term-dominant",
         isolates=f"head_weights = {POINT_TERM_DOMINANT_WEIGHT:g} (softplus ~ 6)",
         weights=point_term_dominant),
    dict(name="qk-points-at-origin",
         isolates="q and k points 0 (linear_q_points, kv key rows) and t = 0: distances 0",
         inputs=rotations_only, weights=qk_points_zero),
    dict(name="v-points-at-origin",
         isolates="value points 0 (kv value rows) and t = 0: the inverse frame gets zeros",
         inputs=rotations_only, weights=v_points_zero),
    dict(name="norms-at-origin",
         isolates="value points 0, t = 0, linear_out reads o_pt_norm only: out = W sqrt(eps)",
         inputs=rotations_only, weights=norms_only_at_origin),
    dict(name="norms-off", isolates="linear_out's o_pt_norm columns 0", weights=norms_off),
    dict(name="scalar-term-off", isolates="linear_q = 0: scalar q.k logits 0",
         weights=scalar_term_off),
    dict(name="pair-off", isolates="z = 0: pair bias and o_pair 0", inputs=pair_zero),
    dict(name="pair-bias-off", isolates="linear_b.weight = 0: pair bias constant",
         weights=pair_bias_off),
    dict(name="pair-values-off", isolates="linear_out's o_pair columns 0",
         weights=pair_values_off),
    dict(name="pair-dominant", isolates=f"linear_b.weight x {PAIR_DOMINANT_SCALE:g}",
         weights=pair_dominant),
    dict(name="no-padding", isolates="mask = 1 everywhere", inputs=no_padding),
    dict(name="padding-bias-large",
         isolates="padded keys' pair bias ~ +7e4 (z[..., 0] = 1.2e5 there, linear_b[:, 0] = 1)",
         inputs=padding_pair_large, weights=padding_bias_weights),
    dict(name="one-residue", isolates="the last element holds one residue",
         inputs=one_residue),
    dict(name="single-key", isolates="N = 1: softmax trivial, value path only",
         length=lambda s: 1),
    dict(name="batch-1", isolates="B = 1 (its last third padded)", batch=lambda s: 1,
         inputs=masked_tail),
    dict(name="aligned-N", isolates="N a multiple of 64 (no ragged tile)",
         length=lambda s: s.aligned_length),
    dict(name="heads-1", isolates="one head", config=_one_head),
    dict(name="points-1", isolates="one query point, one value point", config=_one_point),
    dict(name="points-symmetric",
         isolates="one head, every point projection row the same, R = I, t = 0: a "
                  "residue's points all (u, u, u)",
         config=_one_head, inputs=identity_frames, weights=points_symmetric),
    dict(name="non-contiguous", isolates="inputs strided (NaN in the gaps)",
         layout=non_contiguous),
)

# ---- the rules (keyword arguments of harness.probes.Rule), most specific first ----------------
# `PROBE:present` / `PROBE:masked`: the probe's present residues / masked query rows alone.

RULES: tuple[dict, ...] = (
    dict(name="non-contiguous", fails=("non-contiguous",), passes=("baseline",),
         observation="only with non-contiguous inputs",
         suspect="stride handling: the kernel reads an input as if it were contiguous "
                 "(honour its strides or call .contiguous())"),
    dict(name="batch", fails=("baseline",), passes=("batch-1",),
         observation="only with B > 1",
         suspect="batch indexing: a missing or wrong batch stride (s, z, the frames, the "
                 "mask or the output)"),
    dict(name="tail", fails=("baseline",), passes=("aligned-N",),
         observation="only with ragged N (a multiple of 64 is clean)",
         suspect="tail handling: the last partial block of keys or queries (loop bound, "
                 "bounds check or mask)"),
    dict(name="masked-rows", fails=("baseline:masked",), passes=("baseline:present",),
         observation="the present residues are right, the masked query rows wrong",
         suspect="the masked query rows: SPEC step 5 adds inf * (m_i m_j - 1), which shifts a "
                 "masked row equally at every key, so it comes out as if unmasked; a key-only "
                 "mask inf * (m_j - 1), -inf (NaN rows), zeroed or uniform rows, or an inf "
                 "too large for the logits' precision each give another answer"),
    dict(name="mask", fails=("baseline",), passes=("no-padding",),
         observation="error vanishes without padding",
         suspect="the mask on keys: a padded key must get weight 0 (logit + inf (m_i m_j - "
                 "1), SPEC step 5): the mask missed, applied after the softmax, or read at "
                 "another residue or element"),
    dict(name="mask-inf", fails=("padding-bias-large",), passes=("baseline",),
         observation="only when the padded keys' logits are large",
         suspect="the mask constant: inf = 1e5 (SPEC step 5); a smaller one (1e4 is "
                 "OpenFold's low-precision config) or a clamp lets a large padded logit win"),
    dict(name="one-residue", fails=("one-residue",), passes=("baseline",),
         observation="only with an element of one residue",
         suspect="per-element lengths: a loop, tile skip or softmax that assumes more than "
                 "one present key"),
    dict(name="frame-convention", fails=("baseline", "rotations-only", "point-term-off"),
         passes=("identity-frames", "translations-only", "single-key"),
         observation="error needs rotations, yet a single key comes back exact (the frame "
                     "and its inverse agree with each other)",
         suspect="the row convention: p R + t and (g - t) R^T where SPEC has the column "
                 "convention R p + t and R^T (g - t) (OpenFold's Rigid); rotations are "
                 "transposed throughout"),
    dict(name="inverse-frame", fails=("baseline", "rotations-only"),
         passes=("identity-frames", "translations-only", "v-points-at-origin"),
         observation="error needs rotations and vanishes when the inverse frame gets only "
                     "zeros",
         suspect="the inverse frame o_pt = R_i^T (o_pt_g - t_i) (SPEC step 8): R where R^T "
                 "belongs, or another residue's frame"),
    dict(name="point-norms", fails=("baseline",), passes=("norms-off",),
         observation="error vanishes with linear_out's o_pt_norm columns off",
         suspect="the point norms o_pt_norm = sqrt(sum_xyz o_pt^2 + eps) (SPEC step 9): "
                 "taken in the global frame, over the wrong axis, or not head-major (h*Pv + p)"),
    dict(name="o-pt-layout",
         fails=("baseline", "identity-frames", "single-key", "norms-off", "heads-1"),
         passes=("v-points-at-origin", "points-symmetric"),
         observation="error needs value points, stays with identity frames and a single "
                     "key, and vanishes when every point is (u, u, u)",
         suspect="o_pt's X | Y | Z split (SPEC step 10): o_pt (B, N, H, Pv, 3) viewed as "
                 "(B, N, H*Pv, 3), then X, Y and Z each H*Pv wide, not interleaved "
                 "(x, y, z per point), or its linear_out columns"),
    dict(name="point-norm-eps", fails=("norms-at-origin",), passes=("baseline",),
         observation="only when o_pt = 0, where the norm is sqrt(eps)",
         suspect="eps in the point norms: sqrt(sum_xyz o_pt^2 + eps), eps = 1e-8 inside the "
                 "sqrt (SPEC step 9), not missing, not outside"),
    dict(name="pair", fails=("baseline", "pair-bias-off", "pair-values-off"),
         passes=("pair-off",),
         observation="error vanishes with z = 0 but with neither pair term off alone",
         suspect="z's read, shared by the pair bias and o_pair (strides, z_ij read at "
                 "(j, i), the tile of z a fused kernel reuses)"),
    dict(name="pair-values", fails=("baseline",), passes=("pair-values-off",),
         observation="error vanishes with linear_out's o_pair columns off",
         suspect="the pair-value output o_pair[i, h] = sum_j a_hij z_ij (SPEC step 11): "
                 "missing, z read at (j, i), not head-major (h*c_z + c), or the attention "
                 "it uses (the online-softmax rescale of its accumulator)"),
    dict(name="pair-bias", fails=("baseline",), passes=("pair-bias-off",),
         observation="error vanishes with linear_b.weight = 0",
         suspect="the pair bias sqrt(1/3) * linear_b(z_ij)[h] (SPEC step 4): z read at (j, i), "
                 "the sqrt(1/3) factor, or the (B, N, N, H) layout of b"),
    dict(name="heads", fails=("baseline",), passes=("heads-1",),
         observation="only with several heads",
         suspect="head indexing: k and v interleave per head in linear_kv (view (H, 2C), "
                 "SPEC step 1), the head_weights index, the kv points' split within each "
                 "head, or the head-major o and o_pair"),
    dict(name="points", fails=("baseline",), passes=("points-1",),
         observation="only with several query/value points",
         suspect="point indexing: the (head, point) index of the points, the key/value "
                 "split at Pq within each head, or Pq in the weight sqrt(1/(3 Pq 9/2))"),
    dict(name="point-layout",
         fails=("baseline", "identity-frames", "v-points-at-origin", "heads-1"),
         passes=("points-symmetric",),
         observation="error stays with identity frames and vanishes when every point is "
                     "(u, u, u)",
         suspect="the [X | Y | Z] layout of the point projections: row c*H*P + h*P + p "
                 "(SPEC step 2), not interleaved (h, p, xyz); or the kv points' split within "
                 "each head (the first Pq keys, the next Pv values)"),
    dict(name="point-weight", fails=("baseline", "point-term-off", "identity-frames"),
         passes=("qk-points-at-origin",),
         observation="very negative head_weights do not switch the point term off, zero "
                     "query/key points do",
         suspect="the point weight: softplus(head_weights) missing or wrong"),
    dict(name="scalar-term", fails=("baseline",), passes=("scalar-term-off",),
         observation="error vanishes with the scalar q.k term off",
         suspect="scalar logits: the factor sqrt(1/(3C)), or the q / k layout (k is the "
                 "first C of each head's 2C in linear_kv)"),
    dict(name="point-term", fails=("baseline",), passes=("point-term-off",),
         observation="error vanishes with the point term off",
         suspect="point logits: the query/key points, their frame, the squared distance, "
                 "or its factor 0.5 * softplus(head_weights) * sqrt(1/(3 Pq 9/2))"),
    dict(name="frame-rotation", fails=("baseline", "rotations-only"),
         passes=("identity-frames", "translations-only"),
         observation="error vanishes with identity frames and with translations only, stays "
                     "with rotations only",
         suspect="rotation in the frame transform R p + t or the inverse frame R^T (g - t) "
                 "(R where R^T belongs)"),
    dict(name="frame-translation", fails=("baseline", "translations-only"),
         passes=("identity-frames", "rotations-only"),
         observation="error vanishes with identity frames and with rotations only, stays "
                     "with translations only",
         suspect="translation in the frame transform or the inverse frame (+ t, - t_i, "
                 "another residue's t, or norms of the global o_pt)"),
    dict(name="frames", fails=("baseline",), passes=("identity-frames",),
         observation="error vanishes with identity frames",
         suspect="frame transform or inverse frame"),
    dict(name="value-path", fails=("single-key", "aligned-N"), passes=(),
         observation="fails even with a single key, where softmax is trivial",
         suspect="value path: v (the second C of each head's 2C in linear_kv), the value "
                 "points, the inverse frame, o_pair, the concat order [o, X, Y, Z, o_pt_norm, "
                 "o_pair] or linear_out"),
    dict(name="logits", fails=("baseline",), passes=("single-key",),
         observation="clean with a single key (value path and linear_out are right)",
         suspect="attention logits, the mask or softmax"),
    dict(name="point-dominant", fails=("point-term-dominant",), passes=("baseline",),
         observation="only when the point term dominates",
         suspect="precision of the squared distance (|q|^2 + |k|^2 - 2 q.k cancels at "
                 "Angstrom-scale coordinates) or a saturated softmax"),
    dict(name="pair-dominant", fails=("pair-dominant",), passes=("baseline",),
         observation="only when the pair bias dominates",
         suspect="precision or scale of the pair bias (accumulated in low precision, or "
                 "scaled)"),
    dict(name="single-key-only", fails=("single-key",), passes=("baseline",),
         observation="only with N = 1",
         suspect="the N = 1 edge case (an empty tile, a loop that assumes N > 1)"),
)

# What every probe uses, for the verdict when no probe is clean.
EVERYWHERE = "the projections (linear_q, linear_kv, the point projections) or linear_out"


# ---- the backward (diagnose --pass forward+backward) ------------------------------------------
# Which term of the layer each gradient belongs to (the keyword data of
# harness.probes.ProbeSet.gradient_terms): an input by name, a parameter by its whole
# state_dict key, else by the module before the first '.'. A wrong backward in one term shows
# in its own tensors' gradients and, through the chain rule, in those upstream of it: s feeds
# every projection (the shared term, named only when nothing else is wrong); z feeds both the
# pair bias and o_pair; the frames feed the query, key and value points and the inverse frame.
# Two projections feed two terms each and go by both names: linear_kv (k and v interleave per
# head) and linear_kv_points (the first Pq points of each head keys, the next Pv values).

SHARED_TERM = "shared (input s)"
PAIR_Z = "pair z (bias and o_pair)"
KV = "k and v (scalar dot, value aggregation)"
KV_POINTS = "key and value points (point distance, value aggregation)"
# linear_b.bias: its gradient is zero in exact arithmetic (the softmax cancels a logit shift
# the same for every key, which a per-head bias is), so it is judged on rounding alone
# (harness.correctness: against twice the reference's absolute error). Its own term, and a
# shared one: a rule's `right=None` never asks it to be right, since any change to the
# gradient reaching the logits changes its rounding; a rule of its own reads it wrong alone.
ROW_SUMS = "logit row sums (linear_b.bias, zero in exact arithmetic)"

GRADIENT_TERMS: dict[str, str] = {
    "s": SHARED_TERM,
    "z": PAIR_Z,
    "translations": "frame",
    "rotations": "frame",
    "linear_q": "scalar dot",
    "linear_kv": KV,
    "linear_q_points": "point distance",
    "head_weights": "point distance",
    "linear_kv_points": KV_POINTS,
    "linear_b.bias": ROW_SUMS,
    "linear_b": "pair bias",
    "linear_out": "value aggregation",
}
GRADIENT_SHARED_TERMS = (SHARED_TERM, ROW_SUMS)
LOGIT_TERMS = ("scalar dot", "point distance", "pair bias")

# The rules (keyword arguments of harness.probes.GradientRule), most specific first: the
# probe-confirmed readings, then one term alone, then combinations. `right=None`: every other
# term but the shared ones must be right ('only `wrong` is wrong').

GRADIENT_RULES: tuple[dict, ...] = (
    dict(name="pair-bias-weight-grad", term="pair bias", wrong=("pair bias",), right=None,
         fails=("baseline",), passes=("pair-off",),
         observation="only linear_b.weight's gradient is wrong, and right with z = 0 (where "
                     "d linear_b.weight = 0)",
         suspect="the pair bias backward: d linear_b.weight = sqrt(1/3) sum_ij d b_ij (x) "
                 "z_ij (the (i, j) index or the (B, N, N, H) layout of b)"),
    dict(name="pair-bias-z-grad", term="pair bias", wrong=(PAIR_Z,), right=None,
         fails=("baseline",), passes=("pair-bias-off",),
         observation="only z's gradient is wrong, and right with linear_b.weight = 0 (no "
                     "gradient reaches z through the bias)",
         suspect="the pair bias backward into z: d z_ij = sqrt(1/3) sum_h d b_ijh "
                 "linear_b.weight[h] (the (i, j) index, the sqrt(1/3), a missing write)"),
    dict(name="pair-values-grad", term="pair values", wrong=(PAIR_Z,), right=None,
         fails=("baseline",), passes=("pair-values-off",),
         observation="only z's gradient is wrong, and right with linear_out's o_pair "
                     "columns off (no gradient reaches z through o_pair)",
         suspect="the pair-value backward into z: d z_ij = sum_h a_hij d o_pair_ih (SPEC "
                 "step 11: the (i, j) index, head-major h*c_z + c, a missing write)"),
    dict(name="pair-bias-grad", term="pair bias", wrong=("pair bias", PAIR_Z), right=None,
         fails=(), passes=(),
         observation="only the pair bias' gradients (linear_b.weight and z) are wrong",
         suspect="the pair bias backward: d b_ij (its (B, N, N, H) layout, the sqrt(1/3)), "
                 "then d linear_b.weight = sum_ij d b_ij (x) z_ij and d z_ij = d b_ij W"),
    dict(name="pair-bias-only-grad", term="pair bias", wrong=("pair bias",), right=None,
         fails=(), passes=(),
         observation="only linear_b.weight's gradient is wrong",
         suspect="the pair bias backward: d linear_b.weight = sqrt(1/3) sum_ij d b_ij (x) "
                 "z_ij"),
    dict(name="pair-z-grad", term=PAIR_Z, wrong=(PAIR_Z,), right=None, fails=(), passes=(),
         observation="only z's gradient is wrong",
         suspect="z's backward, shared by the pair bias and o_pair: d z_ij = sqrt(1/3) d b_ij "
                 "W + sum_h a_hij d o_pair_ih (a z tile a fused kernel reuses, the (i, j) "
                 "index)"),
    dict(name="point-weight-grad", term="point distance", wrong=("point distance",),
         right=None, fails=("baseline", "point-term-off"), passes=("qk-points-at-origin",),
         observation="only point-distance gradients are wrong, and they are right when the "
                     "distances are 0",
         suspect="the point weight backward: d head_weights (softplus' = sigmoid, the factor "
                 "0.5 sqrt(1/(3 Pq 9/2)))"),
    dict(name="point-distance-grad", term="point distance", wrong=("point distance",),
         right=None, fails=(), passes=(),
         observation="only point-distance gradients (head_weights, linear_q_points) are wrong",
         suspect="the point term backward: d head_weights, or d q_pts = w sum_j (q_i - k_j) "
                 "d logit_ij into linear_q_points"),
    dict(name="key-points-grad", term="point distance", wrong=(KV_POINTS, "frame"),
         right=None, fails=("baseline",), passes=("qk-points-at-origin", "point-term-off"),
         observation="the kv points' and the frames' gradients are wrong, and right with the "
                     "point term off or the distances 0",
         suspect="the key points' backward: d k_pts = w sum_i (k_j - q_i) d logit_ij, through "
                 "the frame R p + t into linear_kv_points' key rows (the first Pq of each "
                 "head)"),
    dict(name="value-points-grad", term="value aggregation", wrong=(KV_POINTS, "frame"),
         right=None, fails=("baseline", "point-term-off", "qk-points-at-origin"), passes=(),
         observation="the kv points' and the frames' gradients are wrong, also with the "
                     "point term off and the distances 0 (so not the key points)",
         suspect="the value points' backward: d v_pts_j = sum_i a_hij d o_pt_g_i, d o_pt_g = "
                 "R_i d o_pt (the inverse frame), into linear_kv_points' value rows (the "
                 "last Pv of each head)"),
    dict(name="query-points-grad", term="point distance", wrong=("point distance", "frame"),
         right=None, fails=(), passes=(),
         observation="the query points' (linear_q_points) and the frames' gradients are "
                     "wrong, the kv points' right",
         suspect="the query points' backward: d q_pts = w sum_j (q_i - k_j) d logit_ij, "
                 "through the frame R p + t into linear_q_points"),
    dict(name="kv-points-grad", term=KV_POINTS, wrong=(KV_POINTS,), right=None, fails=(),
         passes=(),
         observation="only linear_kv_points' gradients are wrong",
         suspect="linear_kv_points' backward: the [X | Y | Z] rows c*H*P + h*P + p, the key / "
                 "value split at Pq within each head"),
    dict(name="k-grad", term="scalar dot", wrong=(KV,), right=None, fails=("baseline",),
         passes=("scalar-term-off",),
         observation="only linear_kv's gradients are wrong, and right with q = 0 (where "
                     "dk = 0)",
         suspect="the scalar q.k backward into k: dk_j = sqrt(1/(3C)) sum_i dS_ij q_i, the "
                 "first C of each head's 2C in linear_kv"),
    dict(name="v-grad", term="value aggregation", wrong=(KV,), right=None,
         fails=("baseline", "single-key"), passes=(),
         observation="only linear_kv's gradients are wrong, also with a single key (where the "
                     "softmax is constant)",
         suspect="the value backward: dv_j = sum_i a_hij do_i, the second C of each head's "
                 "2C in linear_kv"),
    dict(name="scalar-dot-grad", term="scalar dot", wrong=("scalar dot",), right=None,
         fails=(), passes=(),
         observation="only linear_q's gradients are wrong",
         suspect="the scalar q.k backward into q: dq_i = sqrt(1/(3C)) sum_j dS_ij k_j"),
    dict(name="qk-grad", term="scalar dot", wrong=("scalar dot", KV), right=None, fails=(),
         passes=(),
         observation="only linear_q's and linear_kv's gradients are wrong",
         suspect="the scalar q.k backward: dq = dS k, dk = dS^T q, the factor sqrt(1/(3C))"),
    dict(name="kv-grad", term=KV, wrong=(KV,), right=None, fails=(), passes=(),
         observation="only linear_kv's gradients are wrong",
         suspect="linear_kv's backward: dk and dv interleaved per head (view (H, 2C))"),
    dict(name="frame-grad", term="frame", wrong=("frame",), right=None, fails=(), passes=(),
         observation="only the frames' gradients are wrong",
         suspect="the frame backward: d translations / d rotations of the frame transform "
                 "R p + t or of the inverse frame R_i^T (o_pt_g - t_i)"),
    dict(name="value-aggregation-grad", term="value aggregation",
         wrong=("value aggregation",), right=LOGIT_TERMS, fails=(), passes=(),
         observation="value-path gradients are wrong, the logit terms' right",
         suspect="the value path backward: linear_out, d cat[o, X, Y, Z, o_pt_norm, o_pair], "
                 "the norms (o_pt / o_pt_norm), dv = P^T do"),
    dict(name="softmax-grad", term="attention weights (softmax)", wrong=LOGIT_TERMS,
         right=("value aggregation",), fails=(), passes=(),
         observation="every logit term's gradients are wrong, the value path's right",
         suspect="the softmax backward: d logits = a * (da - sum_j a da), or da = do . v^T "
                 "+ d o_pt_g . v_pts + d o_pair . z"),
    dict(name="row-sums-grad", term="attention weights (softmax)", wrong=(ROW_SUMS,),
         right=None, fails=(), passes=(),
         observation="only linear_b.bias' gradient is wrong (zero in exact arithmetic: "
                     "d logits sum to zero over the keys of every row)",
         suspect="the softmax backward: its row sum sum_j a da (missing, or in too low a "
                 "precision), so d logits no longer sum to zero over the keys"),
    dict(name="shared-grad", term=SHARED_TERM, wrong=(SHARED_TERM,), right=None, fails=(),
         passes=(),
         observation="only s's gradient is wrong",
         suspect="the sum of the projections' input gradients d s = sum of linear_q, "
                 "linear_kv, the point projections' W^T dy"),
    dict(name="logits-grad", term="attention logits", wrong=(),
         right=("value aggregation", "frame"), fails=("baseline",), passes=("single-key",),
         observation="gradient errors vanish with a single key (softmax constant, d logits = "
                     "0) and the value path's and the frames' gradients are right",
         suspect="the backward of the attention logits, before the softmax"),
)
