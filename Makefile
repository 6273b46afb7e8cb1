# delayd — every target works from a fresh clone: the virtualenv is created and filled on demand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
DEV_STAMP := $(VENV)/.installed-dev-stamp

.PHONY: install install-dev run test lint format bench torture clean tools cluster cluster-stop

install: $(STAMP)
install-dev: $(DEV_STAMP)

# `make run` needs only the runtime; tests, lint and benchmarks need the dev and spark extras.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(DEV_STAMP)

run: install
	$(PY) -m broker serve

tools:
	scripts/install-test-deps.sh
	deploy/install_tools.sh

test: install-dev tools
	$(PY) -m pytest -q

cluster: install
	deploy/cluster.sh start

cluster-stop:
	deploy/cluster.sh stop

lint: install-dev
	$(PY) -m ruff check broker storage client tests bench examples
	$(PY) -m mypy storage broker

format: install-dev
	$(PY) -m ruff format broker storage client tests bench examples
	$(PY) -m ruff check --fix broker storage client tests bench examples

bench: install-dev
	$(PY) -m pip install -q -e '.[dev,bench]'
	bash bench/install_peer.sh
	$(PY) bench/storage_bench.py
	$(PY) bench/keyindex_bench.py
	$(PY) bench/daemon_vs_redis.py
	$(PY) bench/spark_bench.py

torture: install-dev
	DELAYD_TORTURE_CYCLES=500 $(PY) -m pytest -q -m torture tests/robustness

clean:
	-deploy/cluster.sh stop
	rm -rf $(VENV) delayd-data cluster-data .tools .pytest_cache .mypy_cache .ruff_cache
