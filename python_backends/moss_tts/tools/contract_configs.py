"""Write the inputs of the model repository's configs from the contract.

    python -m moss_tts.tools.contract_configs [--repository model_repository] [--check]

The `input [...]` blocks of moss_tts/config.pbtxt and moss_tts_codes/config.pbtxt, and the
ensemble's input_map into moss_tts, are generated from moss_tts.contract.tensors (so from the
sampling options declared in contract/sampling_options.py too); the multi-GPU layouts are then
generated from config.pbtxt (placement_configs.py). tests/test_contract.py checks both are up to
date. `--check` exits 1 when a checked-in file differs from what this would write.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..contract.tensors import ENSEMBLE_FILLED, MOSS_TTS_CODES_INPUTS, MOSS_TTS_INPUTS, Tensor
from . import placement_configs

_INPUT_BLOCK = re.compile(r"^input \[\n.*?^\]\n", re.M | re.S)
# The input_map lines of the ensemble's moss_tts step.
_MOSS_TTS_MAPS = re.compile(r'(model_name: "moss_tts"\n\s+model_version: -1\n)((?:[ \t]+input_map .*\n)+)')
GENERATED = {"moss_tts": MOSS_TTS_INPUTS, "moss_tts_codes": MOSS_TTS_CODES_INPUTS}


def input_line(tensor: Tensor) -> str:
    dtype = "STRING" if tensor.dtype == "BYTES" else tensor.dtype
    dims = ", ".join(str(d) for d in tensor.dims)
    optional = ", optional: true" if tensor.optional else ""
    return f'  {{ name: "{tensor.name}", data_type: TYPE_{dtype}, dims: [ {dims} ]{optional} }}'


def input_block(tensors) -> str:
    return "input [\n" + ",\n".join(input_line(t) for t in tensors) + "\n]\n"


def ensemble_maps(indent: str) -> str:
    """The codes ensemble's input_map into moss_tts: each of its inputs, and what it fills itself."""
    passed = {t.name for t in MOSS_TTS_CODES_INPUTS}
    maps = [(t.name, ENSEMBLE_FILLED.get(t.name, t.name)) for t in MOSS_TTS_INPUTS
            if t.name in ENSEMBLE_FILLED or (t.name in passed and t.name != "REFERENCE_AUDIO")]
    return "".join(f'{indent}input_map {{ key: "{key}" value: "{value}" }}\n' for key, value in maps)


def render(model: str, text: str) -> str:
    """config.pbtxt text with its generated parts written anew."""
    if len(_INPUT_BLOCK.findall(text)) != 1:
        raise ValueError(f"{model}/config.pbtxt must have exactly one `input [` ... `]` block")
    text = _INPUT_BLOCK.sub(lambda _: input_block(GENERATED[model]), text)
    if model == "moss_tts_codes":
        match = _MOSS_TTS_MAPS.search(text)
        if match is None:
            raise ValueError("moss_tts_codes/config.pbtxt must have a moss_tts step with input_map lines")
        indent = re.match(r"[ \t]*", match.group(2)).group(0)
        text = text[:match.start(2)] + ensemble_maps(indent) + text[match.end(2):]
    return text


def expected_files(repository: Path) -> dict[Path, str]:
    return {repository / model / "config.pbtxt": render(model, (repository / model / "config.pbtxt").read_text())
            for model in GENERATED}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    stale = [path for path, text in expected_files(args.repository).items() if path.read_text() != text]
    for path in stale:
        print(f"{path}: {'differs from the contract (regenerate)' if args.check else 'written'}")
        if not args.check:
            path.write_text(expected_files(args.repository)[path])
    layouts = placement_configs.main(["--repository", str(args.repository), *(["--check"] if args.check else [])])
    return 1 if args.check and (stale or layouts) else 0


if __name__ == "__main__":
    sys.exit(main())
