"""Variants with one deliberate mistake each, for proving that the checks catch bugs.

Each is a reference module with one method overridden; `planted_variant(module_cls, name)`
wraps such a module class as a registry `Variant`. `IPAReference.forward` is one method, so
the bugs inside it override a hook of `HookedReference`: the reference's forward split into
the steps a kernel author writes separately (scalar logits, point weight, pair bias,
softmax). `HookedReference` itself is exact (a test holds it bit for bit to the reference).

The bugs are issue 7's list plus the forward-frame and the translation twins of the first,
each a mistake a hand-written kernel makes (the `openfold` problem's are at the end):

| variant | mistake | what `diagnose` should name |
|---|---|---|
| `planted-inverse-frame` | inverse frame multiplies by R, not R^T | inverse frame |
| `planted-frame-transposed` | frame transform multiplies by R^T, not R | frame rotation |
| `planted-softplus` | point weight is head_weights, not softplus(head_weights) | point weight |
| `planted-pair-transposed` | pair bias read at (j, i) instead of (i, j) | pair bias |
| `planted-batch-frames` | frames read without the batch stride (every b uses b = 0) | batch |
| `planted-no-sqrt-d` | scalar scores not divided by sqrt(d) | scalar term |
| `planted-ragged-tail` | keys past the last full block of 16 are dropped | tail |
| `planted-inverse-frame-no-t` | inverse frame forgets t: g @ R^T | frame translation |
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from variants.base import Variant
from variants.openfold.reference import OpenFoldIPA
from variants.problem import get_precision
from variants.reference import IPAReference

RAGGED_BLOCK = 16  # key block of `DropsRaggedKeyBlock`: small, so small N shows it


class InverseFrameWithR(IPAReference):
    """Bug: the inverse frame multiplies by R instead of R^T."""

    def _apply_inv_frame(self, pts, rotations, translations):
        centered = pts - translations.unsqueeze(2)
        return torch.einsum("bnpc,bncd->bnpd", centered, rotations)


class InverseFrameWithoutT(IPAReference):
    """Bug: the inverse frame forgets the translation: g @ R^T instead of (g - t_i) @ R^T."""

    def _apply_inv_frame(self, pts, rotations, translations):
        return super()._apply_inv_frame(pts, rotations, torch.zeros_like(translations))


class FrameWithRT(IPAReference):
    """Bug: the frame transform multiplies by R^T instead of R (column-vector habit)."""

    def _apply_frame(self, pts, rotations, translations):
        return torch.einsum("bnpc,bndc->bnpd", pts, rotations) + translations.unsqueeze(2)


class HookedReference(IPAReference):
    """The reference's forward, split into overridable steps (no bug)."""

    def _scalar_logits(self, q, k):
        """q, k: (B, N, H, d) -> (B, H, N, N)."""
        return torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(self.head_dim)

    def _point_weight(self):
        """(H,) weight of each head's squared point distance (halved in forward)."""
        return F.softplus(self.head_weights)

    def _pair_bias(self, pair_repr):
        """pair_repr (B, N, N, pair_dim) -> bias (B, H, N, N), bias[b, h, i, j] from z[b, i, j]."""
        return self.pair_bias(pair_repr).permute(0, 3, 1, 2)

    def _softmax(self, logits):
        """Softmax over keys (last dim) of (B, H, N, N) logits."""
        return F.softmax(logits, dim=-1)

    def forward(self, node_repr, pair_repr, translations, rotations):
        B, N, _ = node_repr.shape
        h, d = self.num_heads, self.head_dim
        Qp, Vp = self.num_query_points, self.num_value_points

        x = self.layer_norm(node_repr)
        q = self.q_proj(x).view(B, N, h, d)
        k = self.k_proj(x).view(B, N, h, d)
        v = self.v_proj(x).view(B, N, h, d)
        q_pts = self._apply_frame(self.q_pts(x).view(B, N, h * Qp, 3), rotations, translations)
        k_pts = self._apply_frame(self.k_pts(x).view(B, N, h * Qp, 3), rotations, translations)
        v_pts = self._apply_frame(self.v_pts(x).view(B, N, h * Vp, 3), rotations, translations)
        q_pts = q_pts.view(B, N, h, Qp, 3)
        k_pts = k_pts.view(B, N, h, Qp, 3)
        v_pts = v_pts.view(B, N, h, Vp, 3)

        pt_dist = ((q_pts.unsqueeze(2) - k_pts.unsqueeze(1)) ** 2).sum(dim=(-1, -2))
        pt_attn = -(self._point_weight().view(1, 1, 1, h) * pt_dist) / 2.0
        attn = self._scalar_logits(q, k) + pt_attn.permute(0, 3, 1, 2) + self._pair_bias(pair_repr)
        attn = self._softmax(attn)

        out_scalar = torch.einsum("bhij,bjhd->bihd", attn, v).reshape(B, N, h * d)
        out_pts = torch.einsum("bhij,bjhpc->bihpc", attn, v_pts).reshape(B, N, h * Vp, 3)
        out_pts = self._apply_inv_frame(out_pts, rotations, translations).reshape(B, N, -1)
        return self.out_proj(torch.cat([out_scalar, out_pts], dim=-1))


