#!/usr/bin/env bash
# Ray for the GPU machine (issue #19), which has no package index and takes at most 64 MiB of
# working tree per call: the Ray wheel (67 MB, 159 MB unpacked) stripped of what `sweep --ray`
# never imports (RLlib, Tune, Serve, Data, Train, AIR, workflows, the dashboard's web client,
# the Java jars), packed with xz, plus the wheels of its dependencies.
#
#   bash gpu_diagnostics/ray_bundle.sh [PYTHON_VERSION]     # here: build/ray-bundle/ (~26 MB)
#   # on the device (carry build/ray-bundle):
#   bash gpu_diagnostics/ray_bundle.sh --install /tmp/raylib && export PYTHONPATH=/tmp/raylib:.
set -euo pipefail
RAY_VERSION=2.40.0
HERE=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE=$HERE/build/ray-bundle
if [[ "${1:-}" == "--install" ]]; then
    target=${2:?--install TARGET}
    mkdir -p "$target"
    tar xJf "$BUNDLE/ray-stripped.tar.xz" -C "$target"
    python3 -m pip install -q --no-index --no-deps --target "$target" "$BUNDLE"/deps/*.whl
    PYTHONPATH=$target python3 -c "import ray; print('ray', ray.__version__, 'from', ray.__file__)"
    exit 0
fi
PYV=${1:-3.12}
TAG=cp${PYV/./}
PIP=(python3 -m pip download --only-binary=:all: --python-version "$PYV"
     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/deps"
"${PIP[@]}" --no-deps -d "$work" "ray==$RAY_VERSION"
# unpacked keeping the files' modes (gcs_server and raylet are executables)
python3 - "$work"/ray-$RAY_VERSION-$TAG-$TAG-*.whl "$work/unpacked" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for info in wheel.infolist():
        path = wheel.extract(info, sys.argv[2])
        if info.external_attr >> 16:
            os.chmod(path, info.external_attr >> 16 & 0o777)
PY
(cd "$work/unpacked/ray" && rm -rf rllib tune serve data train air workflow jars dashboard/client)
tar cf - -C "$work/unpacked" . | xz -T0 -6 > "$BUNDLE/ray-stripped.tar.xz"
"${PIP[@]}" -d "$BUNDLE/deps" click filelock jsonschema "msgpack>=1,<2" packaging \
    "protobuf>=3.15.3" pyyaml aiosignal frozenlist requests
du -sh "$BUNDLE"
