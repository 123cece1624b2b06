# tide - build, test, run.  `make V=1` shows full commands.
CC      ?= gcc
CFLAGS  ?= -O2 -g
override CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -pthread -MMD -MP -Isrc
LDLIBS  := -lmicrohttpd -lcjson -lpcre2-8 -lnettle -lm -pthread
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

.PHONY: all test unit e2e run clean deps models gpu-tests print-gpu-ldlibs
# `make` alone builds everything (issue 27: print-gpu-ldlibs, first below, used to be the goal)
.DEFAULT_GOAL := all
# what a program linked against libtide.a alone needs besides it (scripts/bench-cpu.sh)
print-gpu-ldlibs:
	@echo $(GPU_LDLIBS)

all: $(BUILD)/tide $(BUILD)/tide-mkmodel $(BUILD)/tide-jinja models

$(BUILD)/libtide.a: $(LIB_OBJ)
	@echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/tide: $(BUILD)/obj/src/server/main.o $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tide-mkmodel: $(BUILD)/obj/tools/mkmodel.o $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# renders a chat template from the command line: tests/jinja/compare.py
$(BUILD)/tide-jinja: $(BUILD)/obj/tools/jinja.o $(BUILD)/libtide.a
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

# The page served at GET / (src/server/ui.c): ui/* compiled in as C arrays.
UI_FILES := ui/index.html ui/style.css ui/app.js
$(BUILD)/gen/ui_assets.h: $(UI_FILES)
	@mkdir -p $(dir $@)
	@echo "  GEN   $@"
	$(Q)(cd ui && for f in index.html style.css app.js; do xxd -i $$f; done) >$@.tmp && mv $@.tmp $@
$(BUILD)/obj/src/server/ui.o: $(BUILD)/gen/ui_assets.h
$(BUILD)/obj/src/server/ui.o: override CFLAGS += -I$(BUILD)/gen

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
	$(Q)TIDE_BIN=$(BUILD)/tide $(BUILD)/test-e2e

test: deps
	$(Q)$(MAKE) --no-print-directory all $(BUILD)/test-unit $(BUILD)/test-e2e $(BUILD)/test-gpu
	$(Q)$(MAKE) --no-print-directory nocuda
	$(Q)$(BUILD)/test-unit
	$(Q)$(MAKE) --no-print-directory kq-tile-emu # the k-quant tensor-core product's device code (tiles, split-K, add) on the CPU
	$(Q)/usr/bin/python3 tests/docs/check_docs.py # every config key, flag, metric family and TIDE_* switch has its docs row
	$(Q)/usr/bin/python3 tests/jinja/compare.py $(BUILD)/tide-jinja # chat templates: tide vs python3-jinja2, byte for byte
	$(Q)$(BUILD)/test-gpu # without a GPU (CI): every GPU test listed as SKIPPED with the reason
	$(Q)$(MAKE) --no-print-directory f16-tile-emu # the f16 tensor-core tile's index math on the CPU
	$(Q)$(MAKE) --no-print-directory decode-attn-emu # the split decode attention (TIDE_DECODE_ATTN_SPLIT) on the CPU
	$(Q)$(MAKE) --no-print-directory decode-qonce-emu # TIDE_DECODE_QONCE=1/2 bit for bit the old decode kernels, on the CPU
	$(Q)$(MAKE) --no-print-directory paged-attn-emu # the paged decode attention bit for bit the contiguous one, on the CPU
	$(Q)$(MAKE) --no-print-directory moe-group-emu # TIDE_MOE_ROWS_MMA: the routed pairs grouped by expert on the device, on the CPU
	$(Q)$(MAKE) --no-print-directory full-mma-emu # TIDE_VISION_TC: the vision encoder's f16 tensor-core attention, on the CPU
	$(Q)$(MAKE) --no-print-directory sinks-attn-emu # gpt-oss's sink attention over f16 and paged caches (TIDE_CUDA_PAGED), on the CPU
	$(Q)TIDE_BIN=$(BUILD)/tide $(BUILD)/test-e2e
	$(Q)TIDE_BIN=$(BUILD)/tide bash tests/e2e/test_prometheus.sh
	$(Q)TIDE_BIN=$(BUILD)/tide /usr/bin/python3 tests/e2e/test_batching.py # many requests at once: overlap, equal to alone, prefix cache, vision under load
	$(Q)TIDE_BIN=$(BUILD)/tide /usr/bin/python3 tests/e2e/test_prefix_share.py # a shared prefix computed once for clients at once; a cancelled leader
	$(Q)TIDE_BIN=$(BUILD)/tide /usr/bin/python3 tests/e2e/test_kv_blocks.py # a paged KV pool that runs out: sequences paused and resumed, replies unchanged
	$(Q)TIDE_BIN=$(BUILD)/tide bash tests/e2e/test_deploy.sh # nginx + 3 daemons + Prometheus: deploy/ (issue 24)
	$(Q)TIDE_BIN=$(BUILD)/tide bash tests/sdk/run.sh
	$(Q)TIDE_BIN=$(BUILD)/tide bash tests/browser/run.sh
	$(Q)TIDE_BIN=$(BUILD)/tide /usr/bin/python3 tests/model/test_model.py 200 # our trained model: parity, accuracy

