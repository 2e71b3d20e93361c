# ipledger — the two promises of the README: `make demo` and `make test`, each from a clean clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: venv demo test test-fast soak system-deps focus-validator bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,postgres]'
	rm -f $(VENV)/.installed-* && touch $@

demo: venv
	$(VENV)/bin/ipledger demo --out demo-out

# Installs (as root) and checks the Debian packages the integration tests start: slurm-wlm, munge, slurmdbd,
# mariadb-server (real Slurm accounting storage),
# postgresql, prometheus, poppler-utils, chromium and chromium-driver (the web view's browser test). The tests themselves start the servers on 127.0.0.1.
system-deps:
	bash tests/setup-system.sh

# The FinOps Foundation's focus-validator (Python >= 3.12, kept out of ipledger's dependencies) in .focus-venv;
# without such a Python the FOCUS validator tests skip (and fail under CI=true).
focus-validator:
	$(PYTHON) tests/focus_validator.py

test: system-deps venv focus-validator
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

test-fast: venv
	$(VENV)/bin/python -m pytest -q -x -m "not slurm and not prometheus and not browser"

# The adversarial suite at full size (docs/reliability.md): 100 kill trials, 10,000 inputs per parser.
soak: system-deps venv
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider --soak -m soak

# Every figure, then the accuracy figure (tune-on and report-on generators, the demo hall; the calibration table).
bench: venv
	$(VENV)/bin/python -m bench; rc=$$?; $(VENV)/bin/python -m bench.accuracy && exit $$rc

clean:
	rm -rf $(VENV) .focus-venv demo-out .pytest_cache
