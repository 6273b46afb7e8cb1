# delayd — every target works from a fresh clone: the virtualenv is created and filled on demand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
DEV_STAMP := $(VENV)/.installed-dev-stamp

.PHONY: install install-dev run test lint typecheck-tree format bench asan torture clean tools cluster cluster-shards cluster-stop

install: $(STAMP)
install-dev: $(DEV_STAMP)

# `make run` needs only the runtime; tests, lint and benchmarks need the dev and spark extras.
$(STAMP): pyproject.toml setup.py $(wildcard storage/*.c storage/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(DEV_STAMP)

run: install
	$(PY) -m delayd serve

tools:
	scripts/install-test-deps.sh
	deploy/install_tools.sh

# Two workers: the suite waits on daemons more than it computes (about 7 minutes instead of 12 on two
# cores). tests/support/daemon.py gives each worker its own ports.
test: install-dev tools
	$(PY) -m pytest -q -n 2

# etcd plus one replicated shard of three members (deploy/cluster.sh); cluster-shards: three plain shards.
cluster: install
	deploy/cluster.sh start

cluster-shards: install
	DELAYD_CLUSTER_MODE=shards deploy/cluster.sh start

cluster-stop:
	deploy/cluster.sh stop
	DELAYD_CLUSTER_MODE=shards deploy/cluster.sh stop

# mypy cannot follow pyproject's folder mapping (delayd.broker lives in broker/), so it checks
# the package through a tree of symlinks laid out as the installed wheel is.
TYPECHECK := .typecheck
typecheck-tree:
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/delayd
	for f in delayd/*; do [ "$$f" = delayd/__pycache__ ] || ln -s ../../$$f $(TYPECHECK)/delayd/; done
	for d in broker storage client; do ln -s ../../$$d $(TYPECHECK)/delayd/$$d; done

lint: install-dev typecheck-tree
	$(PY) -m ruff check delayd broker storage client tests bench examples
	MYPYPATH=$(TYPECHECK) $(PY) -m mypy -p delayd

format: install-dev
	$(PY) -m ruff format delayd broker storage client tests bench examples
	$(PY) -m ruff check --fix delayd broker storage client tests bench examples

bench: install-dev
	$(PY) -m pip install -q -e '.[dev,bench]'
	bash bench/install_peer.sh
	$(PY) -m bench.storage_bench
	$(PY) -m bench.dueheap_bench
	$(PY) -m bench.keyindex_bench
	$(PY) -m bench.consumer_bench
	$(PY) -m bench.produce_far_bench
	$(PY) -m bench.roll_bench
	$(PY) -m bench.crash_bench
	$(PY) -m bench.crash_bench --keyed
	$(PY) -m bench.produce_keys_bench --rounds 5
	$(PY) -m bench.burst_keys_bench --m 1000000 --rounds 1
	$(PY) -m bench.list_bench -n 10000000
	$(PY) -m bench.daemon_vs_redis
	$(PY) -m bench.spark_bench
	$(PY) -m bench.replication_bench

# The differential tests of the compiled batch core under AddressSanitizer and UBSan: rebuilds the
# extension with the sanitizers, runs tests/storage/test_batch_differential.py with the runtime
# preloaded (the interpreter itself is not instrumented), then rebuilds it normally.
ASAN_LIBS = $$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)
asan: install-dev
	rm -f storage/_batch*.so
	DELAYD_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1" \
	    DELAYD_LDFLAGS="-fsanitize=address,undefined" $(PY) -m pip install -q -e .
	ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD=$(ASAN_LIBS) $(PY) -m pytest -q -p no:cacheprovider \
	    tests/storage/test_batch_differential.py tests/storage/test_recovery_core.py tests/storage/test_keyfilter.py tests/storage/test_overlay.py tests/storage/test_key_order.py tests/storage/test_keyseq.py \
	    tests/storage/test_fsyncer.py; status=$$?; \
	    rm -f storage/_batch*.so; $(PY) -m pip install -q -e .; exit $$status

torture: install-dev
	DELAYD_TORTURE_CYCLES=500 $(PY) -m pytest -q -m torture tests/robustness tests/replication

clean:
	-deploy/cluster.sh stop
	rm -rf $(VENV) delayd-data cluster-data .tools .typecheck .pytest_cache .mypy_cache .ruff_cache