class SoftplusMissing(HookedReference):
    """Bug: the point weight is head_weights itself, softplus missing."""

    def _point_weight(self):
        return self.head_weights


class PairBiasTransposed(HookedReference):
    """Bug: the pair bias of (i, j) is read from pair_repr[b, j, i]."""

    def _pair_bias(self, pair_repr):
        return self.pair_bias(pair_repr).permute(0, 3, 2, 1)


class FramesWithoutBatchStride(HookedReference):
    """Bug: frames are read without the batch stride, so every batch uses batch 0's."""

    def forward(self, node_repr, pair_repr, translations, rotations):
        return super().forward(
            node_repr, pair_repr,
            translations[:1].expand_as(translations), rotations[:1].expand_as(rotations),
        )


class ScoresNotScaled(HookedReference):
    """Bug: the scalar scores q.k are not divided by sqrt(d)."""

    def _scalar_logits(self, q, k):
        return torch.einsum("bihd,bjhd->bhij", q, k)


class DropsRaggedKeyBlock(HookedReference):
    """Bug: keys past the last full block of 16 are dropped (the ragged tail tile is skipped)."""

    def _softmax(self, logits):
        n = logits.shape[-1]
        covered = (n // RAGGED_BLOCK) * RAGGED_BLOCK  # 0 when N < 16: every key is dropped
        keep = torch.arange(n, device=logits.device) < covered
        return F.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)


def planted_variant(module_cls: type[IPAReference], name: str,
                    problem: str = "simplified", backward: bool = False) -> type[Variant]:
    """A Variant class of `problem` that builds `module_cls` with the given weights (openfold:
    with the config's inf and eps); with `backward`, trainable (autograd through the module,
    its parameters by name as `fn.module`'s)."""

    class Planted(Variant):
        description = f"planted bug: {module_cls.__doc__.strip()}"
        problems = (problem,)
        supports_backward = backward

        def build(self, state_dict, config, device, precision):
            constants = dict(inf=config.inf, eps=config.eps) if problem == "openfold" else {}
            module = module_cls(*config.module_args(), **constants)
            module.load_state_dict(state_dict)
            module = module.to(device, get_precision(precision).dtype).eval()
            if not backward:
                return module

            def forward(*inputs):
                return module(*inputs)

            forward.module = module
            return forward

    Planted.name = name
    suffix = "_Trainable" if backward else ""
    Planted.__qualname__ = Planted.__name__ = f"Planted_{module_cls.__name__}{suffix}"
    globals()[Planted.__name__] = Planted  # found by name when pickled for a worker process
    return Planted


InverseFrameBug = planted_variant(InverseFrameWithR, "planted-inverse-frame")
FrameTransposedBug = planted_variant(FrameWithRT, "planted-frame-transposed")
SoftplusBug = planted_variant(SoftplusMissing, "planted-softplus")
PairTransposedBug = planted_variant(PairBiasTransposed, "planted-pair-transposed")
BatchFramesBug = planted_variant(FramesWithoutBatchStride, "planted-batch-frames")
NoSqrtDBug = planted_variant(ScoresNotScaled, "planted-no-sqrt-d")
RaggedTailBug = planted_variant(DropsRaggedKeyBlock, "planted-ragged-tail")
InverseFrameNoTBug = planted_variant(InverseFrameWithoutT, "planted-inverse-frame-no-t")
HookedExact = planted_variant(HookedReference, "planted-none")

