# The two set-up commands of README.md. Both are idempotent.
.PHONY: test serve setup

setup:
	@scripts/setup_env.sh

test: setup
	PYTHONPATH=python_backends .venv/bin/python -m pytest tests -q

serve: setup
	@scripts/serve.sh