run: deps
	$(Q)$(MAKE) --no-print-directory all
	$(BUILD)/tide --config config/tide.json

# Sanitizers (issue 7): libtide, the daemon and both test binaries with ASan + UBSan in
# $(ASAN_BUILD), then the whole suite, the e2e tests driving that daemon. CPU only
# (CUDA_HOME=/nonexistent): ASan's shadow memory and the CUDA runtime's address-space
# reservations do not mix, and the CPU path is what this machine runs. The daemon's stderr
# goes to /dev/null in the e2e tests, so sanitizer reports go to $(ASAN_BUILD)/san.* files
# and any such file fails the target.
ASAN_BUILD ?= $(BUILD)/asan
# UBSan stays recoverable so that fuzz/ubsan.supp can silence third-party test-only code;
# halt_on_error makes every other report fatal.
ASAN_CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:log_path=$(abspath $(ASAN_BUILD))/san \
            LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp):print_suppressions=0 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$(abspath fuzz/ubsan.supp):log_path=$(abspath $(ASAN_BUILD))/san
.PHONY: asan fuzz
asan: deps
	$(Q)$(MAKE) --no-print-directory models
	$(Q)$(MAKE) --no-print-directory BUILD=$(ASAN_BUILD) CUDA_HOME=/nonexistent CFLAGS="$(ASAN_CFLAGS)" \
	    $(ASAN_BUILD)/tide $(ASAN_BUILD)/test-unit $(ASAN_BUILD)/test-e2e
	$(Q)rm -f $(ASAN_BUILD)/san.*; rc=0; \
	$(ASAN_ENV) $(ASAN_BUILD)/test-unit || rc=1; \
	$(ASAN_ENV) TIDE_BIN=$(ASAN_BUILD)/tide $(ASAN_BUILD)/test-e2e || rc=1; \
	if ls $(ASAN_BUILD)/san.* >/dev/null 2>&1; then cat $(ASAN_BUILD)/san.*; rc=1; fi; \
	if [ $$rc -ne 0 ]; then echo "asan: FAILED (sanitizer reports, if any, above)"; exit 1; fi; \
	echo "asan: unit and e2e suites clean under ASan + UBSan"

# ThreadSanitizer: the daemon built with TSan in $(TSAN_BUILD), driven by the e2e suite
# (TSAN_FILTER, Criterion's --filter, default all) and the python tests in TSAN_PY; any report
# (in $(TSAN_BUILD)/tsan.*, the daemon's stderr being /dev/null) fails it. It found the HTTP
# options written after the server's threads started and the cancel flag read without an
# atomic load. Slow (the daemon runs 5-10x slower), so CI does not run it.
TSAN_BUILD ?= $(BUILD)/tsan
TSAN_FILTER ?= *
TSAN_PY ?= tests/e2e/test_batching.py tests/e2e/test_prefix_share.py tests/e2e/test_kv_blocks.py
.PHONY: tsan
tsan: deps
	$(Q)$(MAKE) --no-print-directory models $(BUILD)/test-e2e
	$(Q)$(MAKE) --no-print-directory BUILD=$(TSAN_BUILD) CUDA_HOME=/nonexistent \
	    CFLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=thread" $(TSAN_BUILD)/tide
	$(Q)rm -f $(TSAN_BUILD)/tsan.*; rc=0; export TSAN_OPTIONS=log_path=$(abspath $(TSAN_BUILD))/tsan; \
	TIDE_BIN=$(TSAN_BUILD)/tide $(BUILD)/test-e2e --filter='$(TSAN_FILTER)' || rc=1; \
	for t in $(TSAN_PY); do TIDE_BIN=$(TSAN_BUILD)/tide /usr/bin/python3 $$t || rc=1; done; \
	if ls $(TSAN_BUILD)/tsan.* >/dev/null 2>&1; then cat $(TSAN_BUILD)/tsan.*; rc=1; fi; \
	if [ $$rc -ne 0 ]; then echo "tsan: FAILED (reports, if any, above)"; exit 1; fi; \
	echo "tsan: the daemon ran the e2e tests with no ThreadSanitizer report"