# Every planted bug, with the suspect `diagnose` must name first (a rule name in
# harness.probes.RULES).
PLANTED_BUGS: dict[type[Variant], str] = {
    InverseFrameBug: "inverse-frame",
    FrameTransposedBug: "frame-rotation",
    SoftplusBug: "point-weight",
    PairTransposedBug: "pair-bias",
    BatchFramesBug: "batch",
    NoSqrtDBug: "scalar-term",
    RaggedTailBug: "tail",
    InverseFrameNoTBug: "frame-translation",
}


# ---- problem `openfold` (SPEC-openfold.md) -------------------------------------------------------
# The openfold reference's forward split into the steps a kernel author writes separately,
# each overridable; `HookedOpenFold` itself is exact (a test holds it bit for bit to the
# reference). Each bug overrides one hook (its docstring says the mistake);
# `PLANTED_OPENFOLD_BUGS` at the end pairs each with the rule `diagnose --problem openfold`
# must name first (variants/openfold/probes.py).

class HookedOpenFold(OpenFoldIPA):
    """The openfold reference's forward, split into overridable steps (no bug)."""

    def _local_points(self, y, H, P):
        """linear output (B, N, 3*H*P), blocks [X | Y | Z] -> local points (B, N, H, P, 3)."""
        B, N = y.shape[:2]
        return torch.stack(torch.split(y, H * P, dim=-1), dim=-1).view(B, N, H, P, 3)

    def _to_global(self, local, rotations, translations):
        """Column convention R p + t on (B, N, H, P, 3) points."""
        return (torch.einsum("bnxy,bnhpy->bnhpx", rotations, local)
                + translations[:, :, None, None, :])

    def _to_local(self, g, rotations, translations):
        """R^T (g - t) on (B, N, H, P, 3) points."""
        return torch.einsum("bnyx,bnhpy->bnhpx", rotations, g - translations[:, :, None, None, :])

    def _kv(self, s, H, C):
        kv = self.linear_kv(s).view(*s.shape[:2], H, 2 * C)
        return kv[..., :C], kv[..., C:]

    def _point_weight(self):
        Pq = self.config.no_qk_points
        return F.softplus(self.head_weights) * math.sqrt(1.0 / (3 * (Pq * 9.0 / 2)))

    def _pair_bias(self, z):
        """(B, N, N, c_z) -> (B, H, N, N), b[h, i, j] from z_ij, times sqrt(1/3)."""
        return math.sqrt(1.0 / 3) * self.linear_b(z).permute(0, 3, 1, 2)

    def _mask_logits(self, logit, mask):
        return logit + self.config.inf * (mask[:, :, None] * mask[:, None, :] - 1)[:, None]

    def _split_kv_points(self, kv_pts, Pq):
        """(B, N, H, Pq+Pv, 3) -> key points (the first Pq), value points (the next Pv)."""
        return kv_pts[..., :Pq, :], kv_pts[..., Pq:, :]

    def _softmax(self, logit):
        return torch.softmax(logit, dim=-1)

    def _o_pair(self, a, z):
        B, N = z.shape[:2]
        return torch.einsum("bhij,bijc->bihc", a, z).reshape(B, N, -1)

    def _norms(self, o_pt):
        B, N = o_pt.shape[:2]
        return torch.sqrt((o_pt ** 2).sum(dim=-1) + self.config.eps).reshape(B, N, -1)

    def _xyz(self, o_pt):
        B, N, H, Pv, _ = o_pt.shape
        return o_pt.reshape(B, N, H * Pv, 3).unbind(dim=-1)

    def forward(self, s, z, translations, rotations, mask):
        cfg = self.config
        B, N, _ = s.shape
        H, C, Pq, Pv = cfg.no_heads, cfg.c_hidden, cfg.no_qk_points, cfg.no_v_points
        q = self.linear_q(s).view(B, N, H, C)
        k, v = self._kv(s, H, C)
        q_pts = self._to_global(self._local_points(self.linear_q_points.linear(s), H, Pq),
                                rotations, translations)
        kv_pts = self._to_global(
            self._local_points(self.linear_kv_points.linear(s), H, Pq + Pv), rotations,
            translations)
        k_pts, v_pts = self._split_kv_points(kv_pts, Pq)
        logit = torch.einsum("bihc,bjhc->bhij", q, k) * math.sqrt(1.0 / (3 * C))
        logit = logit + self._pair_bias(z)
        dist2 = ((q_pts[:, :, None] - k_pts[:, None, :]) ** 2).sum(dim=-1).sum(dim=-1)
        logit = logit - 0.5 * (self._point_weight() * dist2).permute(0, 3, 1, 2)
        a = self._softmax(self._mask_logits(logit, mask))
        o = torch.einsum("bhij,bjhc->bihc", a, v).reshape(B, N, H * C)
        o_pt = self._to_local(torch.einsum("bhij,bjhpx->bihpx", a, v_pts), rotations,
                              translations)
        o_x, o_y, o_z = self._xyz(o_pt)
        return self.linear_out(torch.cat([o, o_x, o_y, o_z, self._norms(o_pt),
                                          self._o_pair(a, z)], dim=-1))


