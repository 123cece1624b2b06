# tide - build, test, run.  `make V=1` shows full commands.
CC      ?= gcc
CFLAGS  ?= -O2 -g
override CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -pthread -MMD -MP -Isrc
LDLIBS  := -lmicrohttpd -lcjson -lpcre2-8 -lm -pthread
BUILD   ?= build

ifeq ($(V),1)
Q :=
else
Q := @
endif

# CUDA: used when the toolkit is there and there are .cu files to build.
CUDA_HOME ?= /usr/local/cuda
NVCC      := $(wildcard $(CUDA_HOME)/bin/nvcc)
CU_SRC    := $(shell find src -name '*.cu' 2>/dev/null)
ifneq ($(and $(NVCC),$(CU_SRC)),)
override CFLAGS += -DTIDE_CUDA -I$(CUDA_HOME)/include
NVFLAGS   := -O2 -g -std=c++17 -arch=sm_90 -Isrc -MMD -MP
# Static cudart only (no cuBLAS: see src/engine/cuda/matmul.cu): the binary starts on a
# machine without a driver and carries no CUDA shared library.
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
LDLIBS    += $(CUDA_LIBS)
CU_OBJ    := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CUDA_STUB := src/engine/backend_cuda_none.c
endif
# The GPU test binary runs on the device machine, which lacks our Debian packages: it
# links only libc, libm and (with CUDA) the static runtime.
GPU_LDLIBS := -lm -pthread $(CUDA_LIBS)

LIB_SRC  := $(filter-out src/server/main.c $(CUDA_STUB),$(shell find src -name '*.c'))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_OBJ)
UNIT_SRC := $(wildcard tests/unit/*.c)
E2E_SRC  := $(wildcard tests/e2e/*.c)
GPU_SRC  := $(wildcard tests/gpu/*.c)

DEFAULT_MODEL := models/tide-moe.gguf
DEFAULT_MMPROJ := models/tide-mmproj.gguf

.PHONY: all test unit e2e run clean deps models gpu-tests
all: $(BUILD)/tide $(BUILD)/tide-mkmodel models

$(BUILD)/libtide.a: $(LIB_OBJ)
	@echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/tide: $(BUILD)/obj/src/server/main.o $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tide-mkmodel: $(BUILD)/obj/tools/mkmodel.o $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/test-unit: $(UNIT_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $^ -lcriterion $(LDLIBS)

$(BUILD)/test-gpu: $(GPU_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(GPU_LDLIBS)

# GPU tests: op parity CUDA vs CPU, VMM; prints SKIPPED per test without a device.
gpu-tests: $(BUILD)/test-gpu
	$(Q)$(BUILD)/test-gpu

$(BUILD)/test-e2e: $(E2E_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $^ -lcriterion -lcurl $(LDLIBS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	$(Q)$(NVCC) $(NVFLAGS) -c -o $@ $<

# The embedded default model: generated, deterministic, never committed.
models: $(DEFAULT_MODEL) $(DEFAULT_MMPROJ)
$(DEFAULT_MODEL): $(BUILD)/tide-mkmodel
	@mkdir -p models
	@echo "  GEN   $@"
	$(Q)$(BUILD)/tide-mkmodel --preset moe --out $@

# Its vision tower (llama.cpp clip layout, projector to the default model's n_embd 128).
$(DEFAULT_MMPROJ): $(BUILD)/tide-mkmodel
	@mkdir -p models
	@echo "  GEN   $@"
	$(Q)$(BUILD)/tide-mkmodel --preset mmproj --text-embd 128 --out $@

deps:
	$(Q)scripts/install-deps.sh

unit: $(BUILD)/test-unit
	$(Q)$(BUILD)/test-unit

e2e: $(BUILD)/test-e2e all
	$(Q)$(BUILD)/test-e2e

test: deps
	$(Q)$(MAKE) --no-print-directory all $(BUILD)/test-unit $(BUILD)/test-e2e
	$(Q)$(BUILD)/test-unit
	$(Q)$(BUILD)/test-e2e
	$(Q)TIDE_BIN=$(BUILD)/tide bash tests/e2e/test_prometheus.sh

run: deps
	$(Q)$(MAKE) --no-print-directory all
	$(BUILD)/tide --config config/tide.json

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
