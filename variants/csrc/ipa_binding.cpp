// Thin torch binding of the IPA kernels: argument checks with readable messages, output and
// workspace allocation, the current stream. The kernels live in ipa_fused*.cu / ipa_openfold.cu /
// ipa_hybrid.cu / ipa_frames.cu and compile without torch headers.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <string>
#include <type_traits>
#include <vector>

#include "ipa_kernels.h"

namespace {

// The refusals' messages are built here, from strings and std::to_string, and reach TORCH_CHECK
// as one string: never through its own std::ostream formatting. On the GPU machine's torch 2.11
// a refusal whose message streamed an integer segfaulted instead of raising, while those that
// streamed only strings raised (thirty-fourth session; test_binding_refusals_raise covers both).
std::string piece(const char* s) { return s; }
std::string piece(const std::string& s) { return s; }
std::string piece(const at::Device& device) { return device.str(); }
std::string piece(at::IntArrayRef dims) {
  std::string s = "(";
  for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + ")";
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
std::string piece(T value) {
  return std::to_string(value);
}

template <typename... Parts>
std::string message(const Parts&... parts) {
  std::string s;
  ((s += piece(parts)), ...);
  return s;
}

#define IPA_CHECK(cond, ...) TORCH_CHECK(cond, message(__VA_ARGS__))

// A dtype as Python spells it, for the messages.
const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kBool: return "bool";
    default: return "another dtype";
  }
}

void check_tensor(const char* fn, const char* name, const at::Tensor& t, at::ScalarType dtype,
                  const std::vector<int64_t>& shape, const at::Device& device) {
  IPA_CHECK(t.is_cuda(), fn, ": argument '", name, "': expected a CUDA tensor, got device ",
            t.device());
  IPA_CHECK(t.device() == device, fn, ": argument '", name, "': expected device ", device,
            " (as the first argument), got ", t.device());
  IPA_CHECK(t.scalar_type() == dtype, fn, ": argument '", name, "': expected dtype ",
            dtype_name(dtype), ", got ", dtype_name(t.scalar_type()));
  bool same = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t d = 0; same && d < shape.size(); ++d) same = t.size(d) == shape[d];
  IPA_CHECK(same, fn, ": argument '", name, "': expected shape ", at::IntArrayRef(shape), ", got ",
            t.sizes());
  IPA_CHECK(t.is_contiguous(), fn, ": argument '", name,
            "': expected a contiguous tensor, got strides ", t.strides());
}

void check_cuda(const char* fn, cudaError_t err) {
  IPA_CHECK(err == cudaSuccess, fn, ": CUDA error: ", cudaGetErrorString(err));
}

// A frames or output dtype as ipa::ValueKind; `name` is the argument a refusal names.
int value_kind(const char* fn, const char* name, at::ScalarType t) {
  IPA_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, fn, ": argument '", name,
            "': expected dtype float32, bfloat16 or float16, got ", dtype_name(t));
  return t == at::kFloat ? ipa::kFloat32Values
                         : t == at::kBFloat16 ? ipa::kBFloat16Values : ipa::kFloat16Values;
}

// rot (B, N, 3, 3) and trans (B, N, 3), both of one dtype (float32, bfloat16 or float16):
// checked, their ValueKind returned.
int check_frames(const char* fn, const at::Tensor& rot, const at::Tensor& trans, int64_t B,
                 int64_t N, const at::Device& dev) {
  const int kind = value_kind(fn, "rot", rot.scalar_type());
  check_tensor(fn, "rot", rot, rot.scalar_type(), {B, N, 3, 3}, dev);
  check_tensor(fn, "trans", trans, rot.scalar_type(), {B, N, 3}, dev);
  return kind;
}

