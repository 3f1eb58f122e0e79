"""SessionClaims: which `moss_tts` instance of this server holds each open text session.

A text session lives in one instance's process: its voice and its vocoder sequence. With several
instances (`configs/replicas_*`) Triton hands each request to whichever instance is free, and
nothing routes a session's later requests to the one that holds it (the sequence batcher would,
but on the public entry it would make every request carry a correlation id). Unchecked, such a
request would open a second session on the other instance: another voice, and audio that does
not continue the first. So an instance claims a session id when it opens the session (a file
created exclusively in a directory that the instances of one tritonserver share, named by its
pid), a request for a session another instance claimed is relayed to that instance
(relay.py), and the claim goes when the session closes. A claim of this instance's own name left by
an earlier stub of it (restarted by Triton) is taken over. No Triton import.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import tempfile
import time
from pathlib import Path

from ..contract.errors import ErrorKind, ServingError

log = logging.getLogger(__name__)


class SessionHeldElsewhere(ServingError):
    def __init__(self, session_id: str, owner: str, me: str) -> None:
        self.owner = owner  # "" while the holder has not written its claim yet
        super().__init__(
            f"text session {session_id!r} is held by {owner or 'an instance opening it'}, another moss_tts "
            f"instance of this server, and this request reached {me}", ErrorKind.UNAVAILABLE)


def server_directory() -> Path:
    """The claims directory of the tritonserver this stub belongs to (its parent process)."""
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    return base / f"moss-tts-sessions-{os.getppid()}"


# Claim files hold an instance name, which also names the instance's relay socket.
_INSTANCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def private_directory(directory: Path) -> None:
    """Make `directory` (0700) if missing, and check it (check_private)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(directory)


def check_private(directory: Path) -> None:
    """The directory's name is predictable (/dev/shm, tritonserver's pid): refuse one that another
    user made, since claims and relayed requests go through it. One of ours left by an earlier
    server with the same pid (made before directories were private) is made private."""
    info = os.lstat(directory)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o077:
        os.chmod(directory, 0o700)
        info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{directory} must be a directory of user {os.getuid()} with mode 0700 (found uid "
                              f"{info.st_uid}, mode {oct(info.st_mode & 0o777)}); remove it and restart")


class SessionClaims:
    def __init__(self, directory: Path, owner: str) -> None:
        if not _INSTANCE_NAME.fullmatch(owner):
            raise ValueError(f"instance name {owner!r}: letters, digits, '_', '-' and '.' only")
        self.directory, self.owner = Path(directory), owner
        private_directory(self.directory)  # the relay's sockets live here too
        self._mine: set[str] = set()  # session ids this instance claimed and holds

    def _path(self, session_id: str) -> Path:
        # Hashed: a session id is any client string of up to 128 characters.
        return self.directory / hashlib.sha256(session_id.encode()).hexdigest()[:40]

    def claim(self, session_id: str) -> None:
        """Claim `session_id` for this instance; SessionHeldElsewhere if another holds it."""
        path = self._path(session_id)
        for _ in range(3):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileNotFoundError:  # the directory went with another instance's release_all
                private_directory(self.directory)
                continue
            except FileExistsError:
                owner = self._owner(path)
                if owner is None:  # released in between
                    continue
                if owner != self.owner:
                    raise SessionHeldElsewhere(session_id, owner, self.owner) from None
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(self.owner)
            # Created now, or left by an earlier stub of this instance: ours.
            self._mine.add(session_id)
            return
        raise ServingError(f"text session {session_id!r}: could not claim it (claims directory {self.directory} "
                           f"keeps changing)", ErrorKind.UNAVAILABLE)

    @staticmethod
    def _owner(path: Path):
        """The claim's owner; "" while its creator has not written it yet; None once it is gone."""
        for _ in range(3):
            try:
                owner = path.read_text()
            except FileNotFoundError:
                return None
            if owner:
                # Only a well-formed name counts: it becomes a socket path (relay.py).
                return owner if _INSTANCE_NAME.fullmatch(owner) else ""
            time.sleep(0.002)
        return ""

    def release(self, session_id: str) -> None:
        if session_id in self._mine:
            self._mine.discard(session_id)
            try:
                self._path(session_id).unlink()
            except FileNotFoundError:
                pass

    def release_all(self) -> None:
        """Drop every claim of this instance, and the directory once no instance has any."""
        for session_id in list(self._mine):
            self.release(session_id)
        try:
            self.directory.rmdir()
        except OSError:  # another instance still holds claims (or removed it already)
            pass
