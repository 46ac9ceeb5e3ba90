# Two commands on a fresh machine:
#   make run    venv + install + the main job (tiny GPT on the embedded corpus, on this machine)
#   make test   venv + install + the whole test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
export TORCHDYNAMO_DISABLE ?= 1

$(VENV)/installed: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

.PHONY: install run test test-fast lint bench
install: $(VENV)/installed

run: install
	$(PY) pretrain_gpt.py

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(PY) -m pytest -q --durations=25

test-fast: install
	$(PY) -m pytest -q -m "not slow"

bench: install
	$(PY) bench/step_overhead.py
	$(PY) bench/lgs_simulate.py
	$(PY) bench/published_runs.py
	$(PY) bench/async_save.py --rounds 3