// finish's inputs checked, its arguments returned (the output's left unset: `finish_output`):
// attended (B, N, H, pitch) float32, pitch >= d + 3*vp; rot (B, N, 3, 3), trans (B, N, 3)
// (float32, bfloat16 or float16).
ipa::FinishArgs finish_args(const char* fn, const at::Tensor& attended, const at::Tensor& rot,
                            const at::Tensor& trans, int64_t d, int64_t vp) {
  IPA_CHECK(attended.dim() == 4, fn,
            ": argument 'attended': expected 4 dims (B, N, H, pitch), got shape ",
            attended.sizes());
  const int64_t B = attended.size(0), N = attended.size(1), H = attended.size(2);
  const int64_t pitch = attended.size(3);
  const at::Device dev = attended.device();
  IPA_CHECK(d >= 1 && vp >= 1 && pitch >= d + 3 * vp, fn,
            ": expected d, vp >= 1 and pitch (attended dim 3) >= d + 3*vp, got d=", d, ", vp=", vp,
            ", pitch=", pitch);
  check_tensor(fn, "attended", attended, at::kFloat, {B, N, H, pitch}, dev);
  ipa::FinishArgs args{};
  args.frame_kind = check_frames(fn, rot, trans, B, N, dev);
  args.attended = attended.data_ptr<float>();
  args.rot = rot.data_ptr();
  args.trans = trans.data_ptr();
  args.B = static_cast<int>(B);
  args.N = static_cast<int>(N);
  args.H = static_cast<int>(H);
  args.d = static_cast<int>(d);
  args.vp = static_cast<int>(vp);
  args.pitch = static_cast<int>(pitch);
  return args;
}

// finish's output checked and set in `args`: out (B, N, H*d + 3*H*vp) on `dev`, float32 or the
// frames' dtype (`frames`: rot's), contiguous; `name` is the argument a refusal names.
void finish_output(const char* fn, ipa::FinishArgs& args, at::ScalarType frames,
                   const at::Device& dev, const at::Tensor& out, const char* name) {
  args.out_kind = value_kind(fn, name, out.scalar_type());
  IPA_CHECK(out.scalar_type() == at::kFloat || out.scalar_type() == frames, fn, ": argument '",
            name, "': expected float32 or the frames' dtype ", dtype_name(frames), ", got ",
            dtype_name(out.scalar_type()));
  const int64_t width = static_cast<int64_t>(args.H) * (args.d + 3 * args.vp);
  check_tensor(fn, name, out, out.scalar_type(), {args.B, args.N, width}, dev);
  args.out = out.data_ptr();
}

