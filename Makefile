# Set-up and the project's commands. Every target creates .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# One of the four networks, or module:callable (e.g. models.examples:tiny).
NET ?= resnet152
RANKS ?=
MPIEXEC := $(VENV)/bin/mpiexec
# `make experiment NET=... RANKS=2` runs one process per rank under MPI.
LAUNCH := $(if $(RANKS),$(MPIEXEC) -launcher fork -n $(RANKS))

# RANKS, when given, is a positive whole number: one word of digits only,
# not starting with 0. Anything else stops make (status 2) before it runs.
positive_int = $(and $(filter 1,$(words $(1))),$(filter-out 0%,$(1)),$(if $(call no_digits_of,$(1)),,yes))
no_digits_of = $(strip $(subst 0,,$(subst 1,,$(subst 2,,$(subst 3,,$(subst 4,,$(subst 5,,$(subst 6,,$(subst 7,,$(subst 8,,$(subst 9,,$(1))))))))))))
check_ranks = $(if $(RANKS),$(if $(call positive_int,$(RANKS)),,$(error RANKS=$(RANKS) is not a number of MPI ranks: give a positive integer such as RANKS=2, or leave RANKS out for one process)))
# Checked when make reads the Makefile, before the venv is set up.
ifneq ($(filter experiment,$(MAKECMDGOALS)),)
$(check_ranks)
endif

.PHONY: install test test-py312 train experiment plot model validate-model benchmark \
	benchmark-gpu gpu clean

install: $(STAMP)

# Chainer 7.8.1 ships as an sdist whose setup.py imports pkg_resources, which
# setuptools>=81 no longer has: so setuptools<81 goes in first and Chainer is
# built without build isolation, against the venv's own setuptools.
$(STAMP): requirements.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet 'setuptools<81' wheel 'numpy==1.26.4'
	$(PY) -m pip install --quiet --no-build-isolation -r requirements.txt
	$(PY) -m pip install --quiet --no-build-isolation --no-deps -e .
	touch $(STAMP)

# The GPU extra: the CuPy wheel of the driver's CUDA major version
# (tools/cuda_major.sh: nvidia-smi's "CUDA Version", else nvcc; it stops
# make with a message where there is no driver), the other CUDA's wheel
# removed (two CuPy packages clash). CUPY=13: CuPy 13, the last with
# cupy.cudnn, as cupy-cuda12x (a CUDA 13 driver runs it too); see
# docs/DEVELOPING.md for what each costs.
CUPY ?=
gpu: $(STAMP)
	@if [ -n "$(CUPY)" ] && [ "$(CUPY)" != 13 ]; then \
		echo "make gpu: CUPY=$(CUPY): give CUPY=13 (CuPy 13 with" \
		"cuDNN) or leave CUPY out (the newest CuPy)" >&2; exit 2; fi; \
	major=$$(bash tools/cuda_major.sh) || exit 1; \
	if [ "$(CUPY)" = 13 ]; then wheel=12; spec='cupy-cuda12x>=13,<14'; \
	else wheel=$$major; spec=cupy-cuda$${major}x; fi; \
	other=$$([ $$wheel = 12 ] && echo 13 || echo 12); \
	echo "CUDA $$major driver: installing $$spec"; \
	$(PY) -m pip uninstall --quiet --yes cupy-cuda$${other}x \
		>/dev/null 2>&1 || true; \
	$(PY) -m pip install --quiet "$$spec"

test: $(STAMP)
	$(PY) -m pytest -q tests

# The current-stack leg: Python 3.12, NumPy 2, setuptools without
# pkg_resources (see cgdp_chainer/_compat.py). Runs the import and model tests.
test-py312:
	bash .ci/py312.sh

train: $(STAMP)
	$(PY) -m experiments.train --net $(NET) $(ARGS)

experiment: $(STAMP)
	$(LAUNCH) $(PY) -m experiments.weak_scaling --net $(NET) \
		$(if $(DEVICES),--devices $(DEVICES)) $(if $(BATCH),--batch $(BATCH)) \
		$(if $(IMAGE_SIZE),--image-size $(IMAGE_SIZE)) \
		$(if $(ITERATIONS),--iterations $(ITERATIONS)) \
		$(if $(WARMUP),--warmup $(WARMUP)) \
		$(if $(CHUNK_SIZE),--chunk-size $(CHUNK_SIZE)) \
		$(if $(MODES),--modes $(MODES)) $(if $(OUT),--out $(OUT))

plot: $(STAMP)
	$(PY) -m experiments.plot $(RUN)

# NET only when given (on the command line or in the environment): the
# default of the other targets would otherwise narrow `make model` to it.
# INPUT_SHAPE: one example's input, C,H,W or F (e.g. 3,32,32).
model: $(STAMP)
	$(PY) -m experiments.costmodel_predict \
		$(if $(filter-out undefined default file,$(origin NET)),--net $(NET)) \
		$(if $(INPUT_SHAPE),--input-shape $(INPUT_SHAPE)) \
		$(if $(OUT),--out $(OUT))

validate-model: $(STAMP)
	$(PY) -m experiments.validate_model --net $(NET)

benchmark: $(STAMP)
	$(PY) -m benchmarks.baseline

# CGDP against StandardUpdater and the limit on one GPU, with the cost
# model's check (docs/EXPERIMENTS.md); ARGS for more options.
benchmark-gpu: $(STAMP)
	$(PY) -m benchmarks.gpu $(ARGS)

clean:
	rm -rf $(VENV) .venv312 build *.egg-info
