"""deploy/k8s: every manifest is a valid Kubernetes 1.31 object (offline schemas), agrees with the
repository (ports, paths, flags, thread pool, drain arithmetic, image pins), and with the real
server (liveness and startup paths, the readiness command, every metric the autoscaler reads).
Also the per-stream balancing it relies on: the shim's channel spreads RPCs over every address
of a dns:/// (or ipv4:) name."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from concurrent import futures
from pathlib import Path

import pytest
import yaml

from shared_state import SharedCounter

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.31.0"
MARGIN_S = 5  # the least slack a grace period must leave after the drain and the exit timeout
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


# ---------------------------------------------------------------------------------------------
# Helpers: the objects, one container, its --flags


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def objects() -> dict[tuple[str, str], dict]:
    """{(kind, name): object} over every manifest."""
    found = {}
    for path in MANIFESTS:
        for doc in documents(path):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, f"{key} defined twice"
            found[key] = doc
    return found


def container(deployment: str, name: str) -> dict:
    pod = objects()[("Deployment", deployment)]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def pod_spec(deployment: str) -> dict:
    return objects()[("Deployment", deployment)]["spec"]["template"]["spec"]


def flags(args: list[str]) -> dict[str, str]:
    """["--a=1", "--b=x", "--c"] -> {"a": "1", "b": "x", "c": None} (the manifests write every flag
    as --key=value, or --key alone for a switch that takes no value)."""
    out = {}
    for arg in args:
        match = re.fullmatch(r"--([\w-]+)(?:=(.*))?", arg)
        assert match, f"{arg!r}: write flags as --key=value"
        out[match.group(1)] = match.group(2)
    return out


def triton_flags() -> dict[str, str]:
    tritonserver = container("moss-tts-triton", "tritonserver")
    # The image's entrypoint must run (no `command`), and it starts tritonserver from the args.
    assert "command" not in tritonserver and tritonserver["args"][0] == "tritonserver"
    return flags(tritonserver["args"][1:])


def module_argv(command: list[str], module: str) -> list[str]:
    """The arguments after `python3 -m module` in an exec command."""
    assert command[:3] == ["python3", "-m", module], command
    return command[3:]


def container_ports(deployment: str, name: str) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(deployment, name)["ports"]}


def serve_sh_default(variable: str) -> int:
    return int(re.search(rf"\${{{variable}:-(\d+)}}", (ROOT / "scripts" / "serve.sh").read_text()).group(1))


def dockerfile_stages() -> list[str]:
    """The Dockerfile's build stages, in order (the last one is the default target: tritonserver)."""
    return re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.M)[1:]


def adapter_rules() -> list[dict]:
    config_map = objects()[("ConfigMap", "moss-tts-adapter-rules")]
    return yaml.safe_load(config_map["data"]["config.yaml"])["rules"]


def readiness_argv() -> list[str]:
    return module_argv(container("moss-tts-triton", "tritonserver")["readinessProbe"]["exec"]["command"],
                       "client.healthcheck")


def liveness_argv() -> list[str]:
    return module_argv(container("moss-tts-triton", "tritonserver")["livenessProbe"]["exec"]["command"],
                       "client.healthcheck")


def drain_argv() -> list[str]:
    return module_argv(container("moss-tts-triton", "tritonserver")["lifecycle"]["preStop"]["exec"]["command"],
                       "client.drain")


# ---------------------------------------------------------------------------------------------
# (a) Schemas


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_every_manifest_validates_strictly_against_kubernetes_1_31(path):
    import kubernetes_validate

    for doc in documents(path):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert "namespace" not in doc["metadata"], f"{path.name}: namespace-agnostic, apply with -n"


def test_kustomization_lists_every_manifest_of_its_directory():
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


# ---------------------------------------------------------------------------------------------
# (b) The manifests against the repository