// q, k (B, H, N, wq) float32; v (B, H, N, wv) float32; z (B, N, N, C) float32 or bfloat16;
// wb (H, C) float32; pw (H,) float32; out (B, N, H, dv) float32, fully overwritten.
// workspace: optional float32 buffer for split-K partials (allocated when absent or too small).
// splits: key-range splits, 0 = automatic. bias: ipa::FusedBias, the af2 class's pair bias
// form (0 FFMA; 1 and 2 on tensor cores, 1 for bf16 z only; 3 the tensor-core kernel). With
// `local`, the call ends in finish_frames' output, written there ((B, N, H*d + 3*H*vp), d =
// dv - 3*vp; float32 or the frames' dtype; rot and trans as finish_frames takes them): when the
// key range is split, the partials are merged in finish's own launch and `out` is not written
// (ipa::fused_launch). Returns the plan for the record: [splits, key_tile, smem_bytes,
// blocks_per_sm, workspace_floats].
std::vector<int64_t> fused_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& z, const at::Tensor& wb, const at::Tensor& pw,
                                   at::Tensor out, int64_t klass, int64_t dqp, int64_t dv,
                                   int64_t splits, c10::optional<at::Tensor> workspace,
                                   int64_t bias, c10::optional<at::Tensor> rot,
                                   c10::optional<at::Tensor> trans, int64_t value_points,
                                   c10::optional<at::Tensor> local) {
  const char* fn = "ipa fused_forward";
  IPA_CHECK(q.dim() == 4, fn, ": argument 'q': expected 4 dims (B, H, N, wq), got shape ",
            q.sizes());
  IPA_CHECK(z.dim() == 4, fn, ": argument 'z': expected 4 dims (B, N, N, C), got shape ",
            z.sizes());
  IPA_CHECK(v.dim() == 4, fn, ": argument 'v': expected 4 dims (B, H, N, wv), got shape ",
            v.sizes());
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), wq = q.size(3);
  const int64_t wv = v.size(3), C = z.size(3);
  const at::Device dev = q.device();
  IPA_CHECK(q.is_cuda(), fn, ": argument 'q': expected a CUDA tensor, got device ", dev);
  check_tensor(fn, "q", q, at::kFloat, {B, H, N, wq}, dev);
  check_tensor(fn, "k", k, at::kFloat, {B, H, N, wq}, dev);
  check_tensor(fn, "v", v, at::kFloat, {B, H, N, wv}, dev);
  IPA_CHECK(z.scalar_type() == at::kFloat || z.scalar_type() == at::kBFloat16, fn,
            ": argument 'z': expected dtype float32 or bfloat16, got ",
            dtype_name(z.scalar_type()));
  check_tensor(fn, "z", z, z.scalar_type(), {B, N, N, C}, dev);
  check_tensor(fn, "wb", wb, at::kFloat, {H, C}, dev);
  check_tensor(fn, "pw", pw, at::kFloat, {H}, dev);
  check_tensor(fn, "out", out, at::kFloat, {B, N, H, dv}, dev);
  IPA_CHECK(klass == ipa::kFusedSmall || klass == ipa::kFusedGeneric || klass == ipa::kFusedAF2, fn,
            ": argument 'klass': expected 0 (small), 1 (generic) or 2 (af2), got ", klass);
  const ipa::FusedClassLimits lim = ipa::fused_class_limits(static_cast<int>(klass));
  const int64_t width = 4 * lim.lanes_per_row;
  IPA_CHECK(H >= 1 && H <= lim.max_heads && (!lim.even_heads || H % 2 == 0), fn,
            ": argument 'q': expected heads (dim 1) in [1, ", lim.max_heads, "]",
            lim.even_heads ? " and even" : "", " for kernel class ", klass, ", got ", H);
  IPA_CHECK(C >= 8 && C <= ipa::kMaxPairDim && C % 8 == 0, fn,
            ": argument 'z': expected pair_dim (dim 3) a multiple of 8 in [8, ", ipa::kMaxPairDim,
            "], got ", C);
  IPA_CHECK(dqp > 0 && dqp % width == 0 && dqp <= lim.max_dqp && dqp < wq, fn,
            ": argument 'dqp': expected a multiple of ", width, " in [", width, ", ", lim.max_dqp,
            "] and below wq=", wq, ", got ", dqp);
  IPA_CHECK((wq - dqp) % width == 0 && wq - dqp <= lim.max_pqp, fn,
            ": argument 'q': expected point width wq - dqp a multiple of ", width,
            " <= ", lim.max_pqp, ", got ", wq - dqp);
  IPA_CHECK(wv % width == 0 && wv <= lim.max_wv && dv >= 1 && dv <= wv, fn,
            ": argument 'v': expected width (dim 3) a multiple of ", width, " <= ", lim.max_wv,
            " and >= dv=", dv, ", got ", wv);
  IPA_CHECK(!lim.exact || (dqp == lim.max_dqp && wq - dqp == lim.max_pqp && wv == lim.max_wv &&
                           C == lim.pair_dim),
            fn, ": kernel class ", klass, " takes exactly dqp=", lim.max_dqp,
            ", wq - dqp=", lim.max_pqp, ", wv=", lim.max_wv, " and pair_dim=", lim.pair_dim,
            ", got dqp=", dqp, ", wq - dqp=", wq - dqp, ", wv=", wv, ", pair_dim=", C);
  IPA_CHECK(splits >= 0, fn, ": argument 'splits': expected >= 0 (0 = automatic), got ", splits);
  IPA_CHECK(B <= 65535, fn, ": argument 'q': expected batch (dim 0) <= 65535, got ", B);
  IPA_CHECK(bias == static_cast<int>(bias) &&
                ipa::fused_bias_fits(static_cast<int>(klass), z.scalar_type() == at::kBFloat16,
                                     static_cast<int>(bias)),
            fn, ": argument 'bias': expected 0 (FFMA), or with klass 2 (af2) 2 (tensor cores, ",
            "heads as rows), 3 (tensor cores throughout) or, for a bfloat16 z, 1 (pairs as ",
            "rows), got bias=", bias, ", klass=", klass, ", z ", dtype_name(z.scalar_type()));

  const bool finish = local.has_value() && local->defined();
  IPA_CHECK(!finish || (rot.has_value() && trans.has_value() && value_points >= 1 &&
                        3 * value_points < dv),
            fn, ": argument 'local': expected rot, trans and value_points in [1, (dv - 1) / 3] ",
            "with it, got value_points=", value_points, ", dv=", dv);
  ipa::FinishArgs finish_in{};
  if (finish) {
    finish_in = finish_args(fn, out, *rot, *trans, dv - 3 * value_points, value_points);
    finish_output(fn, finish_in, rot->scalar_type(), dev, *local, "local");
  }

  const c10::cuda::CUDAGuard guard(dev);
  ipa::FusedPlan plan{};
  const bool bf16 = z.scalar_type() == at::kBFloat16;
  cudaError_t err = ipa::fused_plan(static_cast<int>(klass), bf16, static_cast<int>(B),
                                    static_cast<int>(N), static_cast<int>(H), static_cast<int>(C),
                                    static_cast<int>(wq), static_cast<int>(wv),
                                    static_cast<int>(splits), &plan,
                                    static_cast<int>(bias));
  check_cuda(fn, err);
  at::Tensor ws;
  if (plan.workspace_floats > 0) {
    if (workspace.has_value() && workspace->defined() &&
        workspace->numel() >= static_cast<int64_t>(plan.workspace_floats)) {
      IPA_CHECK(workspace->is_cuda() && workspace->device() == dev &&
                    workspace->scalar_type() == at::kFloat && workspace->is_contiguous(),
                fn, ": argument 'workspace': expected a contiguous float32 tensor on ", dev);
      ws = *workspace;
    } else {
      ws = at::empty({static_cast<int64_t>(plan.workspace_floats)}, q.options());
    }
  }
  ipa::FusedArgs args{};
  args.q = q.data_ptr<float>();
  args.k = k.data_ptr<float>();
  args.v = v.data_ptr<float>();
  args.z = z.data_ptr();
  args.wb = wb.data_ptr<float>();
  args.pw = pw.data_ptr<float>();
  args.out = out.data_ptr<float>();
  args.part = ws.defined() ? ws.data_ptr<float>() : nullptr;
  args.B = static_cast<int>(B);
  args.N = static_cast<int>(N);
  args.H = static_cast<int>(H);
  args.C = static_cast<int>(C);
  args.wq = static_cast<int>(wq);
  args.dqp = static_cast<int>(dqp);
  args.wv = static_cast<int>(wv);
  args.dv = static_cast<int>(dv);
  check_cuda(fn, ipa::fused_launch(args, plan, c10::cuda::getCurrentCUDAStream().stream(),
                                   finish ? &finish_in : nullptr));
  return {plan.splits, plan.key_tile, static_cast<int64_t>(plan.smem_bytes), plan.blocks_per_sm,
          static_cast<int64_t>(plan.workspace_floats)};
}

