#!/usr/bin/env python3
"""uv's options for pip's index settings, one per line (scripts/setup_env.sh).

uv reads neither pip.conf nor PIP_* variables, so a machine whose packages come from extra indexes
or local wheel folders (the development machines: pip.conf's extra-index-url and find-links) would
send uv to pypi.org alone. This asks pip (`pip config list`: files and PIP_* variables) and prints
the same settings as uv options:
- pip's index (pypi.org unless set) first, then its extra indexes, as uv `--index`es in that order,
  with `--index-strategy unsafe-best-match`: pip takes a pinned version from whichever index has it,
  while uv by default stops at the first index that knows the package (the local mirror has torch,
  but not the pinned 2.11.0);
- pip then picks the wheel that fits the machine best among every index's files, uv only among the
  first index's that has the version: /opt/pypi lists soundfile 0.14.0 only as the py3-none-any
  wheel (no libsndfile inside), /opt/pypi-more and pypi.org the manylinux one. So the main index
  comes first, as pip's complete view;
- find-links as --find-links; PIP_NO_CACHE_DIR -> --no-cache.
Standard library only (and pip, which every venv has).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

PYPI = "https://pypi.org/simple"
SETTINGS = ("index-url", "extra-index-url", "find-links")  # a value may hold several, whitespace-separated
_LINE = re.compile(r"^[^.]*\.([\w-]+)=(.*)$")  # global.extra-index-url='a b' / :env:.find-links='/opt/wheels'


def uv_args(config_list: str, environ: dict[str, str]) -> list[str]:
    found: dict[str, list[str]] = {name: [] for name in SETTINGS}
    for line in config_list.splitlines():
        match = _LINE.match(line.strip())
        if not match or match.group(1) not in found or not match.group(2):
            continue
        for value in " ".join(shlex.split(match.group(2))).split():  # 'a b' (pip's quoting) or a b
            if value not in found[match.group(1)]:
                found[match.group(1)].append(value)
    indexes = (found["index-url"] or [PYPI]) + found["extra-index-url"]
    args = ["--index-strategy", "unsafe-best-match"]
    for index in dict.fromkeys(indexes):  # in order, once each
        args += ["--index", index]
    for links in found["find-links"]:
        args += ["--find-links", links]
    if environ.get("PIP_NO_CACHE_DIR", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-cache")
    return args


def main() -> int:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    print("\n".join(uv_args(listed, dict(os.environ))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