class OFRowConvention(HookedOpenFold):
    """Bug: the row convention throughout: p R + t, and back (g - t) R^T."""

    def _to_global(self, local, rotations, translations):
        return (torch.einsum("bnhpy,bnyx->bnhpx", local, rotations)
                + translations[:, :, None, None, :])

    def _to_local(self, g, rotations, translations):
        return torch.einsum("bnhpy,bnxy->bnhpx", g - translations[:, :, None, None, :],
                            rotations)


class OFInverseFrameWithR(HookedOpenFold):
    """Bug: the inverse frame multiplies by R, not R^T: R (g - t)."""

    def _to_local(self, g, rotations, translations):
        return torch.einsum("bnxy,bnhpy->bnhpx", rotations, g - translations[:, :, None, None, :])


class OFInverseFrameWithoutT(HookedOpenFold):
    """Bug: the inverse frame forgets the translation: R^T g instead of R^T (g - t)."""

    def _to_local(self, g, rotations, translations):
        return super()._to_local(g, rotations, torch.zeros_like(translations))


class OFNoPairValues(HookedOpenFold):
    """Bug: the pair-value output o_pair is missing (zeros in its place)."""

    def _o_pair(self, a, z):
        return torch.zeros_like(super()._o_pair(a, z))


class OFPairValuesTransposed(HookedOpenFold):
    """Bug: o_pair[i] sums a_ij z_ji."""

    def _o_pair(self, a, z):
        return super()._o_pair(a, z.transpose(1, 2))


class OFPairBiasTransposed(HookedOpenFold):
    """Bug: the pair bias of (i, j) is read from z_ji."""

    def _pair_bias(self, z):
        return super()._pair_bias(z.transpose(1, 2))


class OFNormWithoutEps(HookedOpenFold):
    """Bug: o_pt_norm = sqrt(sum o_pt^2), eps missing."""

    def _norms(self, o_pt):
        B, N = o_pt.shape[:2]
        return torch.sqrt((o_pt ** 2).sum(dim=-1)).reshape(B, N, -1)


class OFOptInterleaved(HookedOpenFold):
    """Bug: X, Y, Z cut as three blocks from o_pt flattened (h, p, xyz) (the reshape trap)."""

    def _xyz(self, o_pt):
        B, N, H, Pv, _ = o_pt.shape
        return torch.split(o_pt.reshape(B, N, H * Pv * 3), H * Pv, dim=-1)


class OFPointsInterleaved(HookedOpenFold):
    """Bug: the point projections' output viewed (H, P, 3), not as [X | Y | Z] blocks."""

    def _local_points(self, y, H, P):
        return y.view(*y.shape[:2], H, P, 3)


class OFKvBlocks(HookedOpenFold):
    """Bug: linear_kv read as [all k | all v] instead of k and v interleaved per head."""

    def _kv(self, s, H, C):
        k, v = self.linear_kv(s).split(H * C, dim=-1)
        return k.reshape(*s.shape[:2], H, C), v.reshape(*s.shape[:2], H, C)