# Valgrind (issue 7): the unit tests under memcheck, each Criterion test in its own child
# (--trace-children), a definite leak or an invalid access fails it (Criterion does not
# pass a child's valgrind exit code on, so any non-empty report file fails it). VALGRIND_FILTER picks
# tests (Criterion's --filter, default all); the CPU kernels make it slow, so CI does not run it.
VALGRIND_FILTER ?= *
.PHONY: valgrind
valgrind: $(BUILD)/test-unit
	$(Q)rm -rf $(BUILD)/valgrind; mkdir -p $(BUILD)/valgrind; rc=0; \
	valgrind -q --trace-children=yes --leak-check=full --errors-for-leak-kinds=definite \
	    --log-file=$(BUILD)/valgrind/vg.%p $(BUILD)/test-unit -j1 --filter='$(VALGRIND_FILTER)' || rc=1; \
	for f in $(BUILD)/valgrind/vg.*; do if [ -s $$f ]; then cat $$f; rc=1; fi; done; \
	if [ $$rc -ne 0 ]; then echo "valgrind: FAILED (reports above)"; exit 1; fi; echo "valgrind: unit tests clean"

# Fuzzers (issue 7): fuzz/fuzz_*.c with clang's libFuzzer, ASan and UBSan, over a libtide
# built the same way in $(FUZZ_BUILD). Each runs FUZZ_SECONDS from its seeds in
# fuzz/corpus/<name>/; what it learns stays in $(FUZZ_BUILD)/corpus/<name>/ and a crash
# leaves $(FUZZ_BUILD)/crash-<name>-* and fails the target.
FUZZ_BUILD ?= $(BUILD)/fuzz
FUZZ_SECONDS ?= 60
FUZZ_NAMES := $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZ_CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
# The models come from the normal build's tool: a sub-make's own tool would rewrite the
# shared models/*.gguf under daemons that have them mapped.
fuzz: deps
	$(Q)$(MAKE) --no-print-directory models
	$(Q)$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang CUDA_HOME=/nonexistent CFLAGS="$(FUZZ_CFLAGS)" TIDE_FUZZ=1 \
	    $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)
	$(Q)for n in $(FUZZ_NAMES); do mkdir -p $(FUZZ_BUILD)/corpus/$$n; \
	    echo "== fuzz_$$n: $(FUZZ_SECONDS) s"; \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$(abspath fuzz/ubsan.supp) \
	    $(FUZZ_BUILD)/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	        -artifact_prefix=$(FUZZ_BUILD)/crash-$$n- $(FUZZ_BUILD)/corpus/$$n fuzz/corpus/$$n \
	        >$(FUZZ_BUILD)/fuzz_$$n.log 2>&1; rc=$$?; \
	    grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' $(FUZZ_BUILD)/fuzz_$$n.log; \
	    if [ $$rc -ne 0 ]; then tail -n 60 $(FUZZ_BUILD)/fuzz_$$n.log; exit 1; fi; done