// Problem openfold's fused core (ipa_kernels.h, "Problem openfold's cuda-fused"): q (B, H, N, 28),
// k (B, H, n_pad, 28 or, for bfloat16 z, 44), v (B, H, n_pad, 44) float32 (n_pad = N rounded up
// to kOpenFoldKeyTile; rows past N and v's last 4 columns zero); z (B, N, N, 128) float32 or
// bfloat16; wb (H, 128), pw (H,), mask (B, N) float32; cat (B, N, cat_pitch) float32, its o and
// o_pair columns written; o_pt (B, N, H, 24) float32, fully overwritten. balanced_roles: the warps'
// roles dealt over the schedulers (openfold_roles), else in order. pair_halves (float32 z only):
// the pair warps split W_b's loads in pairs (OpenFoldArgs::pair_halves).
void openfold_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& z, const at::Tensor& wb, const at::Tensor& pw,
                      const at::Tensor& mask, at::Tensor cat, at::Tensor o_pt, double q_scale,
                      double inf, bool balanced_roles, bool pair_halves) {
  const char* fn = "ipa openfold_forward";
  IPA_CHECK(q.dim() == 4, fn, ": argument 'q': expected 4 dims (B, H, N, 28), got shape ",
            q.sizes());
  IPA_CHECK(z.dim() == 4, fn, ": argument 'z': expected 4 dims (B, N, N, c_z), got shape ",
            z.sizes());
  IPA_CHECK(cat.dim() == 3, fn, ": argument 'cat': expected 3 dims (B, N, features), got shape ",
            cat.sizes());
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), C = z.size(3);
  const at::Device dev = q.device();
  IPA_CHECK(q.is_cuda(), fn, ": argument 'q': expected a CUDA tensor, got device ", dev);
  IPA_CHECK(ipa::openfold_fits(static_cast<int>(H), 16, q.size(3) == 28 ? 4 : -1,
                               v.dim() == 4 && v.size(3) == 44 ? 8 : -1, static_cast<int>(C)),
            fn,
            ": expected OpenFold's sizes (q width 28 = c_hidden 16 + 3 * 4 query points, "
            "k 28, or 44 = 2 * 16 + 12 for bfloat16 z, v 44 = 16 + 3 * 8 value points + 4 zeros, "
            "c_z 128) and 1 <= heads <= ",
            ipa::kOpenFoldMaxHeads, ", got q ", q.sizes(), ", v ", v.sizes(), ", z ", z.sizes());
  check_tensor(fn, "q", q, at::kFloat, {B, H, N, 28}, dev);
  constexpr int64_t tile = ipa::kOpenFoldKeyTile;
  const int64_t n_pad = (N + tile - 1) / tile * tile;
  check_tensor(fn, "k", k, at::kFloat, {B, H, n_pad, z.scalar_type() == at::kBFloat16 ? 44 : 28},
               dev);
  check_tensor(fn, "v", v, at::kFloat, {B, H, n_pad, 44}, dev);
  IPA_CHECK(B * H * n_pad * 44 < (int64_t{1} << 31), fn,
            ": expected B * heads * N * 44 < 2^31 "
            "(the kernel's 32-bit offsets), got B = ",
            B, ", heads = ", H, ", N = ", N);
  IPA_CHECK(z.scalar_type() == at::kFloat || z.scalar_type() == at::kBFloat16, fn,
            ": argument 'z': expected dtype float32 or bfloat16, got ",
            dtype_name(z.scalar_type()));
  check_tensor(fn, "z", z, z.scalar_type(), {B, N, N, C}, dev);
  IPA_CHECK(!pair_halves || z.scalar_type() == at::kFloat, fn,
            ": argument 'pair_halves': expected false for z of dtype bfloat16 (float32 z only), "
            "got true");
  check_tensor(fn, "wb", wb, at::kFloat, {H, C}, dev);
  check_tensor(fn, "pw", pw, at::kFloat, {H}, dev);
  check_tensor(fn, "mask", mask, at::kFloat, {B, N}, dev);
  const int64_t features = cat.size(2), pair_offset = features - H * C;
  IPA_CHECK(pair_offset >= H * 16, fn, ": argument 'cat': expected at least ", H * (16 + C),
            " features (o, then o_pair last), got ", features);
  check_tensor(fn, "cat", cat, at::kFloat, {B, N, features}, dev);
  check_tensor(fn, "o_pt", o_pt, at::kFloat, {B, N, H, 24}, dev);
  IPA_CHECK(B <= 65535, fn, ": argument 'q': expected batch (dim 0) <= 65535, got ", B);
  const c10::cuda::CUDAGuard guard(dev);
  ipa::OpenFoldArgs args{};
  args.q = q.data_ptr<float>();
  args.k = k.data_ptr<float>();
  args.v = v.data_ptr<float>();
  args.z = z.data_ptr();
  args.wb = wb.data_ptr<float>();
  args.pw = pw.data_ptr<float>();
  args.mask = mask.data_ptr<float>();
  args.cat = cat.data_ptr<float>();
  args.o_pt = o_pt.data_ptr<float>();
  args.B = static_cast<int>(B);
  args.N = static_cast<int>(N);
  args.H = static_cast<int>(H);
  args.cat_pitch = static_cast<int>(features);
  args.pair_offset = static_cast<int>(pair_offset);
  args.q_scale = static_cast<float>(q_scale);
  args.inf2 = static_cast<float>(inf * 1.4426950408889634);
  args.pair_halves = pair_halves;
  args.attending = ipa::openfold_roles(static_cast<int>(H), z.scalar_type() == at::kBFloat16,
                                       balanced_roles);
  check_cuda(fn, ipa::openfold_launch(args, z.scalar_type() == at::kBFloat16,
                                      c10::cuda::getCurrentCUDAStream().stream()));
}