def test_ports_match_serve_sh_and_the_shim_defaults():
    from client.openai_shim.config import ShimConfig

    ports = container_ports("moss-tts-triton", "tritonserver")
    assert ports == {"http": serve_sh_default("HTTP_PORT"), "grpc": serve_sh_default("GRPC_PORT"),
                     "metrics": serve_sh_default("METRICS_PORT")}
    args = triton_flags()
    assert [int(args[f"{name}-port"]) for name in ports] == list(ports.values())
    annotations = objects()[("Deployment", "moss-tts-triton")]["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    shim_port = container_ports("moss-tts-shim", "shim")["http"]
    assert shim_port == ShimConfig().port == serve_sh_default("SHIM_PORT")
    assert int(flags(container("moss-tts-shim", "shim")["args"])["port"]) == shim_port


def test_triton_runs_the_dockerfile_image_layout_and_serve_sh_settings():
    triton = dockerfile_stages()[-1]
    image_args = re.search(r"^CMD (\[.*\])$", triton, re.M).group(1)
    image_repository = re.search(r"--model-repository=([^\"]+)", image_args).group(1)
    serve_pool = re.search(r"thread-pool-size=(\d+)", (ROOT / "scripts" / "serve.sh").read_text()).group(1)
    args, tritonserver = triton_flags(), container("moss-tts-triton", "tritonserver")
    assert args["model-repository"] == image_repository
    assert args["backend-config"] == f"python,thread-pool-size={serve_pool}"
    # the configs are complete: no auto-complete stub per model, wherever tritonserver starts
    assert "disable-auto-complete-config" in args and "--disable-auto-complete-config" in image_args
    assert "--disable-auto-complete-config" in (ROOT / "scripts" / "serve.sh").read_text()
    assert tritonserver["workingDir"] == re.findall(r"^WORKDIR (\S+)$", triton, re.M)[-1]
    env = {e["name"]: e for e in tritonserver["env"]}
    mounts = {m["mountPath"]: m for m in tritonserver["volumeMounts"]}
    for name in ("MOSS_TTS_MODEL_DIR", "MOSS_TTS_CODEC_DIR"):
        assert re.search(rf"\b{name}={re.escape(env[name]['value'])}\b", triton), f"{name} differs from the Dockerfile"
        assert any(env[name]["value"].startswith(path + "/") and m.get("readOnly") for path, m in mounts.items())
    assert mounts[image_repository]["subPath"] == "model_repository" and mounts[image_repository]["readOnly"]
    assert env["MOSS_TTS_INTERNAL_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "moss-tts-internal-key"
    assert tritonserver["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_every_tritonserver_flag_exists_in_2_51():
    helped = subprocess.run(["bash", "-c", 'source scripts/triton_env.sh && "$TRITONSERVER" --help'], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    known = set(re.findall(r"^\s+--([\w-]+)", helped.stdout + helped.stderr, re.M))
    assert len(known) > 50, helped.stderr[-2000:]
    assert set(triton_flags()) <= known, set(triton_flags()) - known


def test_probes_name_real_paths_modules_and_flags(monkeypatch):
    import client.drain
    import client.healthcheck
    from client.openai_shim.__main__ import parse_args

    tritonserver = container("moss-tts-triton", "tritonserver")
    assert tritonserver["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    # The readiness and liveness commands parse with the healthcheck's own argparse (diagnose is
    # not run here).
    seen = []
    monkeypatch.setattr(client.healthcheck, "diagnose", lambda *args: seen.append(args))  # -> None: healthy
    assert client.healthcheck.main(readiness_argv()) == 0
    assert client.healthcheck.main(liveness_argv()) == 0
    ports = container_ports("moss-tts-triton", "tritonserver")
    for (url, metrics_url, with_probe, timeout, liveness), probe, is_liveness in zip(
            seen, ("readinessProbe", "livenessProbe"), (False, True)):
        assert (url, metrics_url) == (f"127.0.0.1:{ports['grpc']}", f"http://127.0.0.1:{ports['metrics']}/metrics")
        assert not with_probe, f"{probe} must not synthesize audio every few seconds"
        assert liveness is is_liveness, probe
        assert timeout * 2 < tritonserver[probe]["timeoutSeconds"]  # live()/ready() + heartbeat check
    # A heartbeat stops after 30-60 s of one stuck unit; liveness restarts only after 60 s more
    # of failures on end, so no slow step under load restarts a pod.
    liveness = tritonserver["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    drain = client.drain.parse_args(drain_argv())
    assert drain.metrics_url == f"http://127.0.0.1:{ports['metrics']}/metrics"
    shim = parse_args(container("moss-tts-shim", "shim")["args"])
    assert shim.metrics_url == "" and shim.triton_url.startswith("dns:///")
    assert str(shim.voices_dir) in {m["mountPath"] for m in container("moss-tts-shim", "shim")["volumeMounts"]}


def test_grace_periods_cover_the_drain_and_the_exit_timeout():
    from client.drain import parse_args as parse_drain_args
    from client.openai_shim import triton_stream
    from client.openai_shim.workers import GRACEFUL_SHUTDOWN_S

    drain = parse_drain_args(drain_argv())
    exit_timeout_s = int(triton_flags()["exit-timeout-secs"])
    assert drain.budget + exit_timeout_s + MARGIN_S <= pod_spec("moss-tts-triton")["terminationGracePeriodSeconds"]
    # --settle: a client's connection lives up to the max age (+10% jitter), then it resolves again.
    resolve_s = dict(triton_stream.BALANCED_CHANNEL_ARGS)["grpc.dns_min_time_between_resolutions_ms"] / 1000
    assert int(triton_flags()["grpc-max-connection-age"]) / 1000 * 1.1 + resolve_s <= drain.settle < drain.budget
    shim_pre_stop = container("moss-tts-shim", "shim")["lifecycle"]["preStop"]["exec"]["command"]
    assert shim_pre_stop[0] == "sleep"
    assert (int(shim_pre_stop[1]) + GRACEFUL_SHUTDOWN_S + MARGIN_S
            <= pod_spec("moss-tts-shim")["terminationGracePeriodSeconds"])


def test_services_and_autoscaler_point_at_the_triton_pods():
    from client.openai_shim.__main__ import parse_args

    found = objects()
    pod_labels = found[("Deployment", "moss-tts-triton")]["spec"]["template"]["metadata"]["labels"]
    ports = container_ports("moss-tts-triton", "tritonserver")
    for name in ("moss-tts-triton", "moss-tts-triton-grpc"):
        service = found[("Service", name)]["spec"]
        assert service["selector"].items() <= pod_labels.items()
        assert all(p["targetPort"] in ports and p["port"] == ports[p["targetPort"]] for p in service["ports"])
    headless = found[("Service", "moss-tts-triton-grpc")]["spec"]
    assert headless["clusterIP"] == "None" and not headless.get("publishNotReadyAddresses")
    shim_url = parse_args(container("moss-tts-shim", "shim")["args"]).triton_url
    assert shim_url == f"dns:///moss-tts-triton-grpc:{headless['ports'][0]['port']}"
    hpa = found[("HorizontalPodAutoscaler", "moss-tts-triton")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "moss-tts-triton"}
    assert "replicas" not in found[("Deployment", "moss-tts-triton")]["spec"], "the HPA owns the replica count"
    served = {rule["name"]["as"] for rule in adapter_rules()}
    assert {m["pods"]["metric"]["name"] for m in hpa["metrics"]} <= served
    pdb = found[("PodDisruptionBudget", "moss-tts-triton")]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()


def test_the_shim_image_pins_requirements_and_needs_no_model_stack():
    # Its packages at requirements.txt's versions, through scripts/pins.py (tests/test_image_stack.py).
    shim_stage = next(stage for stage in dockerfile_stages() if stage.split()[2] == "shim")
    assert "scripts/pins.py" in shim_stage
    assert re.findall(r"^WORKDIR (\S+)$", shim_stage, re.M) == [container("moss-tts-shim", "shim")["workingDir"]]
    blocked = ("torch", "transformers", "tokenizers", "safetensors", "triton", "xxhash")
    code = (f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
            "import client.openai_shim.app, client.openai_shim.__main__, client.voices")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(ROOT / "python_backends"), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.parametrize("cgroup", ["v1", "v2"])
def test_the_shims_workers_follow_its_cpu_limit(cgroup, tmp_path, monkeypatch):
    """No --workers in the manifest: the shim reads the quota that limits.cpu becomes in its cgroup."""
    from client.openai_shim.__main__ import parse_args
    from client.openai_shim.workers import default_workers

    shim = container("moss-tts-shim", "shim")
    assert parse_args(shim["args"]).workers is None
    limit = int(shim["resources"]["limits"]["cpu"])
    assert 1 < limit <= int(shim["resources"]["requests"]["cpu"]) * 2
    period = 100_000  # what the kubelet writes: quota = cores x period
    if cgroup == "v2":
        (tmp_path / "cpu.max").write_text(f"{limit * period} {period}\n")
    else:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{limit * period}\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))  # the node's cores
    assert default_workers(tmp_path) == limit


# ---------------------------------------------------------------------------------------------
# Per-stream balancing: the shim's channel


def test_resolver_urls_get_round_robin_other_urls_keep_grpc_default():
    from client.openai_shim.triton_stream import CHANNEL_ARGS, channel_args

    for url in ("dns:///moss-tts-triton-grpc:8001", "ipv4:10.0.0.1:8001,10.0.0.2:8001"):
        assert dict(channel_args(url))["grpc.lb_policy_name"] == "round_robin"
    assert channel_args("localhost:8001") == CHANNEL_ARGS


class CountingServer:
    """A fake tritonserver gRPC endpoint that only counts ServerReady/ModelReady calls, on its pool's
    threads while the test reads the count: a SharedCounter."""

    def __init__(self):
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        fake = self
        self.calls = SharedCounter()

        class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
            def ServerReady(self, request, context):
                fake.calls.add()
                return service_pb2.ServerReadyResponse(ready=True)

            def ModelReady(self, request, context):
                fake.calls.add()
                return service_pb2.ModelReadyResponse(ready=True)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_the_shim_channel_spreads_rpcs_over_every_address_of_a_name():
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from client.openai_shim.triton_stream import CHANNEL_ARGS, TritonSpeech

    servers = [CountingServer(), CountingServer()]
    url = "ipv4:" + ",".join(f"127.0.0.1:{s.port}" for s in servers)
    try:
        async def ask(n: int) -> list:
            speech = TritonSpeech(url, "moss_tts", 5.0)
            problems = [await speech.problem(5.0) for _ in range(n)]
            await speech.close()
            return problems

        assert asyncio.run(ask(10)) == [None] * 10  # 20 RPCs
        assert all(s.calls.value() >= 8 for s in servers), [s.calls.value() for s in servers]
        # gRPC's default policy (what a plain host:port or a ClusterIP gets): one connection, one server.
        for s in servers:
            s.calls.reset()
        with grpc.insecure_channel(url, options=CHANNEL_ARGS) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(10):
                stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=5)
        assert sorted(s.calls.value() for s in servers) == [0, 10]
    finally:
        for s in servers:
            s.server.stop(0)


def test_the_shim_wants_a_metrics_url_with_a_resolver_url(capsys):
    from client.openai_shim.__main__ import main

    assert main(["--triton-url", "dns:///moss-tts-triton-grpc:8001"]) == 2
    assert "--metrics-url" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The preStop drain


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_drain_waits_out_the_settle_time_then_the_open_streams():
    from client.drain import wait_for_drain

    clock = FakeClock()
    streams = lambda: 3 if clock.now < 55 else 0  # noqa: E731
    assert wait_for_drain(streams, 40, 150, clock=clock, sleep=clock.sleep) == "drained after 55 s"
    clock = FakeClock()
    assert wait_for_drain(lambda: 0, 40, 150, clock=clock, sleep=clock.sleep) == "drained after 40 s"


def test_drain_stops_at_its_budget_or_without_metrics():
    from client.drain import count_streams, wait_for_drain

    clock = FakeClock()
    assert wait_for_drain(lambda: 2, 40, 150, clock=clock, sleep=clock.sleep).startswith("2 streams still open")
    assert clock.now == 150
    # Unreadable metrics are "unknown": the settle time is waited out, then 5 failures in a row end it.
    clock = FakeClock()
    assert wait_for_drain(lambda: None, 40, 150, clock=clock, sleep=clock.sleep).startswith("metrics unreadable")
    assert clock.now == 40
    # One slow read in the middle of a drain does not end it.
    clock = FakeClock()
    flaky = lambda: None if clock.now == 45 else (3 if clock.now < 60 else 0)  # noqa: E731
    assert wait_for_drain(flaky, 40, 150, clock=clock, sleep=clock.sleep) == "drained after 60 s"
    clock = FakeClock()
    assert wait_for_drain(lambda: None, 200, 150, clock=clock, sleep=clock.sleep).startswith(
        "an unknown number of streams still open")
    text = ('moss_engine{model_instance="moss_tts_0_0",stat="streams"} 3\n'
            'moss_engine{model_instance="moss_tts_1_0",stat="streams"} 2\nmoss_engine{stat="running"} 9\n')
    assert count_streams(text) == 5 and count_streams("") == 0


# ---------------------------------------------------------------------------------------------
# (c) Against the real server


def localize(arg: str, triton) -> str:
    """A probe argument with the pod's ports (8000/8001/8002 on 127.0.0.1) turned into the test server's."""
    ports = container_ports("moss-tts-triton", "tritonserver")
    real = {ports["http"]: triton.http_url, ports["grpc"]: triton.grpc_url,
            ports["metrics"]: triton.metrics_url.removeprefix("http://").split("/")[0]}
    return re.sub(r"127\.0\.0\.1:(\d+)", lambda m: real[int(m.group(1))], arg)


@pytest.mark.triton
def test_the_startup_path_answers_on_the_http_port(triton):
    path = container("moss-tts-triton", "tritonserver")["startupProbe"]["httpGet"]["path"]
    assert urllib.request.urlopen(f"http://{triton.http_url}{path}", timeout=5).status == 200


@pytest.mark.triton
@pytest.mark.parametrize("name", ["readinessProbe", "livenessProbe"])
def test_the_probe_commands_pass_on_the_real_server_in_time(triton, name):
    probe = container("moss-tts-triton", "tritonserver")[name]
    argv = [localize(arg, triton) for arg in (readiness_argv() if name == "readinessProbe" else liveness_argv())]
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "client.healthcheck", *argv], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    took = time.monotonic() - started
    assert run.returncode == 0, run.stdout + run.stderr
    assert took < probe["timeoutSeconds"], f"{name} took {took:.1f} s, over the probe's timeout"


def test_liveness_fails_when_the_grpc_frontend_does_not_answer(monkeypatch):
    """A listening port that never answers gRPC (the wedge's shape: connections taken, nothing
    served) fails --live's gRPC check within its timeout; --live asks ServerLive, not ServerReady."""
    import socket
    import client.healthcheck

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        problem = client.healthcheck.live(url, 2.0)
        took = time.monotonic() - started
    assert problem is not None and took < 8.0, (problem, took)
    asked = []
    monkeypatch.setattr(client.healthcheck, "live", lambda url, timeout: asked.append("live") or "down")
    monkeypatch.setattr(client.healthcheck, "ready", lambda url, timeout: asked.append("ready") or "down")
    assert client.healthcheck.diagnose(url, "unused", False, 2.0, True) == "down" and asked == ["live"]


@pytest.mark.triton
def test_the_drain_of_an_idle_server_returns_once_settled(triton):
    from client.drain import _STREAMS, read_streams, wait_for_drain
    from client.server_health import fetch

    # The series the drain reads really exists (an idle server counts 0 either way).
    assert _STREAMS.search(fetch(triton.metrics_url, 10.0))
    assert read_streams(triton.metrics_url) is not None
    assert wait_for_drain(lambda: read_streams(triton.metrics_url), 0, 10).startswith("drained")


def exported_series(text: str) -> list[tuple[str, dict[str, str]]]:
    series = []
    for name, labels in re.findall(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})? \S+$", text, re.M):
        series.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels))))
    return series


