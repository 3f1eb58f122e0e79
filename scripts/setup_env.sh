#!/usr/bin/env bash
# Idempotent environment set-up: .venv/ with the project's one pin list, requirements.txt. Safe to
# run twice. The image runs this same script (Dockerfile), so it serves with what `make test` tests.
#   scripts/setup_env.sh        the pins, the project (editable), tritonserver's stub (setup_triton.sh)
#   scripts/setup_env.sh pins   only .venv and the pins (the Dockerfile's cached first layer)
#   PYTHON                      .venv's interpreter (default: python3.11, the list's `# python` line)
set -euo pipefail
cd "$(dirname "$0")/.."
python_minor="$(python3 scripts/pins.py --fact python)"
PY=${PYTHON:-$(command -v "python$python_minor" || echo python3)}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
venv_minor="$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$venv_minor" != "$python_minor" ]; then
  echo "warning: .venv runs Python $venv_minor; CI and the image run $python_minor (requirements.txt), and" \
       "tests/test_image_stack.py skips. To match them: rm -rf .venv && PYTHON=python$python_minor make setup" >&2
fi
if ! .venv/bin/python -c "import sys; sys.exit(0 if open('requirements.txt').read() == open('.venv/.installed-requirements').read() else 1)" 2>/dev/null; then
  # uv installs the list: from its cache (~/.cache/uv) it links the unpacked wheels into .venv, ~10 s
  # for a fresh clone, where pip unpacked 5 GB of wheels every time (~3 min of a fresh clone's
  # `make test` on the 2-core machine). uv itself is pinned in the list and installed by pip first.
  # It reads pip's index settings (pip.conf, PIP_*) through scripts/uv_args.py; like pip it takes a
  # pinned version from whichever index has it; it compiles no bytecode (Python does on import).
  .venv/bin/pip install -q --disable-pip-version-check "$(python3 scripts/pins.py uv)"
  # shellcheck disable=SC2046  # one argument per line, none with spaces
  .venv/bin/python -m uv pip install -q --python .venv/bin/python $(.venv/bin/python scripts/uv_args.py) -r requirements.txt
  cp requirements.txt .venv/.installed-requirements
fi
if [ "${1:-}" = pins ]; then exit 0; fi
# The project itself, editable, so `python -m moss_tts…` and `python -m client…` run from .venv
# without PYTHONPATH. Offline and fast: no build isolation (torch already pulled setuptools into
# .venv), no dependencies (installed above); skipped while this checkout's pyproject.toml is the
# one installed.
if ! .venv/bin/python -c "
import json, sys
from importlib.metadata import distribution
from pathlib import Path
url = json.loads(distribution('moss-tts-triton').read_text('direct_url.json'))
same = Path('pyproject.toml').read_text() == Path('.venv/.installed-pyproject.toml').read_text()
sys.exit(0 if url['dir_info'].get('editable') and url['url'] == Path.cwd().as_uri() and same else 1)" 2>/dev/null; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  cp pyproject.toml .venv/.installed-pyproject.toml
fi
scripts/setup_triton.sh
