# cutline — the two commands: `make demo` and `make test`.
# Both create .venv when it is missing and install the project with its dev
# dependencies first; nothing depends on what was installed by hand.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.cutline-installed
DEMO_OUT ?= demo-output

.PHONY: demo test lint typecheck docs pytest bare-install soak bench clean check-python check-java

demo: $(STAMP)
	@mkdir -p $(DEMO_OUT)
	$(BIN)/cutline demo --workdir $(DEMO_OUT)/b1
	$(BIN)/cutline checkpoints list $(DEMO_OUT)/b1/ck
	$(BIN)/cutline checkpoints verify $(DEMO_OUT)/b1/ck
	$(BIN)/cutline report $(DEMO_OUT)/b1/ck -o $(DEMO_OUT)/report.html
	$(BIN)/cutline sim --demo --seed 7 --diagram $(DEMO_OUT)/bank.png
	$(BIN)/cutline sim --demo --seed 7 --diagram $(DEMO_OUT)/bank.svg > /dev/null
	@echo "diagram written to $(DEMO_OUT)/bank.png and $(DEMO_OUT)/bank.svg"

test: lint typecheck docs pytest bare-install

lint: $(STAMP)
	$(BIN)/ruff check src tests bench docs/conf.py
	$(BIN)/ruff format --check src tests bench docs/conf.py
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

# the documentation site, into docs/_build/html: every page read afresh (-E), warnings are
# errors (a broken cross-reference, a docstring that is not valid reST), all of them listed
docs: $(STAMP)
	$(BIN)/sphinx-build -E -W --keep-going -j auto -q -b html docs docs/_build/html

# the suite on every core (2 in CI), one test at a time per worker; the cluster's tests on one.
# (A worker more than the cores was 10 % faster, but a slot then took over 6 s to start under
# that load: the deadline tests' short deadlines want the cores they count on.)
pytest: $(STAMP)
	$(BIN)/pytest -m "not slow" -n auto --maxprocesses 4 --dist loadgroup

# `pip install .` (no extras) into an empty venv: every module imports, the CLI and a small job run
bare-install: | check-python check-java
	scripts/check_bare_install.sh $(PYTHON)

soak: $(STAMP)
	$(BIN)/pytest -m slow

bench: $(STAMP)
	$(BIN)/python bench/b1_b2.py
	$(BIN)/python bench/b3_state.py
	$(BIN)/python bench/b4_backpressure.py
	$(BIN)/python bench/b5_sim.py
	$(BIN)/python bench/b6_cadence.py
	$(BIN)/python bench/connectors.py

$(STAMP): pyproject.toml | check-python check-java
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null || { \
	  echo "cutline needs Python 3.11 or newer as '$(PYTHON)'."; \
	  echo "Install it (e.g. 'apt-get install python3.11 python3.11-venv') or run 'make PYTHON=python3.12 ...'."; \
	  exit 1; }

# PySpark (used by the streaming runtime) needs Java 17 or newer.
check-java:
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then \
	  echo "cutline needs Java 17 or newer (found: $${v:-none})."; \
	  echo "Install it, e.g. 'apt-get install openjdk-17-jre-headless' (Debian/Ubuntu),"; \
	  echo "'brew install openjdk@17' (macOS), or from https://adoptium.net, then set JAVA_HOME."; \
	  exit 1; \
	fi

clean:
	rm -rf $(VENV) $(DEMO_OUT) docs/_build .pytest_cache .mypy_cache .ruff_cache .hypothesis
