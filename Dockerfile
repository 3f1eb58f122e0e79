# moss-tts-triton: the stack `make test` tests and the H200 measurements use, from the project's one
# pin list (requirements.txt). Not buildable on the development machines (no Docker engine there):
# tests/test_image_stack.py checks this file against the pin list and runs its environment without
# Docker (docs/kubernetes.md, "One stack").
#
#   docker build -t moss-tts-triton .
#   docker run --gpus all --shm-size=2g -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#     -v /path/to/MOSS-TTS-Local-Transformer-v1.5:/models/moss-tts:ro \
#     -v /path/to/MOSS-Audio-Tokenizer-v2:/models/moss-codec:ro moss-tts-triton
# The OpenAI-compatible shim is a separate process (make serve runs both); in containers run it
# beside this one: python -m client.openai_shim --port 8080 --triton-url <this-container>:8001
# Its image is the `shim` stage below (the last stage, tritonserver's, is the default target).
#
# Why this base and not NGC's tritonserver:24.10-py3 (the same server, 2.51.0): that image's Python
# is 3.10, and the tested stack needs 3.11 (transformers 5.24 requires it; torch 2.11 and the
# engine's Triton kernels are what the tests run). So both stages start from python:3.11-slim-bookworm:
# Debian 12 and CPython 3.11 with a shared libpython, the OS and Python minor of the development
# machines and CI. Everything else is requirements.txt, installed by scripts/setup_env.sh, the script
# `make setup` runs:
# - tritonserver 2.51.0: the binary, its libraries, its python backend and one stub per Python
#   (3.8-3.13) come in the nvidia-pytriton 0.7.0 wheel; setup_triton.sh puts the 3.11 stub in the
#   backend, and `tritonserver` (scripts/tritonserver) starts it with scripts/triton_env.sh, exactly
#   as scripts/serve.sh does in the tests.
# - torch 2.11.0: PyPI's Linux wheel of that version is the CUDA 13.0 build, and it brings the CUDA
#   libraries as wheels (cuda-toolkit 13.0.2, cuDNN, NCCL) and triton 3.6.0: the stack of the H200 box
#   where every GPU figure is measured. A CUDA base image would
#   be a second copy of those libraries: none is used, and the build fails below if the torch it got
#   is not a CUDA 13.0 build. The host needs only the NVIDIA driver: >= 580.65.06 (CUDA 13.0; any
#   CUDA 13.x needs >= 580); NVIDIA_REQUIRE_CUDA makes the NVIDIA container runtime refuse to start
#   the container on an older one.

# ---------------------------------------------------------------------------------------------
# The shim alone, for deploy/k8s/shim.yaml: no torch, no tritonserver. Its packages at the pin
# list's versions (scripts/pins.py prints NAME==VERSION from requirements.txt).
#   docker build --target shim -t moss-tts-shim .
FROM python:3.11-slim-bookworm AS shim
WORKDIR /opt/moss-tts-triton
COPY requirements.txt ./
COPY scripts/pins.py scripts/
RUN python3 scripts/pins.py numpy soundfile soxr av "tritonclient[grpc]" fastapi python-multipart uvicorn websockets \
      pydantic httpx \
      > /tmp/shim-requirements.txt \
 && pip install --no-cache-dir -r /tmp/shim-requirements.txt && rm /tmp/shim-requirements.txt
# The client imports moss_tts.contract (torch-free); the rest of the package is never imported.
COPY python_backends/moss_tts/ python_backends/moss_tts/
COPY client/ client/
ENV PYTHONPATH=/opt/moss-tts-triton/python_backends
EXPOSE 8080
CMD ["python", "-m", "client.openai_shim", "--port", "8080"]

# ---------------------------------------------------------------------------------------------
# tritonserver with the whole pipeline (the default target).
FROM python:3.11-slim-bookworm AS triton
# gcc + libc6-dev: Triton (the engine's kernels, torch.compile) builds its small launcher with the
# system C compiler at first use (this image has the Python headers). libb64: perf_analyzer.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libb64-0d \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/moss-tts-triton

# 1. .venv with the whole pin list, as `make setup` makes it (a layer of its own: a code change does
#    not reinstall several GB of wheels). Then: is this torch the CUDA build the list names?
COPY requirements.txt ./
COPY scripts/pins.py scripts/setup_env.sh scripts/uv_args.py scripts/
RUN PIP_NO_CACHE_DIR=1 scripts/setup_env.sh pins \
 && .venv/bin/python -c "import sys, torch; sys.exit(0 if (torch.version.cuda or '').startswith(sys.argv[1]) \
      else f'torch {torch.__version__} is not a CUDA {sys.argv[1]} build: see requirements.txt')" \
      "$(python3 scripts/pins.py --fact torch-cuda)"

# 2. The project, then the rest of `make setup`: the project editable in .venv, the 3.11 stub in the
#    wheel's python backend, the .pth through which the stub imports .venv (scripts/setup_triton.sh).
COPY pyproject.toml README.md ./
COPY scripts/ scripts/
COPY python_backends/ python_backends/
COPY model_repository/ model_repository/
COPY client/ client/
RUN scripts/setup_env.sh && ln -s /opt/moss-tts-triton/scripts/tritonserver /usr/local/bin/tritonserver

# .venv first on PATH: `python3 -m client.*` (probes, drain) runs with the pinned packages.
# GPUs come from `docker run --gpus` or the Kubernetes device plugin (NVIDIA_VISIBLE_DEVICES is
# theirs to set); `compute` is the driver capability CUDA needs (some runtime versions mount only
# `utility` when this is unset).
ENV PATH=/opt/moss-tts-triton/.venv/bin:$PATH \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0" \
    MOSS_TTS_MODEL_DIR=/models/moss-tts \
    MOSS_TTS_CODEC_DIR=/models/moss-codec
# Readiness stays 200 when a Python stub has died (24.10 does not restart stubs): check the
# models' heartbeats and probe one frame end to end.
HEALTHCHECK --interval=30s --timeout=40s --start-period=300s CMD python3 -m client.healthcheck --probe --timeout 30
EXPOSE 8000 8001 8002
CMD ["tritonserver", "--model-repository=/opt/moss-tts-triton/model_repository", "--backend-config=python,thread-pool-size=384", "--disable-auto-complete-config"]
