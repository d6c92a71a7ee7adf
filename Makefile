# Quickstart: `make demo`, `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench soak lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,otel]'
	touch $(STAMP)

# Byte-compiled once here, as a wheel's install does: with PYTHONDONTWRITEBYTECODE set (as
# in some containers) every `ratchet serve` would otherwise compile the whole package again
# at start (about 0.2 s of a restart; docs/operations.md, "Restart (W4)"). Files changed
# later are compiled in memory as usual until the next `make install`. Likewise the code the
# standard library compiles from text (dataclass methods, forward references, named tuples)
# as a serving node's modules are imported (ratchet/code_cache.py: ~0.1 s of every start).
install: $(STAMP)
	$(BIN)/python -m compileall -q $(CURDIR)/protocol $(CURDIR)/persistence $(CURDIR)/actors \
		$(CURDIR)/supervisors $(CURDIR)/ratchet
	$(BIN)/python -m ratchet.code_cache

demo: $(STAMP)
	$(BIN)/ratchet --log-level warning demo

# Two pytest workers (pytest-xdist): much of the suite's time is spent waiting on real
# processes, so two share a 2-core machine well; the other slow tests go to one of them,
# one after another. The `solo` tests (several node processes flat out, whose leases lapse
# when they share the cores: tests/conftest.py) run alone, after the rest; both parts run
# even if the first fails. `TEST_WORKERS=0`: no xdist workers.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup

test: lint
	$(BIN)/python -m pytest -q $(XDIST) -m "not solo"; rest=$$?; \
	$(BIN)/python -m pytest -q -m solo; solo=$$?; \
	test $$rest = 0 && test $$solo = 0

# Everything but the tests marked slow (real processes killed, a minute of soak).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow"

# Each script prints one JSON object as its last line (figures in docs/operations.md).
bench: $(STAMP)
	$(BIN)/python bench/steps.py
	$(BIN)/python bench/actions.py
	$(BIN)/python bench/fanout.py
	$(BIN)/python bench/dynflow.py
	$(BIN)/python bench/agent.py
	$(BIN)/python bench/admin.py
	$(BIN)/python bench/settle.py
	$(BIN)/python bench/tracing.py
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/chaos.py --runs 200
	$(BIN)/python bench/pg_store.py

# Ten minutes of steady load at 150 tasks/s (WAL, memory and latency over time).
soak: $(STAMP)
	$(BIN)/python bench/soak.py --seconds 600

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .ratchet .pytest_cache