class OFSoftplusMissing(HookedOpenFold):
    """Bug: the point weight uses head_weights itself, softplus missing."""

    def _point_weight(self):
        Pq = self.config.no_qk_points
        return self.head_weights * math.sqrt(1.0 / (3 * (Pq * 9.0 / 2)))


class OFMaskKeysIgnored(HookedOpenFold):
    """Bug: the mask is applied for the query rows only: every key counts as present."""

    def _mask_logits(self, logit, mask):
        return logit + self.config.inf * (mask[:, :, None] - 1)[:, None]


class OFKeyOnlyMask(HookedOpenFold):
    """Bug: logit + inf (m_j - 1): masked query rows attend to the present keys only."""

    def _mask_logits(self, logit, mask):
        return logit + self.config.inf * (mask[:, None, :] - 1)[:, None]


class OFMaskMinusInf(HookedOpenFold):
    """Bug: masked pairs filled with -inf: the masked query rows become NaN."""

    def _mask_logits(self, logit, mask):
        pair = (mask[:, :, None] * mask[:, None, :])[:, None]
        return logit.masked_fill(pair == 0, -math.inf)


class OFSmallInf(HookedOpenFold):
    """Bug: the mask constant is 1e4 (OpenFold's low-precision config), not 1e5."""

    def _mask_logits(self, logit, mask):
        return logit + 1e4 * (mask[:, :, None] * mask[:, None, :] - 1)[:, None]


class OFMaskOfElement0(HookedOpenFold):
    """Bug: the mask is read without its batch stride: every element uses element 0's."""

    def _mask_logits(self, logit, mask):
        return super()._mask_logits(logit, mask[:1].expand_as(mask))


def planted_openfold_variant(module_cls: type[OpenFoldIPA], name: str) -> type[Variant]:
    """A Variant class of problem openfold that builds `module_cls` with the given weights."""
    return planted_variant(module_cls, name, problem="openfold")


HookedOpenFoldExact = planted_openfold_variant(HookedOpenFold, "planted-of-none")

# Every planted openfold bug, with the suspect `diagnose` must name first (a rule name in
# variants/openfold/probes.py RULES).
PLANTED_OPENFOLD_BUGS: dict[type[Variant], str] = {
    planted_openfold_variant(cls, name): rule for cls, name, rule in (
        (OFRowConvention, "planted-of-row-convention", "frame-convention"),
        (OFInverseFrameWithR, "planted-of-inverse-frame", "inverse-frame"),
        (OFInverseFrameWithoutT, "planted-of-inverse-frame-no-t", "frame-translation"),
        (OFNoPairValues, "planted-of-no-pair-values", "pair-values"),
        (OFPairValuesTransposed, "planted-of-pair-values-transposed", "pair-values"),
        (OFPairBiasTransposed, "planted-of-pair-bias-transposed", "pair-bias"),
        (OFNormWithoutEps, "planted-of-norm-no-eps", "point-norm-eps"),
        (OFOptInterleaved, "planted-of-o-pt-interleaved", "o-pt-layout"),
        (OFPointsInterleaved, "planted-of-points-interleaved", "point-layout"),
        (OFKvBlocks, "planted-of-kv-blocks", "heads"),
        (OFSoftplusMissing, "planted-of-softplus", "point-weight"),
        (OFMaskKeysIgnored, "planted-of-mask-keys-ignored", "mask"),
        (OFKeyOnlyMask, "planted-of-key-only-mask", "masked-rows"),
        (OFMaskMinusInf, "planted-of-mask-minus-inf", "masked-rows"),
        (OFSmallInf, "planted-of-small-inf", "mask-inf"),
        (OFMaskOfElement0, "planted-of-mask-batch-0", "batch"),
    )
}


# ---- openfold backward bugs (diagnose --pass forward+backward) ---------------------------------
# The forward exact (a `.detach()` on one path, or an autograd.Function whose forward is the
# true op), one gradient path wrong; each paired with the term `diagnose --pass
# forward+backward --problem openfold` must name first and the gradient rule that names it.

class OFPairValuesZDetached(HookedOpenFold):
    """Backward bug: o_pair from z.detach(): z's gradient through the pair values is lost."""

    def _o_pair(self, a, z):
        return super()._o_pair(a, z.detach())


