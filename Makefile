# The two commands of a fresh machine: `make grade` grades the example class, `make test` runs the tests.
# Both first install what the project needs (Debian packages where apt-get is there, then a virtualenv).

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: grade test setup clean

grade: $(STAMP)
	$(VENV)/bin/autograder grade examples/submissions --out results

test: $(STAMP)
	$(PY) -m pytest

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install-system-packages.sh
	bash scripts/install-system-packages.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; then \
		$(PY) -m pip install -q -e '.[gpu]' || echo "PyCUDA did not build: grading runs on the CPU backend."; \
	else \
		echo "No CUDA driver here, so no PyCUDA: grading runs on the CPU backend."; \
	fi
	touch $(STAMP)

clean:
	rm -rf $(VENV) results
