"""The pipeline's internal key: shared by every model of one server, never accepted forged."""

from __future__ import annotations

import json
import os
import stat
import threading

from moss_tts.vocoder import internal_key
from shared_state import SharedList


def test_environment_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(internal_key.ENV, "from-env")
    assert internal_key.internal_key(str(tmp_path)) == "from-env"
    assert not list(tmp_path.iterdir())


def test_models_of_one_server_share_one_file_key(monkeypatch, tmp_path):
    monkeypatch.delenv(internal_key.ENV, raising=False)
    found = SharedList()  # appended by 8 threads at once
    threads = [threading.Thread(target=lambda: found.append(internal_key.internal_key(str(tmp_path))))
               for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    keys = found.snapshot()
    assert len(set(keys)) == 1 and len(keys[0]) == 64
    [key_file] = tmp_path.iterdir()  # no scratch file left behind
    assert key_file.name == f"moss-tts-internal-key-{os.getppid()}"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_is_internal_needs_the_exact_key():
    key = "k" * 64
    assert internal_key.is_internal(json.dumps(internal_key.parameters(key)), key)
    for parameters in ("", "{}", "not json", "[1]", json.dumps({internal_key.PARAMETER: "k" * 63}),
                       json.dumps({internal_key.PARAMETER: 5})):
        assert not internal_key.is_internal(parameters, key), parameters
