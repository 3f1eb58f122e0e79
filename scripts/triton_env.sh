#!/usr/bin/env bash
# Source this: exports how to run the tritonserver 2.51.0 shipped in the nvidia-pytriton wheel.
#   TRITONSERVER      the server binary
#   TRITON_BACKENDS   --backend-directory (python backend + the stub for our Python)
#   LD_LIBRARY_PATH   the wheel's bundled libraries + the libpython the stub embeds
#   MOSS_TTS_STUB_PATH  sys.path entries the stub's interpreter prepends (see setup_triton.sh)
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_site="$("$_root/.venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
_base="$("$_root/.venv/bin/python" -c 'import sys; print(sys.base_prefix)')"
export TRITONSERVER="$_site/pytriton/tritonserver/bin/tritonserver"
export TRITON_BACKENDS="$_site/pytriton/tritonserver/backends"
export PERF_ANALYZER="$_root/.venv/bin/perf_analyzer"
export LD_LIBRARY_PATH="$_site/nvidia_pytriton.libs:$_base/lib:$_site/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MOSS_TTS_STUB_PATH="$_root/python_backends:$_site"
unset _root _site _base
