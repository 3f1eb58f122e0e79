#!/usr/bin/env bash
# Idempotent: make the pip-installed tritonserver able to run our Python models.
set -euo pipefail
cd "$(dirname "$0")/.."
site="$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')"
ver="$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
backend="$site/pytriton/tritonserver/backends/python"
# 1. The wheel ships one stub per Python version but the backend only looks in its own dir.
if [ ! -x "$backend/triton_python_backend_stub" ]; then
  cp "$site/pytriton/tritonserver/python_backend_stubs/$ver/triton_python_backend_stub" "$backend/"
fi
# 2. The stub embeds the base interpreter with an isolated config: it ignores PYTHONPATH and
#    imports numpy (which must be <2 for BYTES tensors) from the base site-packages before our
#    model.py runs. A .pth line there prepends $MOSS_TTS_STUB_PATH (our venv) when, and only
#    when, that variable is set, i.e. in servers started through scripts/triton_env.sh.
base_site="$(.venv/bin/python -c 'import sys, sysconfig; print(sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["purelib"])')"
pth='import os, sys; sys.path[:0] = [p for p in os.environ.get("MOSS_TTS_STUB_PATH", "").split(os.pathsep) if p and p not in sys.path]'
if [ "$(cat "$base_site/moss_tts_stub_path.pth" 2>/dev/null)" != "$pth" ]; then
  echo "$pth" > "$base_site/moss_tts_stub_path.pth"
fi
# 3. perf_analyzer needs libb64 (Debian) at run time.
if ! ldconfig -p | grep -q 'libb64.so.0d'; then
  if command -v apt-get >/dev/null; then
    (apt-get install -y -q libb64-0d >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q libb64-0d >/dev/null)) \
      || echo "warning: could not install libb64-0d; perf_analyzer will not run" >&2
  fi
fi
