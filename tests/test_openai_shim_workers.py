"""The shim's worker processes (client/openai_shim/workers.py): how many by default, and a shim of
two workers in front of the real tritonserver (tiny checkpoint, CPU): a voice saved through one
worker is spoken through the other, and SIGTERM lets the open stream of every worker finish
before all of them exit.

Which worker serves a request cannot be chosen: a keep-alive connection stays with the worker that
accepted it, and GET /health names that worker's pid, so a test opens connections until one lands
on the worker it wants and asks /health again after its request (the same worker served it).
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from client.openai_shim.workers import MAX_DEFAULT_WORKERS, cgroup_cpu_limit, default_workers, usable_cores
from shim_server import start_shim, stop_shim
from test_openai_shim import tone_wav

SPF = 3840  # samples per frame per channel at 48 kHz
FIXED = {"seed": 7, "ignore_stop": True, "sample_rate": 48000, "channels": 2, "response_format": "pcm"}


# --- how many workers ------------------------------------------------------------------------------

def test_the_cpu_limit_comes_from_cgroup_v2_or_v1(tmp_path, monkeypatch):
    assert cgroup_cpu_limit(tmp_path) is None  # no cgroup files: no limit
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) is None  # v1 without a quota
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("250000\n")
    assert cgroup_cpu_limit(tmp_path) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None  # v2 first: no limit there
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert usable_cores(tmp_path) == 2  # 1.5 cores of quota: two workers share them


def test_the_default_is_one_worker_per_core_up_to_a_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert default_workers(tmp_path) == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert default_workers(tmp_path) == MAX_DEFAULT_WORKERS


def test_each_workers_socket_joins_the_port_and_its_connections_get_tcp_nodelay():
    """Every worker binds the one port (SO_REUSEPORT); the sockets carry TCP_NODELAY (asyncio would
    leave Nagle on), and so does every connection accepted on them."""
    import select
    import socket

    import uvicorn

    from client.openai_shim.workers import worker_socket

    first = worker_socket(uvicorn.Config(app=None, host="127.0.0.1", port=0))
    second = worker_socket(uvicorn.Config(app=None, host="127.0.0.1", port=first.getsockname()[1]))
    with first, second, socket.create_connection(first.getsockname()):
        assert second.getsockname() == first.getsockname()
        ready, _, _ = select.select([first, second], [], [], 5)
        accepted, _ = ready[0].accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def listening_pids(port: int) -> list[int]:
    """The pid of every open file that is a listening TCP socket on `port` (one per socket per process)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        pids += [int(pid) for link in links if link.startswith("socket:[") and link[8:-1] in inodes]
    return pids