// q, k (B, H, N, wq) float32; bias (B, H, N, N) float32 or bfloat16; pw (H,) float32;
// probs (B, H, N, N) float32, fully overwritten.
void hybrid_probs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& bias,
                  const at::Tensor& pw, at::Tensor probs, int64_t dqp) {
  const char* fn = "ipa hybrid_probs";
  IPA_CHECK(q.dim() == 4, fn, ": argument 'q': expected 4 dims (B, H, N, wq), got shape ",
            q.sizes());
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), wq = q.size(3);
  const at::Device dev = q.device();
  IPA_CHECK(q.is_cuda(), fn, ": argument 'q': expected a CUDA tensor, got device ", dev);
  check_tensor(fn, "q", q, at::kFloat, {B, H, N, wq}, dev);
  check_tensor(fn, "k", k, at::kFloat, {B, H, N, wq}, dev);
  IPA_CHECK(bias.scalar_type() == at::kFloat || bias.scalar_type() == at::kBFloat16, fn,
            ": argument 'bias': expected dtype float32 or bfloat16, got ",
            dtype_name(bias.scalar_type()));
  check_tensor(fn, "bias", bias, bias.scalar_type(), {B, H, N, N}, dev);
  check_tensor(fn, "pw", pw, at::kFloat, {H}, dev);
  check_tensor(fn, "probs", probs, at::kFloat, {B, H, N, N}, dev);
  IPA_CHECK(wq % 4 == 0 && wq <= ipa::kHybridMaxQueryWidth, fn,
            ": argument 'q': expected width (dim 3) a multiple of 4 <= ", ipa::kHybridMaxQueryWidth,
            ", got ", wq);
  IPA_CHECK(dqp % 4 == 0 && dqp >= 0 && dqp <= wq, fn,
            ": argument 'dqp': expected a multiple of 4 in [0, wq=", wq, "], got ", dqp);
  IPA_CHECK(H <= 65535 && B <= 65535, fn, ": expected H, B <= 65535, got H=", H, ", B=", B);
  const c10::cuda::CUDAGuard guard(dev);
  ipa::HybridArgs args{};
  args.q = q.data_ptr<float>();
  args.k = k.data_ptr<float>();
  args.bias = bias.data_ptr();
  args.pw = pw.data_ptr<float>();
  args.probs = probs.data_ptr<float>();
  args.B = static_cast<int>(B);
  args.N = static_cast<int>(N);
  args.H = static_cast<int>(H);
  args.wq = static_cast<int>(wq);
  args.dqp = static_cast<int>(dqp);
  check_cuda(fn, ipa::hybrid_launch(args, bias.scalar_type() == at::kBFloat16,
                                    c10::cuda::getCurrentCUDAStream().stream()));
}

