"""Saved voices: a speaker reference stored once as its codes, used by name or id afterwards.

A voice is one file `voice_<24 hex>.npz` in the voices directory: the reference codes
[frames, 12] int32 (what `ref_encoder` made of the upload, so a request never re-encodes it)
and its metadata (name, created, content hash, optional transcript). Both front ends read the
same directory: the OpenAI shim (`/v1/audio/voices`, `voice: "name"` or `{"id": ...}`) and the
gRPC client (`client.speak --voice`); either sends the codes as `REFERENCE_CODES`, and the
engine's prefix cache makes a voice used again cheap.

Crash- and concurrency-safe without a database: a voice file is written to a temporary name and
renamed into place (readers see all of it or nothing); a name is claimed by creating
`names/<sha256 of the name>` with O_EXCL, so two processes that save the same name at once get
one voice and one 409. A claim whose voice file is still missing after STALE_CLAIM_S (a crash
between the two steps) is stale and is taken over.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from moss_tts.contract.tensors import CODEBOOK_SIZE, FRAME_RATE, N_VQ

MAX_NAME_CHARS = 64
STALE_CLAIM_S = 30.0  # a name claim older than this whose voice file is missing was left by a crash
_ID = re.compile(r"^voice_[0-9a-f]{24}$")


class VoiceError(ValueError):
    """`status` is the HTTP status the shim answers with (400, 404, 409)."""

    def __init__(self, message: str, status: int, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    created_at: int
    content_hash: str  # sha256 of the uploaded audio bytes
    frames: int
    transcript: Optional[str] = None

    def public(self) -> dict:
        """OpenAI's voice object, plus our fields."""
        return {"id": self.id, "object": "audio.voice", "name": self.name, "created_at": self.created_at,
                "type": "audio_sample", "frames": self.frames, "seconds": round(self.frames / FRAME_RATE, 2),
                "content_hash": self.content_hash, "transcript": self.transcript}


class VoiceStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.names = self.directory / "names"
        self.names.mkdir(parents=True, exist_ok=True)

    def create(self, name: str, codes: np.ndarray, content_hash: str, transcript: Optional[str] = None) -> Voice:
        name = _check_name(name)
        codes = _check_codes(codes)
        voice = Voice(f"voice_{secrets.token_hex(12)}", name, int(time.time()), content_hash, int(codes.shape[0]),
                      transcript)
        self._claim(name, voice.id)
        try:
            self._write(voice, codes)
        except BaseException:
            self._release(name, voice.id)
            raise
        return voice

    def get(self, id_or_name: str) -> Optional[Voice]:
        """By id, else by name; None if there is no such voice."""
        if _ID.match(id_or_name):
            return self._read_meta(self._path(id_or_name))
        claim = self._claim_path(id_or_name)
        try:
            voice_id = claim.read_text().strip()
        except OSError:
            return None
        return self._read_meta(self._path(voice_id)) if _ID.match(voice_id) else None

    def codes(self, voice: Voice) -> np.ndarray:
        with np.load(self._path(voice.id)) as data:
            return data["codes"]

    def list(self) -> list[Voice]:
        voices = (self._read_meta(path) for path in sorted(self.directory.glob("voice_*.npz")))
        return sorted((v for v in voices if v is not None), key=lambda v: (v.created_at, v.id))

    def delete(self, voice_id: str) -> bool:
        voice = self.get(voice_id) if _ID.match(voice_id) else None
        if voice is None:
            return False
        self._path(voice.id).unlink(missing_ok=True)
        self._release(voice.name, voice.id)
        return True

    # --- files -------------------------------------------------------------------------------
    def _path(self, voice_id: str) -> Path:
        return self.directory / f"{voice_id}.npz"

    def _claim_path(self, name: str) -> Path:
        return self.names / hashlib.sha256(name.encode()).hexdigest()

    def _claim(self, name: str, voice_id: str) -> None:
        claim = self._claim_path(name)
        for _ in range(2):
            try:
                fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not self._is_stale(claim):
                    holder = _read(claim)
                    raise VoiceError(f"a voice named {name!r} exists ({holder}); delete it first or pick another "
                                     f"name", 409, "name") from None
                claim.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(voice_id)
            return
        raise VoiceError(f"could not claim the name {name!r}; retry", 409, "name")

    def _is_stale(self, claim: Path) -> bool:
        """A claim whose voice file is missing long after the claim was made: its writer died
        between the two steps. (A fresh claim without a file is a writer still at work.)"""
        holder = _read(claim)
        if _ID.match(holder) and self._path(holder).exists():
            return False
        try:
            return time.time() - claim.stat().st_mtime > STALE_CLAIM_S
        except OSError:
            return True  # gone meanwhile

    def _release(self, name: str, voice_id: str) -> None:
        claim = self._claim_path(name)
        try:
            if claim.read_text().strip() == voice_id:
                claim.unlink()
        except OSError:
            pass

    def _write(self, voice: Voice, codes: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, codes=codes, meta=np.array(json.dumps(asdict(voice))))
        tmp = self.directory / f".tmp-{voice.id}-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(voice.id))

    def _read_meta(self, path: Path) -> Optional[Voice]:
        try:
            with np.load(path) as data:
                return Voice(**json.loads(str(data["meta"])))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise VoiceError("name is required: a non-empty string", 400, "name")
    name = name.strip()
    if len(name) > MAX_NAME_CHARS:
        raise VoiceError(f"name has {len(name)} characters, the limit is {MAX_NAME_CHARS}", 400, "name")
    if _ID.match(name):
        raise VoiceError("name must not look like a voice id (voice_<24 hex>)", 400, "name")
    return name


def _check_codes(codes: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim == 3 and codes.shape[0] == 1:
        codes = codes[0]
    if codes.ndim != 2 or codes.shape[1] != N_VQ or codes.shape[0] == 0:
        raise VoiceError(f"reference codes must be [frames > 0, {N_VQ}], got {list(codes.shape)}: is the audio "
                         f"shorter than one frame (80 ms)?", 400, "audio_sample")
    if codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
        raise VoiceError(f"reference codes must lie in [0, {CODEBOOK_SIZE})", 400, "audio_sample")
    return codes.astype(np.int32)