class OFPairBiasZDetached(HookedOpenFold):
    """Backward bug: the pair bias from z.detach(): z's gradient through the bias is lost."""

    def _pair_bias(self, z):
        return super()._pair_bias(z.detach())


class OFHeadWeightsDetached(HookedOpenFold):
    """Backward bug: the point distance weighted by softplus(head_weights.detach())."""

    def _point_weight(self):
        Pq = self.config.no_qk_points
        return F.softplus(self.head_weights.detach()) * math.sqrt(1.0 / (3 * (Pq * 9.0 / 2)))


class OFValuePointsDetached(HookedOpenFold):
    """Backward bug: the value points detached: no gradient back through o_pt_g = sum a v_pts."""

    def _split_kv_points(self, kv_pts, Pq):
        k_pts, v_pts = super()._split_kv_points(kv_pts, Pq)
        return k_pts, v_pts.detach()


class OFKeyPointsDetached(HookedOpenFold):
    """Backward bug: the key points detached: no gradient back through the distances to k."""

    def _split_kv_points(self, kv_pts, Pq):
        k_pts, v_pts = super()._split_kv_points(kv_pts, Pq)
        return k_pts.detach(), v_pts


class OFInverseFrameDetached(HookedOpenFold):
    """Backward bug: the frame detached in the inverse transform R_i^T (g - t_i)."""

    def _to_local(self, g, rotations, translations):
        return super()._to_local(g, rotations.detach(), translations.detach())


class SoftmaxWithoutRowSum(torch.autograd.Function):
    """Softmax over the last dim; the backward forgets the row sum: d logits = a * da instead
    of a * (da - sum_j a da). (Both problems' planted softmax-backward bugs use it.)"""

    @staticmethod
    def forward(ctx, logit):
        a = torch.softmax(logit, dim=-1)
        ctx.save_for_backward(a)
        return a

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return a * grad


class OFSoftmaxNoRowSum(HookedOpenFold):
    """Backward bug: the softmax backward without its row-sum term."""

    def _softmax(self, logit):
        return SoftmaxWithoutRowSum.apply(logit)


def planted_openfold_backward_variant(module_cls: type[OpenFoldIPA], name: str
                                      ) -> type[Variant]:
    """A trainable Variant class of problem openfold that builds `module_cls`."""
    return planted_variant(module_cls, name, problem="openfold", backward=True)


HookedOpenFoldTrainable = planted_openfold_backward_variant(HookedOpenFold,
                                                            "planted-of-none-trainable")
# A forward bug with a backward: the forward rules come first, the gradients follow it.
PairValuesTransposedTrainable = planted_openfold_backward_variant(
    OFPairValuesTransposed, "planted-of-pair-values-transposed-trainable")

# Every planted openfold backward bug: (the gradients that must be named wrong, the term
# named first, the gradient rule that names it; variants/openfold/probes.py GRADIENT_RULES).
PLANTED_OPENFOLD_BACKWARD_BUGS: dict[type[Variant], tuple[set[str], str, str]] = {
    planted_openfold_backward_variant(cls, name): expected for cls, name, expected in (
        (OFPairValuesZDetached, "planted-of-o-pair-z-detached",
         ({"z"}, "pair values", "pair-values-grad")),
        (OFPairBiasZDetached, "planted-of-pair-bias-z-detached",
         ({"z"}, "pair bias", "pair-bias-z-grad")),
        (OFHeadWeightsDetached, "planted-of-head-weights-detached",
         ({"head_weights"}, "point distance", "point-distance-grad")),
        (OFValuePointsDetached, "planted-of-value-points-detached",
         ({"linear_kv_points.linear.weight", "linear_kv_points.linear.bias", "translations",
           "rotations", "s"}, "value aggregation", "value-points-grad")),
        (OFKeyPointsDetached, "planted-of-key-points-detached",
         ({"linear_kv_points.linear.weight", "linear_kv_points.linear.bias", "translations",
           "rotations", "s"}, "point distance", "key-points-grad")),
        (OFInverseFrameDetached, "planted-of-inverse-frame-detached",
         ({"translations", "rotations"}, "frame", "frame-grad")),
        (OFSoftmaxNoRowSum, "planted-of-softmax-no-row-sum",
         (None, "attention weights (softmax)", "softmax-grad")),
    )
}