// proj (B, N, F) float32, F = 3*H*d + 6*H*qp + 3*H*vp; rot (B, N, 3, 3); trans (B, N, 3) (the
// frames float32, bfloat16 or float16). Returns [q, k] (B, H, N, dqp + pqp) and v (B, H, N, wv)
// float32, every element written.
std::vector<at::Tensor> prepare_operands(const at::Tensor& proj, const at::Tensor& rot,
                                         const at::Tensor& trans, int64_t H, int64_t d,
                                         int64_t qp, int64_t vp, int64_t dqp, int64_t pqp,
                                         int64_t wv, double q_scale) {
  const char* fn = "ipa prepare_operands";
  IPA_CHECK(proj.dim() == 3, fn,
            ": argument 'proj': expected 3 dims (B, N, features), got "
            "shape ",
            proj.sizes());
  const int64_t B = proj.size(0), N = proj.size(1);
  const at::Device dev = proj.device();
  IPA_CHECK(H >= 1 && d >= 1 && qp >= 1 && vp >= 1, fn, ": expected H, d, qp, vp >= 1, got H=", H,
            ", d=", d, ", qp=", qp, ", vp=", vp);
  IPA_CHECK(dqp >= d && pqp >= 3 * qp && wv >= d + 3 * vp, fn,
            ": expected dqp >= d, pqp >= 3*qp, wv >= d + 3*vp, got dqp=", dqp, ", pqp=", pqp,
            ", wv=", wv, " (d=", d, ", qp=", qp, ", vp=", vp, ")");
  IPA_CHECK(dqp % 4 == 0 && pqp % 4 == 0 && wv % 4 == 0, fn,
            ": expected dqp, pqp and wv multiples of 4 (16-byte rows), got dqp=", dqp,
            ", pqp=", pqp, ", wv=", wv);
  check_tensor(fn, "proj", proj, at::kFloat, {B, N, 3 * H * d + 6 * H * qp + 3 * H * vp}, dev);
  const int frame_kind = check_frames(fn, rot, trans, B, N, dev);
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor q = at::empty({B, H, N, dqp + pqp}, proj.options());
  at::Tensor k = at::empty({B, H, N, dqp + pqp}, proj.options());
  at::Tensor v = at::empty({B, H, N, wv}, proj.options());
  ipa::PrepareArgs args{proj.data_ptr<float>(), rot.data_ptr(), trans.data_ptr(),
                        q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                        static_cast<int>(B), static_cast<int>(N), static_cast<int>(H),
                        static_cast<int>(d), static_cast<int>(qp), static_cast<int>(vp),
                        static_cast<int>(proj.size(2)), static_cast<int>(dqp),
                        static_cast<int>(pqp), static_cast<int>(wv),
                        static_cast<float>(q_scale), frame_kind};
  check_cuda(fn, ipa::prepare_launch(args, c10::cuda::getCurrentCUDAStream().stream()));
  return {q, k, v};
}