# clang 14 rejects __builtin_cpu_supports("f16c"), so in the fuzz build the CPU backend, its
# VNNI, f16 and k-quant tiles and its attention (the math kernels, no input parsing) are
# compiled by gcc, uninstrumented.
ifeq ($(TIDE_FUZZ),1)
# UBSan halts on everything in the fuzz build but one check in the file that compiles
# stb_image.h: its shift exponents stay recoverable, so that fuzz/ubsan.supp's one entry for
# the JPEG bit reader (nothings/stb#1293, unfixed in Debian's libstb) applies; any other
# report still halts (halt_on_error=1).
$(BUILD)/obj/src/vision/image.o: override CFLAGS += -fsanitize-recover=shift-exponent
$(BUILD)/obj/src/engine/backend_cpu.o: override CC := gcc
$(BUILD)/obj/src/engine/backend_cpu.o: override CFLAGS := -O2 -g -std=c11 -D_GNU_SOURCE -pthread -MMD -MP -Isrc
$(BUILD)/obj/src/engine/cpu_quant_vnni.o: override CC := gcc
$(BUILD)/obj/src/engine/cpu_quant_vnni.o: override CFLAGS := -O2 -g -std=c11 -D_GNU_SOURCE -pthread -MMD -MP -Isrc
$(BUILD)/obj/src/engine/backend_cpu_attention.o: override CC := gcc
$(BUILD)/obj/src/engine/backend_cpu_attention.o: override CFLAGS := -O2 -g -std=c11 -D_GNU_SOURCE -pthread -MMD -MP -Isrc
$(BUILD)/obj/src/engine/cpu_f16.o: override CC := gcc
$(BUILD)/obj/src/engine/cpu_f16.o: override CFLAGS := -O2 -g -std=c11 -D_GNU_SOURCE -pthread -MMD -MP -Isrc
$(BUILD)/obj/src/engine/cpu_kquant.o: override CC := gcc
$(BUILD)/obj/src/engine/cpu_kquant.o: override CFLAGS := -O2 -g -std=c11 -D_GNU_SOURCE -pthread -MMD -MP -Isrc
endif
.PRECIOUS: $(BUILD)/obj/fuzz/%.o
$(BUILD)/fuzz_%: $(BUILD)/obj/fuzz/fuzz_%.o $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)

# Without the CUDA toolkit (issue 27): backend_cuda_none.c must stub every CUDA entry point, so
# the daemon and the GPU test binary link anywhere. `make test` (so .ci/run) builds this once with
# the toolkit hidden, as a machine that has it would otherwise never see a missing stub.
NOCUDA_BUILD ?= $(BUILD)/nocuda
.PHONY: nocuda
nocuda:
	$(Q)$(MAKE) --no-print-directory BUILD=$(NOCUDA_BUILD) CUDA_HOME=/nonexistent $(NOCUDA_BUILD)/tide $(NOCUDA_BUILD)/test-gpu
	$(Q)$(NOCUDA_BUILD)/test-gpu >/dev/null && echo "nocuda: daemon and GPU tests link without the CUDA toolkit"

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# The f16 / bf16 tensor-core tile (src/engine/cuda/gemm_f16_mma.cuh) run on the CPU by g++ against
# a host shim (tests/gpu/emu/f16_tile_emu.cpp): its index math checked without a GPU.
.PHONY: f16-tile-emu
$(BUILD)/f16-tile-emu: tests/gpu/emu/f16_tile_emu.cpp tests/gpu/emu/engine/cuda/mma_f16.cuh src/engine/cuda/gemm_f16_mma.cuh $(BUILD)/libtide.a
	@echo "  LINK  $@"
	$(Q)$(CXX) -std=c++20 -O1 -Wall -Wno-unknown-pragmas -Itests/gpu/emu -Isrc -o $@ $< $(BUILD)/libtide.a -lm -pthread

f16-tile-emu: $(BUILD)/f16-tile-emu
	$(Q)$(BUILD)/f16-tile-emu

# Device code of kernels written without a GPU, compiled by g++ against the host stand-in
# tests/gpu/emu/engine/cuda/common.cuh (threads, barriers, exchanged warp shuffles) and run over
# whole small grids against plain references. g++ has no static array of unknown size, so a
# header's dynamic `extern __shared__ [__align__(n)] T name[];` is rewritten into a pointer to the
# emulator's shared block in a copy under $(BUILD)/emu, and each static `__shared__ [__align__(n)]
# T a[N];` (or `T a[N], b[M];`) gets `EMU_SHARED(a);` after it on its line, which poisons it before
# every CTA (the rest is the file as it is; the greps fail the build if a rewrite did not happen).
# That copy comes first on the include path.
EMU_CXX = $(CXX) -std=c++20 -O1 -Wall -Wno-unknown-pragmas -I$(BUILD)/emu -Itests/gpu/emu -Isrc
EMU_DEPS = tests/gpu/emu/emu_launch.h tests/gpu/emu/ref_attention.h tests/gpu/emu/engine/cuda/common.cuh src/engine/cuda/common_device.cuh \
           $(BUILD)/libtide.a
