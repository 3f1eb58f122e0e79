#!/usr/bin/env bash
# Build .device/triton-pack.tar.xz (our copy of ../shared/tools/device_triton_pack.sh): what the H200 machine
# lacks to run this project's tritonserver,
# its clients and perf_analyzer. Run it in the project root after the README set-up (.venv exists).
# On the device machine:  tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
# (carry ".device" in the device run). The GPU box has Python 3.12, torch, transformers, grpcio,
# protobuf, safetensors, xxhash; it lacks numpy<2 (the 24.10 stub crashes on BYTES with numpy 2),
# soundfile, tritonclient + python-rapidjson, fastapi/uvicorn/websockets/pydantic/httpx/python-multipart,
# tritonserver; and its transformers 5.17 cannot import AutoTokenizer next to numpy<2 (its scipy/sklearn
# need numpy 2), so the pack brings the project's transformers 5.24 + tokenizers, which import neither.
# The shim's soxr comes too (its pcm is resampled to 24 kHz); PyAV does not: its 36 MB wheel would take the
# call past its 64 MiB, so the shim there serves pcm and wav only (client/openai_shim/audio_format.py).
# Versions: the pack's packages and tritonserver come from the project's one pin list, requirements.txt
# (scripts/pins.py; tritonserver is .venv's nvidia-pytriton). Python, torch and Triton are the box's own
# (3.12, torch 2.11 + Triton 3.6; none can be replaced there), and the list pins that same torch and
# Triton: env.sh compares them with the pins when sourced (MOSS_STACK, a mismatch in bold), and
# perf/h200_*.sh write that line into each run's results (docs/kubernetes.md, "One stack").
set -euo pipefail
root="$(pwd)"; [ -x .venv/bin/python ] || { echo "run the README set-up first (.venv missing)"; exit 1; }
box_python=3.12  # the H200 box's Python: its stub, and the ABI of the wheels below
site="$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
p="$work/moss-pack"; mkdir -p "$p/bin" "$p/lib" "$p/backends/python" "$p/site"
# 1. tritonserver 2.51.0 from the nvidia-pytriton wheel (its bundled libs, minus the 3.13 libpython).
cp "$site/pytriton/tritonserver/bin/tritonserver" "$p/bin/"
cp "$site"/nvidia_pytriton.libs/* "$p/lib/"; rm -f "$p"/lib/libpython3*
cp -r "$site/pytriton/tritonserver/backends/python/." "$p/backends/python/"
cp "$site/pytriton/tritonserver/python_backend_stubs/$box_python/triton_python_backend_stub" "$p/backends/python/"
# 2. perf_analyzer (tritonclient 2.51.0 wheel) + libb64 + libcudart.so.12.
cp "$(readlink -f .venv/bin/perf_analyzer)" "$p/bin/perf_analyzer"
cp "$(ldconfig -p | awk '/libb64.so.0d/{print $NF; exit}')" "$p/lib/libb64.so.0d"
cp "$site/nvidia/cuda_runtime/lib/libcudart.so.12" "$p/lib/"
# 3. Python packages for the box's Python that it lacks (binary wheels only, unpacked flat into site/),
# at the pin list's versions. With dependencies, so the closure is complete whatever the box has;
# numpy<2 for the stub (the list's numpy).
.venv/bin/python scripts/pins.py numpy soundfile "tritonclient[grpc]" python-rapidjson xxhash safetensors \
  fastapi uvicorn websockets pydantic httpx python-multipart soxr transformers tokenizers > "$p/PINS"
.venv/bin/pip download -q --only-binary=:all: --python-version "$box_python" --platform manylinux1_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --implementation cp -d "$work/whl" -r "$p/PINS" 2>&1 | grep -v "^WARNING: Location" || true
echo "nvidia-pytriton==$(.venv/bin/python -c 'from importlib.metadata import version; print(version("nvidia-pytriton"))')" \
  "# tritonserver 2.51.0 (bin/, lib/, backends/)" >> "$p/PINS"
# The box has these (and they are large): use its grpcio/protobuf, never a second torch.
rm -f "$work"/whl/grpcio-* "$work"/whl/protobuf-* "$work"/whl/torch-* "$work"/whl/nvidia_* "$work"/whl/triton-* "$work"/whl/hf_xet-*
for w in "$work"/whl/*.whl; do (cd "$p/site" && python3 -m zipfile -e "$w" . ); done
# Wheels that keep their code under NAME.data/{purelib,platlib} (tritonclient): move it up.
for d in "$p"/site/*.data; do
  for sub in purelib platlib; do [ -d "$d/$sub" ] && cp -r "$d/$sub/." "$p/site/"; done
  rm -rf "$d"
done
rm -f "$p"/site/tritonclient/perf_* 2>/dev/null || true
# Only the gRPC client is used here (the HTTP client would need gevent/aiohttp): keep the pack small.
[ -d "$p/site/tritonclient/grpc" ] || { echo "tritonclient.grpc missing from the pack"; exit 1; }

# 4. The environment: the stub imports from the base interpreter's site-packages, so a .pth there
#    prepends MOSS_TTS_STUB_PATH (the project's python_backends + this site/) when that variable is
#    set. It applies to every python3 started with it set, before PYTHONPATH: a script that runs
#    another tree's code (an A/B against an old commit) must source env.sh inside that tree, or it
#    imports the tree env.sh was sourced in (issue 34's sixth round lost an A/B to this;
#    bench_engine.py and bench_vocoder.py record the moss_tts they imported).
cat > "$p/env.sh" <<'ENV'
# source me on the device machine, from the project root
_pack="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export TRITONSERVER="$_pack/bin/tritonserver" TRITON_BACKENDS="$_pack/backends" PERF_ANALYZER="$_pack/bin/perf_analyzer"
export LD_LIBRARY_PATH="$_pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MOSS_TTS_STUB_PATH="$PWD/python_backends:$_pack/site" PYTHONPATH="$PWD:$PWD/python_backends:$_pack/site"
_base_site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo 'import os, sys; sys.path[:0] = [p for p in os.environ.get("MOSS_TTS_STUB_PATH", "").split(os.pathsep) if p and p not in sys.path]' > "$_base_site/moss_tts_stub_path.pth"
chmod +x "$TRITONSERVER" "$PERF_ANALYZER" "$_pack/backends/python/triton_python_backend_stub"
# What a measurement ran on: the pack's pins, and the box's own torch and Triton against the pin
# list (scripts/pins.py --stack: a mismatch in **bold**). MOSS_STACK carries that line into every
# results file (perf/h200_*.sh: gpu.txt, the run log; perf/bench_engine.py, bench_vocoder.py: meta).
echo "moss-pack: $(grep -o '^[^ #]*' "$_pack/PINS" | tr '\n' ' ')" >&2
export MOSS_STACK="$(python3 scripts/pins.py --stack) (python $(python3 -c 'import sys; print(sys.version.split()[0])'))"
echo "this box: $MOSS_STACK" >&2
unset _pack _base_site
ENV
mkdir -p .device; tar -C "$work" -cJf .device/triton-pack.tar.xz moss-pack
ls -la .device/triton-pack.tar.xz