// attended, rot, trans as finish_args takes them. Returns (B, N, H*d + 3*H*vp) in out_dtype
// (float32 or the frames' dtype): [o_s | value points in each residue's local frame].
at::Tensor finish_frames(const at::Tensor& attended, const at::Tensor& rot,
                         const at::Tensor& trans, int64_t d, int64_t vp,
                         c10::optional<at::ScalarType> out_dtype_arg) {
  const char* fn = "ipa finish_frames";
  ipa::FinishArgs args = finish_args(fn, attended, rot, trans, d, vp);
  const c10::cuda::CUDAGuard guard(attended.device());
  at::Tensor out = at::empty({args.B, args.N, static_cast<int64_t>(args.H) * (d + 3 * vp)},
                             attended.options().dtype(out_dtype_arg.value_or(at::kFloat)));
  finish_output(fn, args, rot.scalar_type(), attended.device(), out, "out_dtype");
  check_cuda(fn, ipa::finish_launch(args, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "IPA CUDA kernels (ipa-bench): cuda-fused, cuda-hybrid and their O(N) steps";
  m.def("fused_forward", &fused_forward, "flash-style fused IPA attention (see ipa_kernels.h)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("z"), py::arg("wb"), py::arg("pw"),
        py::arg("out"), py::arg("klass"), py::arg("dqp"), py::arg("dv"), py::arg("splits") = 0,
        py::arg("workspace") = py::none(), py::arg("bias") = 0, py::arg("rot") = py::none(),
        py::arg("trans") = py::none(), py::arg("value_points") = 0, py::arg("local") = py::none());
  m.def("openfold_forward", &openfold_forward,
        "problem openfold's fused core: o, o_pair and o_pt (see ipa_kernels.h)", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("z"), py::arg("wb"), py::arg("pw"), py::arg("mask"),
        py::arg("cat"), py::arg("o_pt"), py::arg("q_scale"), py::arg("inf"),
        py::arg("balanced_roles") = true, py::arg("pair_halves") = false);
  m.def("hybrid_probs", &hybrid_probs, "IPA attention probabilities (see ipa_kernels.h)",
        py::arg("q"), py::arg("k"), py::arg("bias"), py::arg("pw"), py::arg("probs"),
        py::arg("dqp"));
  m.def("prepare_operands", &prepare_operands,
        "projection output -> padded q, k, v operand rows, points in the global frame",
        py::arg("proj"), py::arg("rot"), py::arg("trans"), py::arg("heads"), py::arg("head_dim"),
        py::arg("query_points"), py::arg("value_points"), py::arg("dqp"), py::arg("pqp"),
        py::arg("wv"), py::arg("q_scale"));
  m.def("finish_frames", &finish_frames,
        "attended [o_s | o_p (global)] -> [o_s | o_p in the local frames]", py::arg("attended"),
        py::arg("rot"), py::arg("trans"), py::arg("head_dim"), py::arg("value_points"),
        py::arg("out_dtype") = py::none());
}