def test_zero_workers_is_refused(capsys):
    from client.openai_shim.__main__ import main

    assert main(["--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


# --- two workers in front of tritonserver ----------------------------------------------------------

def worker_of(client: httpx.Client) -> int:
    return client.get("/health").raise_for_status().json()["pid"]


def client_on(url: str, pid: int | None = None, not_pid: int | None = None) -> tuple[httpx.Client, int]:
    """A client whose one keep-alive connection is served by worker `pid` (None: any but `not_pid`)."""
    for _ in range(100):
        client = httpx.Client(base_url=url, timeout=120, limits=httpx.Limits(max_connections=1))
        served_by = worker_of(client)
        if served_by == pid or (pid is None and served_by != not_pid):
            return client, served_by
        client.close()
    raise AssertionError(f"100 connections, none served by worker {pid or f'other than {not_pid}'}")


def through(url: str, pid: int, request):
    """request(client) on a connection served by worker `pid`, which must still serve it after."""
    client, _ = client_on(url, pid)
    try:
        response = request(client)
        assert worker_of(client) == pid, "the connection moved to another worker mid-test"
    finally:
        client.close()
    return response


def speak(voice, frames: int = 6):
    return lambda client: client.post("/v1/audio/speech", json={"input": "Hello there.", "voice": voice,
                                                                "max_new_tokens": frames, **FIXED})


def save_voice(name: str):
    wav = tone_wav(1.0, 220.0)
    return lambda client: client.post("/v1/audio/voices", data={"name": name, "consent": "cons_test"},
                                      files={"audio_sample": ("ref.wav", wav, "audio/wav")})


@pytest.fixture
def two_workers(triton, tmp_path):
    shim = start_shim(triton.grpc_url, tmp_path / "shim.log", tmp_path, "--metrics-url", triton.metrics_url,
                      "--voices-dir", str(tmp_path / "voices"), workers=2)
    first, pid_a = client_on(shim.url)
    second, pid_b = client_on(shim.url, not_pid=pid_a)
    first.close(), second.close()
    yield shim, pid_a, pid_b
    stop_shim(shim)


@pytest.mark.triton
def test_connections_opened_at_once_spread_over_every_worker(triton, tmp_path):
    """One shared socket gave a burst of connections to whichever worker woke first (128 at once:
    109 / 10 / 7 / 2 over 4 workers); a socket per worker lets the kernel spread them by address.
    Only workers listen: a socket left in the parent would be given connections nobody accepts."""
    import json
    import socket
    from collections import Counter
    from urllib.parse import urlsplit

    shim = start_shim(triton.grpc_url, tmp_path / "shim.log", tmp_path, "--metrics-url", triton.metrics_url,
                      workers=4)
    try:
        port = urlsplit(shim.url).port
        # start_shim returns at the first worker's /health, when the last may not have been started
        # yet (CI: 3 of 4 listening); a socket is handed from the parent to its worker at the worker's
        # start. So wait for the state that must last: each of 4 workers holds one socket, the parent none.
        deadline = time.monotonic() + 30
        while True:
            workers = {int(pid) for pid in os.popen(f"ps -o pid= --ppid {shim.process.pid}").read().split()}
            listeners = listening_pids(port)
            settled = sorted(listeners) == sorted(set(listeners)) and set(listeners) <= workers and len(listeners) == 4
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert settled, (listeners, workers, shim.process.pid)
        connections = [socket.create_connection(("127.0.0.1", port)) for _ in range(64)]  # all, then ask
        served_by = Counter()
        for connection in connections:
            with connection:
                connection.sendall(b"GET /health HTTP/1.1\r\nHost: shim\r\nConnection: close\r\n\r\n")
                answer = b"".join(iter(lambda: connection.recv(65536), b""))
                served_by[json.loads(answer.split(b"\r\n\r\n", 1)[1])["pid"]] += 1
        assert set(served_by) == set(listeners) and max(served_by.values()) <= 32, served_by  # 16 each on average
    finally:
        stop_shim(shim)


@pytest.mark.triton
def test_a_voice_saved_through_one_worker_speaks_through_the_other(two_workers):
    shim, pid_a, pid_b = two_workers
    assert {pid_a, pid_b} <= {int(pid) for pid in os.popen(f"ps -o pid= --ppid {shim.process.pid}").read().split()}
    spoken = {}
    for creator, user in ((pid_a, pid_b), (pid_b, pid_a)):
        created = through(shim.url, creator, save_voice(f"voice-of-{creator}"))
        assert created.status_code == 200, created.text
        voice = created.json()
        for name_or_id in (voice["name"], {"id": voice["id"]}):
            response = through(shim.url, user, speak(name_or_id))
            assert response.status_code == 200, response.text
            assert len(response.content) == 6 * SPF * 2 * 2
            spoken.setdefault(voice["id"], set()).add(response.content)
        # the other worker lists it too, and the creator speaks it the same (one voice, one set of codes)
        listed = through(shim.url, user, lambda client: client.get("/v1/audio/voices")).json()["data"]
        assert voice["id"] in [v["id"] for v in listed]
        spoken[voice["id"]].add(through(shim.url, creator, speak(voice["name"])).content)
    assert all(len(audio) == 1 for audio in spoken.values()), "a voice sounded different on the two workers"
    deleted = through(shim.url, pid_a, lambda client: client.delete(f"/v1/audio/voices/{voice['id']}"))
    assert deleted.status_code == 200
    assert through(shim.url, pid_b, speak(voice["name"])).status_code == 400  # gone for every worker


@pytest.mark.triton
def test_first_audio_follows_the_headers_at_once_back_to_back(two_workers):
    """Without TCP_NODELAY, a response's first chunk (written right after its headers) waited for the
    client's delayed ACK, 40 ms, in every request sent right after the previous one ended."""
    import time

    shim, pid_a, _ = two_workers
    client, _ = client_on(shim.url, pid_a)
    gaps = []
    try:
        for _ in range(6):
            with client.stream("POST", "/v1/audio/speech", json={"input": "Hi.", "max_new_tokens": 2,
                                                                 **FIXED}) as response:
                headers_at = time.perf_counter()
                body = response.iter_raw()
                next(body)
                gaps.append(time.perf_counter() - headers_at)
                b"".join(body)
    finally:
        client.close()
    assert sorted(gaps)[len(gaps) // 2] < 0.02, f"headers -> first audio: {[round(g * 1000) for g in gaps]} ms"


@pytest.mark.triton
def test_sigterm_lets_every_workers_open_stream_finish_then_all_exit(two_workers, triton):
    shim, pid_a, pid_b = two_workers
    frames = 100
    streams = []
    for pid in (pid_a, pid_b):
        client, _ = client_on(shim.url, pid)
        response = client.send(client.build_request("POST", "/v1/audio/speech", json={
            "input": "Hello there.", "max_new_tokens": frames, **FIXED}), stream=True)
        pieces = response.iter_bytes()
        streams.append((client, response, pieces, next(pieces)))  # the first chunk is out: the stream is open
    streams_open = triton.wait_for_metrics(lambda m: m['moss_engine{stat="streams"}'] >= 2, timeout=10)
    assert streams_open['moss_engine{stat="streams"}'] >= 2, "a stream ended before the SIGTERM: make it longer"
    shim.process.send_signal(signal.SIGTERM)
    for client, response, pieces, first in streams:
        assert response.status_code == 200 and len(first + b"".join(pieces)) == frames * SPF * 2 * 2
        response.close(), client.close()
    assert shim.process.wait(timeout=30) == 0
    for pid in (pid_a, pid_b):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
