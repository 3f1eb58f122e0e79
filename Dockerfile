# moss-tts-triton on the NGC Triton image of the same version the tests run (2.51.0 = 24.10).
# Not buildable on the development machines (no Docker engine there); kept in step with
# scripts/setup_env.sh + scripts/serve.sh, which do the same without Docker.
#
#   docker build -t moss-tts-triton .
#   docker run --gpus all --shm-size=2g -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#     -v /path/to/MOSS-TTS-Local-Transformer-v1.5:/models/moss-tts:ro \
#     -v /path/to/MOSS-Audio-Tokenizer-v2:/models/moss-codec:ro moss-tts-triton
# The OpenAI-compatible shim is a separate process (make serve runs both); in containers run it
# beside this one: python -m client.openai_shim --port 8080 --triton-url <this-container>:8001
# Its image is the `shim` stage below (the last stage, tritonserver's, is the default target).

# The shim alone, for deploy/k8s/shim.yaml: no torch, no tritonserver. Its pins are those of
# requirements.txt (tests/test_k8s_manifests.py checks); FastAPI needs Python >= 3.11, which the
# Triton image (3.10) lacks.
#   docker build --target shim -t moss-tts-shim .
FROM python:3.11-slim AS shim
RUN pip install --no-cache-dir "numpy==1.26.4" "soundfile==0.14.0" "tritonclient[grpc]==2.51.0" \
    "fastapi==0.165.0" "python-multipart==0.0.20" "uvicorn==0.54.0" "pydantic==2.14.4" "httpx==0.28.1"
WORKDIR /opt/moss-tts-triton
# The client imports moss_tts.contract (torch-free); the rest of the package is never imported.
COPY python_backends/moss_tts/ python_backends/moss_tts/
COPY client/ client/
ENV PYTHONPATH=/opt/moss-tts-triton/python_backends
EXPOSE 8080
CMD ["python", "-m", "client.openai_shim", "--port", "8080"]

FROM nvcr.io/nvidia/tritonserver:24.10-py3

# The image's Python (3.10) runs our Python-backend models. torch: a CUDA 12.4 build, which the
# image's CUDA 12.6 driver stack runs. numpy<2: the 24.10 stub mis-reads BYTES tensors with numpy 2.
# The engine's Triton kernels (decode attention, the draw) were built and measured with torch
# 2.11 + Triton 3.6 (perf/RESULTS.md); with an older torch, if their compile fails at start-up,
# set attention_kernel/sampler_kernel to "false" in model_repository/moss_tts/config.pbtxt.
ARG TORCH_VERSION=2.5.1
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cu124 \
 && pip install --no-cache-dir "numpy<2" "transformers>=4.51" tokenizers safetensors soundfile xxhash

WORKDIR /opt/moss-tts-triton
COPY python_backends/ python_backends/
COPY model_repository/ model_repository/
# The stub's interpreter ignores PYTHONPATH (isolated config): put our package on its path.
RUN echo /opt/moss-tts-triton/python_backends > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/moss_tts.pth"

ENV MOSS_TTS_MODEL_DIR=/models/moss-tts \
    MOSS_TTS_CODEC_DIR=/models/moss-codec
COPY client/ client/
RUN pip install --no-cache-dir "tritonclient[grpc]==2.51.0"
# Readiness stays 200 when a Python stub has died (24.10 does not restart stubs): check the
# models' heartbeats and probe one frame end to end.
HEALTHCHECK --interval=30s --timeout=40s --start-period=300s CMD python3 -m client.healthcheck --probe --timeout 30
EXPOSE 8000 8001 8002
CMD ["tritonserver", "--model-repository=/opt/moss-tts-triton/model_repository", "--backend-config=python,thread-pool-size=384"]