def wanted_series(query: str) -> list[tuple[str, str, list[str]]]:
    """(metric, label, values) for every `name{label="v"}` / `label=~"a|b"` matcher of a rule."""
    wanted = []
    for name, matchers in re.findall(r"\b((?:moss|nv)_\w+)\{([^}]*)\}", query):
        for label, op, value in re.findall(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"', matchers):
            if op != "!=":
                wanted.append((name, label, value.split("|") if op == "=~" else [value]))
    return wanted


@pytest.mark.triton
def test_every_series_the_autoscaler_reads_is_exported(triton):
    # Triton's per-model series and our gauges are there from load, before any request.
    from client.server_health import fetch

    series = exported_series(fetch(triton.metrics_url, 10.0))
    rules = adapter_rules()
    wanted = [w for rule in rules for w in wanted_series(rule["seriesQuery"] + rule["metricsQuery"])]
    assert {w[0] for w in wanted} >= {"moss_engine", "nv_inference_queue_duration_us",
                                      "nv_inference_compute_infer_duration_us"}
    for name, label, values in wanted:
        for value in values:
            assert any(n == name and labels.get(label) == value for n, labels in series), \
                f'{name}{{{label}="{value}"}} is not exported'
    for rule in rules:
        assert re.fullmatch(rule["name"]["matches"].strip("^$"), re.search(r"\w+", rule["seriesQuery"]).group(0))


@pytest.mark.triton
def test_the_shim_channel_reaches_the_server_through_a_dns_url(triton):
    from client.openai_shim.triton_stream import TritonSpeech

    async def ask():
        speech = TritonSpeech(f"dns:///{triton.grpc_url}", "moss_tts", 10.0)
        try:
            return await speech.problem(10.0)
        finally:
            await speech.close()

    assert asyncio.run(ask()) is None
