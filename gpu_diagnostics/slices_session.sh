#!/usr/bin/env bash
# One device call for issue #17's "every published slice" (deliverable 4): the `default`
# preset's slices away from the default layer (N = 256 and 1024 with B = 4, H = 4 / 8 / 16,
# Qp = 8, Vp = 12, and the default layer itself), fp32 and bf16, eager and CUDA-graph replay,
# for $VARIANTS (default: the Triton and CUDA kernels; a second call with
# VARIANTS="flex-attention sdpa-decomposition torch-compile" adds the anchors, which compile
# per shape), then its report: per cell, which variant is fastest and how far each is from it.
# The sm_90 proxy's survey of these slices (docs/perf-notes.md, thirteenth session) predicts
# the fp32 `triton` kernel spilling at H = 4 (head_dim 96, padded to 128) and ~1.5x slower per
# unit of work at Qp = 8. Stage limits LIM_SWEEP, LIM_REPORT (seconds; 520 + 30): a cut sweep
# still returns its finished rows. Writes sweep.log, report.md, results.csv, metadata.json.
# RUN_DIR (default $OUT/slices) holds the sweep's own folder: one outside $OUT (e.g.
# /tmp/slices) survives between calls on a warm machine, and a second call resumes the sweep.
#
#   OUT=DIR bash gpu_diagnostics/slices_session.sh
#   OUT=DIR RUN_DIR=/tmp/slices bash gpu_diagnostics/slices_session.sh   (twice: resumes)
#   OUT=DIR VARIANTS="flex-attention sdpa-decomposition torch-compile" bash ...
source gpu_diagnostics/session_env.sh
VARIANTS=${VARIANTS:-triton cuda-fused cuda-hybrid triton-fullfuse}
RUN_DIR=${RUN_DIR:-$OUT/slices}
grid=$(mktemp --suffix .toml)
cat > "$grid" <<'EOF'
[base]
modes = ["eager", "graph"]
graph_max_length = 1024
dtypes = ["fp32", "bf16"]
seeds = 2
budget_s = 0.5

[[slice]]
length = [256, 1024]

[[slice]]
length = [256, 1024]
batch = [4]

[[slice]]
length = [256, 1024]
heads = [4, 8, 16]

[[slice]]
length = [256, 1024]
query_points = [8]

[[slice]]
length = [256, 1024]
value_points = [12]
EOF
variant_args=()
for v in $VARIANTS; do variant_args+=(--variant "$v"); done
timeout -s INT "${LIM_SWEEP:-520}" python3 -m harness.cli sweep --grid "$grid" --device cuda \
    -o "$RUN_DIR" --no-plots --no-progress "${variant_args[@]}" > "$OUT/sweep.log" 2>&1
timeout -s INT "${LIM_REPORT:-30}" python3 -m harness.cli report "$RUN_DIR/results.csv" \
    > "$OUT/report.md" 2>&1
cp "$RUN_DIR/results.csv" "$RUN_DIR/metadata.json" "$OUT/" 2>/dev/null
[ "$RUN_DIR" = "$OUT/slices" ] && rm -rf "$RUN_DIR"
tail -5 "$OUT/sweep.log"
head -120 "$OUT/report.md"
exit 0
