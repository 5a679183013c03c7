"""A KernelBench-style ModelNew that compiles one CUDA piece with `load_inline`: the inverse
frame, (g - t_i) @ R_i^T for every aggregated value point. The rest is eager PyTorch.

Correct on purpose: `ipa-bench check --model-new` must pass it on the GPU (fp32 and bf16;
the kernel computes in float, so it is at least as accurate as the reference). Importing it
compiles the extension, which needs a CUDA build of torch and nvcc.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/AccumulateType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

// One thread per point: out[r, p, :] = (g[r, p, :] - t[r, :]) @ R[r]^T, r = b * N + n.
// Reads 3 + 3 + 9 elements per point, writes 3.
template <typename scalar_t>
__global__ void inverse_frame_kernel(const scalar_t* __restrict__ g,
                                     const scalar_t* __restrict__ rot,
                                     const scalar_t* __restrict__ trans,
                                     scalar_t* __restrict__ out,
                                     int64_t rows, int64_t points) {
    using acc_t = at::acc_type<scalar_t, true>;
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= rows * points) return;
    const int64_t row = idx / points;
    const scalar_t* R = rot + row * 9;
    acc_t c[3];
    for (int k = 0; k < 3; ++k) {
        c[k] = static_cast<acc_t>(g[idx * 3 + k]) - static_cast<acc_t>(trans[row * 3 + k]);
    }
    for (int e = 0; e < 3; ++e) {
        acc_t s = 0;
        for (int k = 0; k < 3; ++k) s += c[k] * static_cast<acc_t>(R[e * 3 + k]);  // R^T[k, e]
        out[idx * 3 + e] = static_cast<scalar_t>(s);
    }
}

// g (B, N, P, 3), rotations (B, N, 3, 3), translations (B, N, 3) -> (B, N, P, 3)
torch::Tensor inverse_frame(torch::Tensor g, torch::Tensor rotations,
                            torch::Tensor translations) {
    TORCH_CHECK(g.is_cuda(), "inverse_frame: expected CUDA tensors, got points on ", g.device());
    TORCH_CHECK(g.dim() == 4 && g.size(3) == 3, "inverse_frame: points must be (B, N, P, 3)");
    const int64_t B = g.size(0), N = g.size(1), P = g.size(2);
    TORCH_CHECK(rotations.sizes() == torch::IntArrayRef({B, N, 3, 3}),
                "inverse_frame: rotations must be (B, N, 3, 3), got ", rotations.sizes());
    TORCH_CHECK(translations.sizes() == torch::IntArrayRef({B, N, 3}),
                "inverse_frame: translations must be (B, N, 3), got ", translations.sizes());
    TORCH_CHECK(rotations.scalar_type() == g.scalar_type() &&
                translations.scalar_type() == g.scalar_type(),
                "inverse_frame: points, rotations and translations must share one dtype");
    const c10::cuda::CUDAGuard guard(g.device());
    auto gc = g.contiguous();
    auto rc = rotations.contiguous();
    auto tc = translations.contiguous();
    auto out = torch::empty_like(gc);
    const int64_t total = B * N * P;
    if (total == 0) return out;
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16,
                                    gc.scalar_type(), "inverse_frame", [&] {
        inverse_frame_kernel<scalar_t><<<static_cast<unsigned int>(blocks), threads, 0,
                                         c10::cuda::getCurrentCUDAStream()>>>(
            gc.data_ptr<scalar_t>(), rc.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), B * N, P);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

CPP_SOURCE = """
torch::Tensor inverse_frame(torch::Tensor g, torch::Tensor rotations, torch::Tensor translations);
"""

ext = load_inline(name="ipa_bench_test_inverse_frame", cpp_sources=CPP_SOURCE,
                  cuda_sources=CUDA_SOURCE, functions=["inverse_frame"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, node_dim, pair_dim, num_heads, num_query_points, num_value_points):
        super().__init__()
        self.heads, self.head_dim = num_heads, node_dim // num_heads
        self.qp, self.vp = num_query_points, num_value_points
        hd = num_heads * self.head_dim
        self.layer_norm = nn.LayerNorm(node_dim)
        self.q_proj = nn.Linear(node_dim, hd, bias=False)
        self.k_proj = nn.Linear(node_dim, hd, bias=False)
        self.v_proj = nn.Linear(node_dim, hd, bias=False)
        self.q_pts = nn.Linear(node_dim, num_heads * num_query_points * 3, bias=False)
        self.k_pts = nn.Linear(node_dim, num_heads * num_query_points * 3, bias=False)
        self.v_pts = nn.Linear(node_dim, num_heads * num_value_points * 3, bias=False)
        self.pair_bias = nn.Linear(pair_dim, num_heads, bias=False)
        self.head_weights = nn.Parameter(torch.zeros(num_heads))
        self.out_proj = nn.Linear(hd + num_heads * num_value_points * 3, node_dim)

    def forward(self, node_repr, pair_repr, translations, rotations):
        B, N, _ = node_repr.shape
        H, d = self.heads, self.head_dim
        t = translations.unsqueeze(2)

        def to_global(y, points):  # (B, N, H*P*3) local -> (B, H, N, P*3) global: p @ R + t
            g = y.reshape(B, N, H * points, 3) @ rotations + t
            return g.reshape(B, N, H, points * 3).transpose(1, 2)

        x = self.layer_norm(node_repr)
        q, k, v = (p(x).reshape(B, N, H, d).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        qp, kp = to_global(self.q_pts(x), self.qp), to_global(self.k_pts(x), self.qp)
        vp = to_global(self.v_pts(x), self.vp)
        dist = (qp.unsqueeze(3) - kp.unsqueeze(2)).square().sum(-1)
        logits = (q @ k.transpose(-1, -2)) * d**-0.5
        logits = logits - 0.5 * F.softplus(self.head_weights).view(1, H, 1, 1) * dist
        a = (logits + self.pair_bias(pair_repr).permute(0, 3, 1, 2)).softmax(-1)
        o_s = (a @ v).transpose(1, 2).reshape(B, N, H * d)
        o_p = (a @ vp).transpose(1, 2).reshape(B, N, H * self.vp, 3)
        o_p = ext.inverse_frame(o_p, rotations, translations)  # the CUDA piece
        return self.out_proj(torch.cat([o_s, o_p.reshape(B, N, -1)], dim=-1))
