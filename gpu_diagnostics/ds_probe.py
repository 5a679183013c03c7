"""triton-train's dS against the float64 oracle's, head by head, beside the fp32 reference's: which
heads carry the fp32 gradients' excess error, and whether it grows with N (on the H100 the
gradients that depend on dS alone had 1.05x the reference's error at N = 1024 and 1.40x at 4096,
2026-12-06, where the CPU emulation `ds_emulation.py` does not grow with N).

dS is d loss / d logit (natural units, (B, H, N, N)) for loss = grad_out . output, one seeded
grad_out, the suite's inputs and state_dict. The kernels' is the buffer the key kernel writes
(`bias_backward.attention_gradients`, kept after the step); the reference's is the gradient at the
input of its softmax, computed in chunks of query rows (`query_rows`: rows are independent), in
fp32 and in float64 from the same fp32 inputs upcast. Prints per head rel_l2 of each against
float64, their ratio, and softplus(head_weights).

    PYTHONPATH=. python3 gpu_diagnostics/ds_probe.py N [--rows 256] [--device cuda]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 gpu_diagnostics/ds_probe.py 40 --device cpu  # dry run
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch
import torch.nn.functional as F

import variants.reference as reference
import variants.triton.bias_backward as bias_backward
from harness.correctness import rel_l2
from harness.runner import training_step
from variants.problem import IPAConfig, make_inputs
from variants.reference import init_state_dict, make_module
from variants.triton.variants import TritonTrain


@contextmanager
def softmax_gradients(into: list):
    """While active, the reference's softmax appends the gradient at its input to `into`."""
    softmax = F.softmax

    def hooked(x, *args, **kwargs):
        x.register_hook(into.append)
        return softmax(x, *args, **kwargs)

    reference.F.softmax = hooked
    try:
        yield
    finally:
        reference.F.softmax = softmax


def reference_ds(state_dict, config, inputs, grad_out, dtype, rows: int) -> torch.Tensor:
    """The reference's dS in `dtype`, computed `rows` query rows at a time."""
    module = make_module(state_dict, config, grad_out.device, dtype)
    args = [t.to(dtype) for t in inputs]
    args[0].requires_grad_(True)  # so that the logits require grad
    n = args[0].shape[1]
    parts = []
    for r0 in range(0, n, rows):
        found: list[torch.Tensor] = []
        with softmax_gradients(found):
            out = module(*args, query_rows=slice(r0, r0 + rows))
            out.backward(grad_out[:, r0:r0 + rows].to(dtype))
        parts.append(found[0].detach())
        args[0].grad = None
    return torch.cat(parts, dim=2)


def kernel_ds(state_dict, config, inputs, grad_out, device) -> torch.Tensor:
    """triton-train's dS: the key kernel's buffer after one training step."""
    kept: list[torch.Tensor] = []
    gradients = bias_backward.attention_gradients

    def keeping(*args, **kwargs):
        result = gradients(*args, **kwargs)
        ds = kwargs.get("ds")
        kept.append((args[10] if ds is None else ds).clone())  # args[10]: the logits
        return result

    fn = TritonTrain().build(state_dict, config, device, "fp32")
    params = {name: p.requires_grad_(True) for name, p in fn.parameters()}
    args = tuple(t.clone().requires_grad_(True) for t in inputs)
    bias_backward.attention_gradients = keeping
    try:
        training_step(fn, args, params, grad_out)
    finally:
        bias_backward.attention_gradients = gradients
    return kept[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("length", type=int)
    parser.add_argument("--rows", type=int, default=256, help="query rows per reference chunk")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    opts = parser.parse_args()
    config = IPAConfig()
    state_dict = init_state_dict(config)
    inputs = make_inputs(config, 1, opts.length, device=opts.device).as_tuple()
    g = torch.Generator(device=opts.device).manual_seed(1)
    grad_out = torch.randn(1, opts.length, config.node_dim, generator=g, device=opts.device)
    ds64 = reference_ds(state_dict, config, inputs, grad_out, torch.float64, opts.rows)
    ds_ref = reference_ds(state_dict, config, inputs, grad_out, torch.float32, opts.rows)
    ds_kernel = kernel_ds(state_dict, config, inputs, grad_out, opts.device)
    w = F.softplus(state_dict["head_weights"].double())

    def rel(got, h=slice(None)):
        return rel_l2(got[:, h], ds64[:, h])

    print(f"N = {opts.length}, dS rel_l2 against float64 (fp32 reference / triton-train / ratio):")
    for h in range(config.heads):
        ref, ker = rel(ds_ref, h), rel(ds_kernel, h)
        print(f"  head {h:2d} (w {w[h]:.2f}): {ref:.3g} / {ker:.3g} / {ker / ref:.2f}")
    ref, ker = rel(ds_ref), rel(ds_kernel)
    print(f"  all heads: {ref:.3g} / {ker:.3g} / {ker / ref:.2f}")


if __name__ == "__main__":
    main()
