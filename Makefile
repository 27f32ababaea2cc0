# deltaserve — one Makefile.
#   make            build/deltaserve (CPU backend)
#   make CUDA=1     also the CUDA backend (nvcc, sm_90a)
#   make test       install what the tests need, build, run every test
#   make run        install, build, serve the bundled demo model on :8000
#   make test-asan  the test suite in an ASan + UBSan build

CC      ?= gcc
NVCC    ?= /usr/local/cuda/bin/nvcc
ifeq ($(CUDA),1)
BUILD   ?= build-cuda
endif
BUILD   ?= build
OPT     ?= -O2
CFLAGS  += -std=c11 -Wall -Wextra -Werror $(OPT) -g -pthread -D_GNU_SOURCE -Isrc -MMD -MP
LDLIBS  += -lmicrohttpd -ljansson -lpcre2-8 -lutf8proc -lzmq -lmsgpackc -lm -lpthread

SRCS     := $(shell find src -name '*.c' -not -path 'src/backend/cuda/*' -not -name main.c | sort)
OBJS     := $(SRCS:%.c=$(BUILD)/obj/%.o)
TEST_SRCS:= $(sort $(wildcard tests/test_*.c))
TESTS    := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)

ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
CU_SRCS  := $(sort $(wildcard src/backend/cuda/*.cu))
CU_OBJS  := $(CU_SRCS:%.cu=$(BUILD)/obj/%.o)
CUFLAGS  += -O3 -std=c++17 -MMD -MP -gencode=arch=compute_90a,code=sm_90a -Isrc -Xcompiler -Wall,-fPIC --expt-relaxed-constexpr
CFLAGS   += -DDS_CUDA=1 -I$(CUDA_HOME)/include
# NCCL (tensor parallelism over GPUs, src/backend/cuda/cuda_comm.cu): NCCL_HOME, else the CUDA
# tree, else the nvidia-nccl wheel of the python3 on the path (PyTorch's); a build without it
# refuses that path at run time with one line (cuda_comm.cu)
NCCL_HOME ?= $(firstword $(if $(wildcard $(CUDA_HOME)/include/nccl.h),$(CUDA_HOME)) \
  $(shell python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null))
ifneq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
CUFLAGS  += -DDS_NCCL=1 -I$(NCCL_HOME)/include
NCCL_LIBDIR := $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so* $(NCCL_HOME)/lib/libnccl.so*))
NCCL_LIB := -L$(dir $(NCCL_LIBDIR)) -Wl,-rpath,$(dir $(NCCL_LIBDIR)) -l:$(notdir $(NCCL_LIBDIR))
endif
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(NCCL_LIB) -lcublasLt -lcublas -lcudart -lstdc++
OBJS     += $(CU_OBJS)
endif

CUDA_TEST_SRCS := $(sort $(wildcard tests/cuda/test_*.c))
CUDA_TESTS     := $(CUDA_TEST_SRCS:tests/cuda/%.c=$(BUILD)/tests/cuda/%)

.PHONY: all test run deps clean test-asan asan-build format cuda-tests cuda-ktrace FORCE
all: $(BUILD)/deltaserve

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(CUFLAGS) -c $< -o $@

# The commit `deltaserve --version` names: this tree's, when it is a git checkout (none from a
# tarball, also one unpacked inside another repository). $(BUILD)/git-commit changes only when
# the commit does, so that version.o is rebuilt then and only then.
GIT_COMMIT := $(shell [ "$$(git rev-parse --show-toplevel 2>/dev/null)" = "$(CURDIR)" ] && \
                git rev-parse --short=12 HEAD 2>/dev/null)
$(BUILD)/git-commit: FORCE
	@mkdir -p $(BUILD)
	@echo '$(GIT_COMMIT)' | cmp -s - $@ || echo '$(GIT_COMMIT)' >$@
$(BUILD)/obj/src/base/version.o: $(BUILD)/git-commit
$(BUILD)/obj/src/base/version.o: CFLAGS += -DDS_GIT_COMMIT='"$(GIT_COMMIT)"'
FORCE:

$(BUILD)/libdeltaserve.a: $(OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/deltaserve: $(BUILD)/obj/src/main.o $(BUILD)/libdeltaserve.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/test.h $(BUILD)/libdeltaserve.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libdeltaserve.a -o $@ $(LDLIBS)

# GPU-machine tests (tests/cuda/test_*.c): built with `make CUDA=1 cuda-tests`, run by
# scripts/device/check.sh there; CI only compiles the CUDA code.
cuda-tests: $(CUDA_TESTS)
$(BUILD)/tests/cuda/%: tests/cuda/%.c tests/test.h $(BUILD)/libdeltaserve.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libdeltaserve.a -o $@ $(LDLIBS)

# Instrument build, not the server's: the kernel-release trace (src/backend/cuda/cuda_ktrace.cu),
# deltaserve built with -DDS_KTRACE into BUILD (say `make BUILD=build-kt cuda-ktrace`); it
# reports on stderr ("ktrace| " lines) at exit. scripts/device/ab.sh DS_AB_KTRACE=1 uses it.
cuda-ktrace:
	@$(MAKE) --no-print-directory CUDA=1 BUILD=$(BUILD) NVCC="$(NVCC) -DDS_KTRACE" all

deps:
	@bash scripts/setup.sh

# make test: the whole suite in the normal build, then again in the ASan + UBSan build.
test: deps
	@$(MAKE) --no-print-directory all $(TESTS)
	@$(MAKE) --no-print-directory asan-build
	@bash tests/run.sh $(BUILD) build-asan

test-asan: deps asan-build
	@bash tests/run.sh build-asan

asan-build:
	@$(MAKE) --no-print-directory BUILD=build-asan CC=clang \
	  OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -Wno-unknown-warning-option" \
	  LDFLAGS="-fsanitize=address,undefined" all \
	  $(TEST_SRCS:tests/%.c=build-asan/tests/%)

# make run PORT=8001 HOST=0.0.0.0. HOST from the environment is not taken: shells set it to the
# machine's name.
PORT ?= 8000
RUN_HOST := $(if $(filter environment,$(origin HOST)),127.0.0.1,$(or $(HOST),127.0.0.1))
run: deps all
	@bash scripts/demo.sh
	$(BUILD)/deltaserve serve $(BUILD)/demo-model --host $(RUN_HOST) --port $(PORT)

format:
	clang-format -i $$(find src tests scripts -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh')

clean:
	rm -rf build build-asan build-cuda build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
