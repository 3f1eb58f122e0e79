#!/usr/bin/env python3
"""uv's options for pip's index settings, one per line (scripts/setup_env.sh).

uv reads neither pip.conf nor PIP_* variables, so a machine whose packages come from extra indexes
or local wheel folders (the development machines: pip.conf's extra-index-url and find-links) would
send uv to pypi.org alone. This asks pip (`pip config list`: files and PIP_* variables) and prints
the same settings as uv options, plus `--index-strategy unsafe-best-match`: pip takes a pinned
version from whichever index has it, while uv by default stops at the first index that knows the
package (the local mirror has torch, but not the pinned 2.11.0). PIP_NO_CACHE_DIR -> --no-cache.
Standard library only (and pip, which every venv has).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

# pip setting -> uv option; a pip value may hold several, separated by whitespace
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}
_LINE = re.compile(r"^[^.]*\.([\w-]+)=(.*)$")  # global.extra-index-url='a b' / :env:.find-links='/opt/wheels'


def uv_args(config_list: str, environ: dict[str, str]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]
    seen = set()
    for line in config_list.splitlines():
        match = _LINE.match(line.strip())
        if not match or match.group(1) not in OPTIONS:
            continue
        for value in shlex.split(match.group(2))[0].split() if match.group(2) else ():
            if (match.group(1), value) not in seen:
                seen.add((match.group(1), value))
                args += [OPTIONS[match.group(1)], value]
    if environ.get("PIP_NO_CACHE_DIR", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-cache")
    return args


def main() -> int:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    print("\n".join(uv_args(listed, dict(os.environ))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
