#!/usr/bin/env python3
"""The project's one pin list, requirements.txt, for the environments that take only part of it.

`make setup` (scripts/setup_env.sh) installs the whole list into .venv, and the image runs that same
script. The shim image and the H200 pack need a subset: they name their packages and take the
versions from here, so no file but requirements.txt holds a package version
(tests/test_image_stack.py checks it).

    python3 scripts/pins.py numpy 'tritonclient[grpc]'   ->  numpy==1.26.4
                                                             tritonclient[grpc]==2.51.0
    python3 scripts/pins.py --fact python                ->  3.11 (the list's `# python 3.11` line)
    python3 scripts/pins.py --stack                      ->  stack: torch 2.11.0+cu130, triton 3.6.0: as pinned
        (this interpreter's torch and triton against the list; a mismatch is printed in **bold**, for the
        H200 box, whose torch cannot be replaced: the device pack's env.sh and perf/h200_*.sh record it)

Standard library only: the Dockerfile runs it before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PIN_LIST = Path(__file__).resolve().parents[1] / "requirements.txt"
# Facts the list states for every environment, one `# <fact> <value>` line each.
FACTS = ("python", "torch-cuda", "nvidia-driver")
_PIN = re.compile(r"([A-Za-z0-9][\w.-]*)(\[[\w,.-]+\])?==([^\s;#]+)")
_FACT = re.compile(rf"# ({'|'.join(FACTS)}) (\S+)")
_REQUIREMENT = re.compile(r"([A-Za-z0-9][\w.-]*)(\[[\w,.-]+\])?")
STACK = ("torch", "triton")  # what every GPU figure depends on, and the H200 box brings its own of


def canonical(name: str) -> str:
    """PyPI's normalized name: 'Python_Multipart' -> 'python-multipart'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """{canonical name: version} of every `name[extras]==version` line."""
    pins = {}
    for line in text.splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[canonical(match.group(1))] = match.group(3)
    return pins


def read_facts(text: str) -> dict[str, str]:
    """{'python': '3.11', 'torch-cuda': '13.0', 'nvidia-driver': '580.65.06'}."""
    facts = dict(m.groups() for m in map(_FACT.fullmatch, (line.strip() for line in text.splitlines())) if m)
    missing = [fact for fact in FACTS if fact not in facts]
    if missing:
        raise KeyError(f"requirements.txt lacks the line(s) {', '.join(f'# {fact} <value>' for fact in missing)}")
    return facts


def pinned(requirements: list[str], text: str) -> list[str]:
    """['tritonclient[grpc]'] -> ['tritonclient[grpc]==2.51.0']: the caller's extras, the list's
    version. KeyError naming every requirement the list does not pin."""
    pins, lines, unpinned = read_pins(text), [], []
    for requirement in requirements:
        match = _REQUIREMENT.fullmatch(requirement)
        if not match or canonical(match.group(1)) not in pins:
            unpinned.append(requirement)
            continue
        lines.append(f"{requirement}=={pins[canonical(match.group(1))]}")
    if unpinned:
        raise KeyError(f"not pinned (name==version) in requirements.txt: {' '.join(unpinned)}")
    return lines


def stack_line(text: str, installed) -> str:
    """One line: the installed version of each STACK package (`installed(name)` -> version or None)
    against the list; any mismatch in **bold**. A local build label (+cu130, +cpu) is not a mismatch."""
    pins, parts, wrong = read_pins(text), [], []
    for name in STACK:
        have = installed(name)
        parts.append(f"{name} {have or 'not installed'}")
        if (have or "").split("+")[0] != pins[name]:
            wrong.append(f"{name} {have or 'not installed'} (requirements.txt: {pins[name]})")
    if wrong:
        return f"stack: **MISMATCH with the pins: {', '.join(wrong)}**"
    return f"stack: {', '.join(parts)}: as pinned"


def _installed(name: str):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    text = PIN_LIST.read_text()
    try:
        if argv[:1] == ["--fact"] and len(argv) == 2 and argv[1] in FACTS:
            print(read_facts(text)[argv[1]])
        elif argv == ["--stack"]:
            print(stack_line(text, _installed))
        elif argv and not argv[0].startswith("-"):
            print("\n".join(pinned(argv, text)))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except KeyError as error:
        print(f"scripts/pins.py: {error.args[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
