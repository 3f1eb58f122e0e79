# The two set-up commands of README.md. Both are idempotent.
.PHONY: test serve setup image device-pack

setup:
	@scripts/setup_env.sh

test: setup
	PYTHONPATH=python_backends .venv/bin/python -m pytest tests -q --durations=20 -n $${TEST_WORKERS:-2} --dist loadfile

serve: setup
	@scripts/serve.sh

# Everything below reads the same pin list, requirements.txt (docs/kubernetes.md, "One stack").
# The two images (needs a Docker engine; the development machines have none).
image:
	docker build -t moss-tts-triton . && docker build --target shim -t moss-tts-shim .

# .device/triton-pack.tar.xz for the H200 machine (its header says how it is used there).
device-pack: setup
	@scripts/device_triton_pack.sh