$(BUILD)/emu/engine/cuda/%.cuh: src/engine/cuda/%.cuh Makefile
	@mkdir -p $(@D)
	$(Q)sed -e 's/^\( *\)extern __shared__ \(__align__([0-9]*) \)\{0,1\}\([a-z0-9_]*\) \([a-z_]*\)\[\];/\1\3 *\4 = (\3 *)emu_dyn_smem;/' \
	        -e 's/^\( *__shared__ \(__align__([0-9]*) \)\{0,1\}[a-z0-9_]* \([a-z0-9_]*\)\[[^]]*\];\)/\1 EMU_SHARED(\3);/' \
	        -e 's/^\( *__shared__ [a-z0-9_]* \([a-z0-9_]*\)\[[^]]*\], \([a-z0-9_]*\)\[[^]]*\];\)/\1 EMU_SHARED(\2); EMU_SHARED(\3);/' \
	        $< > $@.tmp
	$(Q)! grep -q 'extern __shared__' $@.tmp && ! grep '^ *__shared__' $@.tmp | grep -qv EMU_SHARED && mv $@.tmp $@

# The emulators, each its .cpp (the prerequisite ending in .cpp) and the device headers it runs:
#   kq-tile-emu       mmq_kquant.cu's k-quant tensor-core tiles, their x quantisation and split-K reduce
#   decode-attn-emu   the split decode attention (TIDE_DECODE_ATTN_SPLIT)
#   decode-qonce-emu  TIDE_DECODE_QONCE's decode products against the old kernels
#   paged-attn-emu    the paged decode attention against the contiguous one
#   moe-group-emu     TIDE_MOE_ROWS_MMA's grouping of routed pairs by expert
#   full-mma-emu      TIDE_VISION_TC's f16 tensor-core vision attention
#   sinks-attn-emu    gpt-oss's sink and window attention over f16 and paged caches
EMUS = kq-tile-emu decode-attn-emu decode-qonce-emu paged-attn-emu moe-group-emu full-mma-emu sinks-attn-emu
$(BUILD)/kq-tile-emu: tests/gpu/emu/kq_tile_emu.cpp $(BUILD)/emu/engine/cuda/kq_mma_kernel.cuh \
                      src/engine/cuda/mma_kq_tile.cuh src/engine/cuda/mma_tile.cuh src/engine/cuda/kquant.cuh \
                      src/engine/cuda/mmq.cuh tests/gpu/emu/engine/cuda/mma_q.cuh
$(BUILD)/decode-attn-emu: tests/gpu/emu/attn_decode_emu.cpp $(BUILD)/emu/engine/cuda/attention_decode.cuh
$(BUILD)/decode-qonce-emu: tests/gpu/emu/qonce_emu.cpp $(BUILD)/emu/engine/cuda/matmul_decode.cuh \
                           $(BUILD)/emu/engine/cuda/mmvq_fused.cuh src/engine/cuda/mmq.cuh
$(BUILD)/paged-attn-emu: tests/gpu/emu/paged_attn_emu.cpp $(BUILD)/emu/engine/cuda/attention_chunk.cuh \
                         src/engine/cuda/attention.cuh tests/gpu/emu/engine/cuda/mma_q.cuh
$(BUILD)/moe-group-emu: tests/gpu/emu/moe_group_emu.cpp $(BUILD)/emu/engine/cuda/moe_group.cuh
$(BUILD)/full-mma-emu: tests/gpu/emu/full_mma_emu.cpp $(BUILD)/emu/engine/cuda/attention_full_mma.cuh \
                       tests/gpu/emu/engine/cuda/mma_16816.cuh
$(BUILD)/sinks-attn-emu: tests/gpu/emu/sinks_attn_emu.cpp $(BUILD)/emu/engine/cuda/attention_sinks.cuh \
                         src/engine/cuda/attention.cuh
$(addprefix $(BUILD)/,$(EMUS)): $(EMU_DEPS)
	@echo "  LINK  $@"
	$(Q)$(EMU_CXX) -o $@ $(filter %.cpp,$^) $(BUILD)/libtide.a -lm -pthread

.PHONY: $(EMUS)
$(EMUS): %: $(BUILD)/%
	$(Q)$(BUILD)/$@
