# The front door. Every target creates/uses .venv; nothing needs a hand-installed package.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv nixl demo test test-ascend bench bench-check bench-ascend proto proto-check lint run clean deploy-check cpp cpp-asan cpp-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## make demo: a prefill node and a decode node exchanging a paged KV cache
demo: $(STAMP)
	$(PY) -m bench.demo

## make nixl: NIXL for the nixl transport ([transport] name = "nixl"; docs/nixl.md). --no-deps: the wheel asks
## for torch, which NIXL's host-memory path never imports (~270 MB instead of several GB)
NIXL_VERSION ?= 1.5.1
NIXL_STAMP := $(VENV)/.nixl-$(NIXL_VERSION)

$(NIXL_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --no-deps 'nixl-cu12==$(NIXL_VERSION)'
	touch $(NIXL_STAMP)

nixl: $(NIXL_STAMP)

## make cpp: the C++ client (CANN's llm_datadist::LlmDataDist over datadistd, docs/cpp.md) built with CMake against
## the distribution's gRPC and protobuf, installed into build/cpp/install (include/, lib/libllm_datadist.so,
## lib/pkgconfig/llm_datadist.pc, lib/cmake/llm_datadist/)
CPP_TOOLS   := cmake g++ pkg-config protoc grpc_cpp_plugin
CPP_PACKAGES := cmake g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
CPP_BUILD   := build/cpp/build
CPP_INSTALL := $(abspath build/cpp/install)
CPP_JOBS    ?= 2

cpp:
	@for t in $(CPP_TOOLS); do command -v $$t >/dev/null || { echo "make cpp: $$t is missing (Debian: apt-get install $(CPP_PACKAGES))"; exit 2; }; done
	@pkg-config --exists grpc++ protobuf || { echo "make cpp: gRPC C++ / protobuf not found by pkg-config (Debian: apt-get install $(CPP_PACKAGES))"; exit 2; }
	cmake -S client/cpp -B $(CPP_BUILD) -DCMAKE_INSTALL_PREFIX=$(CPP_INSTALL) $(CPP_CMAKE_ARGS) >/dev/null
	cmake --build $(CPP_BUILD) -j $(CPP_JOBS)
	cmake --install $(CPP_BUILD) >/dev/null
	@echo "make cpp: installed into $(CPP_INSTALL)"

## make cpp-asan: libllm_datadist.so (not libcann_hixl.so) under AddressSanitizer and UndefinedBehaviorSanitizer,
## installed into build/cpp-asan/install; make test runs the C++ client's programs against it once
## (tests/cpp/test_cpp_hostile.py), against a real daemon and a hostile fake one
cpp-asan:
	@$(MAKE) --no-print-directory cpp CPP_BUILD=build/cpp-asan/build CPP_INSTALL=$(abspath build/cpp-asan/install) \
		CPP_CMAKE_ARGS="-DDATADIST_SANITIZE=address,undefined -DDATADIST_HIXL=OFF"

## cpp-check: say up front whether make test builds and runs the C++ client's tests (tests/cpp) or skips them
cpp-check:
	@missing=""; for t in $(CPP_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	 if [ -z "$$missing" ] && pkg-config --exists grpc++ protobuf; then echo "make test: the C++ client's tests (tests/cpp) build and run"; \
	 else echo "make test: SKIPPING the C++ client's tests (tests/cpp): missing$${missing:- gRPC C++/protobuf (pkg-config)}; install: apt-get install $(CPP_PACKAGES)"; fi

## make test: the whole test suite (unit, integration, reliability; the nixl transport's too, so NIXL is installed;
## the C++ client's where its toolchain is installed, cpp-check says which) in TEST_JOBS processes (pytest-xdist),
## each test file whole in one of them (--dist loadfile: a file's tests run in their order, share its fixtures).
## Three on two cores: a third of the suite's time is waiting (daemons starting, deadlines, sockets); on a quiet
## 2-core machine 3 processes take 374 s, 2 take 471 s, 1 about 800 s
TEST_JOBS ?= 3

test: $(STAMP) $(NIXL_STAMP) proto-check cpp-check
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

## make test-ascend: first the standalone checks of CANN's rules on the NPUs (one line each: what it saw, what
## CANN's source says), then the acl+hccl tests against REAL CANN libraries and NPUs (ASCEND_HOME_PATH set,
## npu-smi sees devices) instead of the simulated runtime make test uses; docs/ascend.md says what was verified where
test-ascend: $(STAMP)
	@test -n "$$ASCEND_HOME_PATH" || { echo "test-ascend: set ASCEND_HOME_PATH (source CANN's set_env.sh)"; exit 2; }
	@npu-smi info >/dev/null || { echo "test-ascend: npu-smi sees no NPU"; exit 2; }
	@echo "test-ascend: first-hour checks (tests/hw/first_hour.py; docs/ascend.md says what each expects)"
	-$(PY) -m tests.hw.first_hour
	DATADIST_ASCEND_REAL=1 $(PY) -m pytest -o addopts="" -k "acl-hccl" tests/integration tests/api \
		tests/reliability/test_faults.py tests/security/test_npu.py $(PYTEST_ARGS)
	@echo "test-ascend: done; make bench-ascend measures datadist over hccl against bare HCCL on NPUs 0 and 1"

## make bench: every hot path against this machine's limits, ratios to baselines measured in the same run;
## writes bench/results/latest.json, latest.md and PNG plots (BENCH_ARGS="--help" lists sizes and scenarios)
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench $(BENCH_ARGS)

## make bench-check: the benchmark at smoke sizes, checked (tests/bench: every scenario writes rows, the report and
## the plots; no figure judged). Runs of the benchmark are measurements, so not part of make test; .ci/run runs it
bench-check: $(BENCH_STAMP)
	DATADIST_BENCH_CHECK=1 $(PY) -m pytest tests/bench $(PYTEST_ARGS)

## make bench-ascend: scenario 10 on REAL CANN and NPUs 0 and 1 (as test-ascend: ASCEND_HOME_PATH, npu-smi):
## datadist over hccl against bare HCCL (HcclBatchPut of the same blocks), GB/s per block size; never the simulation
bench-ascend: $(BENCH_STAMP)
	@test -n "$$ASCEND_HOME_PATH" || { echo "bench-ascend: set ASCEND_HOME_PATH (source CANN's set_env.sh)"; exit 2; }
	@npu-smi info >/dev/null || { echo "bench-ascend: npu-smi sees no NPU"; exit 2; }
	$(PY) -m bench --scenarios 10 --ascend real $(BENCH_ARGS)

## make proto: regenerate the committed stubs from proto/datadist/v1/*.proto
proto: $(STAMP)
	$(PY) -m datadistd.tools.protogen --write

## make proto-check: fail when the committed stubs are stale
proto-check: $(STAMP)
	$(PY) -m datadistd.tools.protogen --check

## make lint: ruff (pinned in pyproject's lint extra) over every Python folder; mypy over the whole daemon, its
## CANN bindings and the client ([tool.mypy] files in pyproject.toml)
lint: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,lint]'
	$(VENV)/bin/ruff check client server tests bench docs/examples
	$(PY) -m mypy

## make deploy-check: systemd-analyze verify on deploy/datadistd.service (+ drop-ins, sysusers snippet).
## verify needs an existing ExecStart executable: deploy/check.sh renders a temporary copy of the unit
## whose ExecStart is this venv's datadistd and verifies that. Skipped when systemd-analyze is absent.
deploy-check: $(STAMP)
	@deploy/check.sh $(abspath $(VENV))/bin/datadistd || [ $$? -eq 77 ]

run: $(STAMP)
	$(VENV)/bin/datadistd

clean:
	rm -rf $(VENV) build *.egg-info
