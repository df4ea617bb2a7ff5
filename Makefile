# fathom — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
NATIVE_DIRS := $(wildcard native/*/Makefile)

.PHONY: setup native demo demo-openstack test test-unit test-lab bench clean

setup:
	@scripts/setup

native:
	@for m in $(NATIVE_DIRS); do $(MAKE) -s -C $$(dirname $$m) || exit 1; done

demo: setup
	$(PY) -m fathom.demo $(if $(KEEP),--keep,)

# a real Neutron with fathom's drivers, driven by the `openstack` command line (docs/openstack.md)
demo-openstack: setup
	$(PY) -m fathom.demo --openstack $(if $(KEEP),--keep,)

# The unit tests run on every core (a file's tests on one worker); the lab tests one at a time,
# as they time traffic through the lab's switches. Both run, whichever fails first; each half
# ends with its slowest tests.
UNIT := FATHOM_NO_SKIP=1 $(PY) -m pytest -ra --durations=15 -n auto --dist loadfile tests/unit
LAB := FATHOM_NO_SKIP=1 $(PY) -m pytest -ra --durations=15 tests/lab

test: setup
	@$(UNIT); unit=$$?; $(LAB) && exit $$unit

test-unit: setup
	$(UNIT)

test-lab: setup
	$(LAB)

bench: setup
	.venv/bin/fathom bench all

clean:
	@for m in $(NATIVE_DIRS); do $(MAKE) -s -C $$(dirname $$m) clean; done
