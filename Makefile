# DeadPool build. `make` builds ./deadpool, the libraries and the examples; `make test` builds
# and runs the test suite; `make install PREFIX=DIR` installs header, libraries, binary and
# pkg-config file. All C is C11 and must stay warning-free with -Wall -Wextra; the only C++ is
# the Gloo shim (src/data/comm_gloo*.cc).
#
#   include/       the public API (deadpool.h)
#   src/runtime/   the runtime behind deadpool.h: a process's life in a job \
#   src/data/      the data path: snapshots, replicas, checkpoints,          |
#                  the authenticated collectives                             | libdeadpool.a / .so
#   src/control/   the control-plane client: Redis keys and values,         | (layers, the
#                  decisions, reports, events                                | highest first)
#   src/job/       the job's model: options, the --inject grammar, secret    |
#   src/common/    clocks, logging, files, option tables (library and trainer alike)
#   src/tool/      the `deadpool` program: launcher, coordinator, decisions, embedded Redis,
#                  metrics server, Slurm, report   -> build/libdptool.a + main.c, `deadpool` only
#   src/gpt2/      the built-in GPT-2 trainer, a client of deadpool.h
#   examples/   more clients of deadpool.h      -> build/examples/NAME (examples/torch: PyTorch)
#   python/     the `deadpool` Python package (ctypes over libdeadpool.so; deadpool.torch)
CC      ?= cc
CXX     ?= c++
# Portable by default: the library's hot paths pick their instructions at run time (CRC32C
# here; Poly1305, memcpy and Gloo's algorithms in their libraries; the element-wise reductions
# handed to Gloo were measured at no cost). Only the built-in trainer's own loops (layernorm,
# attention, GELU, AdamW: what OpenBLAS does not do) are built for this CPU, where it was
# measured to pay (docs/BENCHMARKS.md, -march=native); GPT2_ARCH= builds them portable too
# (`make install` does).
OPT     ?= -O2
GPT2_ARCH ?= -march=native
PREFIX  ?= /usr/local
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -pthread -I/usr/include/hiredis -Iinclude -MMD -MP
CXXFLAGS ?= $(OPT) -g
CXXFLAGS += -std=c++17 -Wall -Wextra -pthread -I/usr/include/hiredis -MMD -MP
# The library's objects go into the .so as well: position-independent, but without semantic
# interposition, so calls within the library still inline. The trainer is not PIC: -fPIC
# alone keeps the compiler from inlining non-static functions (its layer helpers).
PIC     = -fPIC -fno-semantic-interposition -fvisibility=hidden
# The version, as include/deadpool.h states it: the soname's major and the pkg-config file's.
VERSION := $(shell sed -n 's/^\#define DEADPOOL_VERSION "\(.*\)"/\1/p' include/deadpool.h)
MAJOR   := $(firstword $(subst ., ,$(VERSION)))
LIB_LIBS = -lgloo -lhiredis -lsodium -lstdc++ -lm -pthread
LDLIBS  = $(LIB_LIBS) -lmicrohttpd -lopenblas -ljansson

BUILD    = build
# The library's layers, lowest first: each folder sees its own headers and those of the layers
# below it, never above (tests/e2e_code.sh checks the includes too).
#   common  clocks, logging, files, option tables
#   job     the job's model: its options (config), the --inject grammar, its secret and keys
#   control the control plane's client (Redis keys and values, decisions, events)
#   data    snapshots, replicas, checkpoints, the authenticated collectives
#   runtime deadpool.h's implementation
LIB_DIRS = job control data runtime
INC_job     = -Isrc/job -Isrc/common
INC_control = -Isrc/control $(INC_job)
INC_data    = -Isrc/data $(INC_control)
INC_runtime = -Isrc/runtime $(INC_data)
LIB_INC     = $(INC_runtime)
GPT2_INC = -Isrc/gpt2 -Isrc/common
# What a training process needs is the library; what only the `deadpool` program runs is not
# (an application links no HTTP server and no launcher).
TOOL_SRC = $(filter-out src/tool/main.c,$(wildcard src/tool/*.c))
TOOL_OBJ = $(patsubst src/%.c,$(BUILD)/%.o,$(TOOL_SRC))
LIB_OBJ  = $(patsubst src/%.c,$(BUILD)/%.o,$(wildcard $(patsubst %,src/%/*.c,$(LIB_DIRS)) src/common/*.c)) \
           $(patsubst src/%.cc,$(BUILD)/%.o,$(wildcard $(patsubst %,src/%/*.cc,$(LIB_DIRS))))
GPT2_OBJ = $(patsubst src/%.c,$(BUILD)/%.o,$(wildcard src/gpt2/*.c))
CLI_OBJ  = $(BUILD)/tool/main.o
EXAMPLES = $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
TESTS    = $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c tests/tool_*.c))

# The `deadpool` program; `make install` builds another, portable, one (see there).
BIN     ?= deadpool

all: $(BIN) $(BUILD)/libdeadpool.so $(EXAMPLES)

$(BIN): $(CLI_OBJ) $(GPT2_OBJ) $(BUILD)/libdptool.a $(BUILD)/libdeadpool.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Archives are written afresh: `ar r` would keep a member whose source moved elsewhere.
$(BUILD)/libdeadpool.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libdptool.a: $(TOOL_OBJ)
	rm -f $@ && ar rcs $@ $^

# --no-undefined: the library must not reach into the tool's objects.
$(BUILD)/libdeadpool.so: $(LIB_OBJ) src/runtime/libdeadpool.map
	$(CC) -shared -Wl,--no-undefined -Wl,-soname,libdeadpool.so.$(MAJOR) -Wl,--version-script=src/runtime/libdeadpool.map -o $@ $(LIB_OBJ) $(LIB_LIBS)

# The library's directories, one rule each (PIC: they go into the .so).
define LIB_RULES
$$(BUILD)/$(1)/%.o: src/$(1)/%.c
	@mkdir -p $$(@D)
	$$(CC) $$(CFLAGS) $$(PIC) $$(INC_$(1)) -c -o $$@ $$<

$$(BUILD)/$(1)/%.o: src/$(1)/%.cc
	@mkdir -p $$(@D)
	$$(CXX) $$(CXXFLAGS) $$(PIC) $$(INC_$(1)) -c -o $$@ $$<
endef
$(foreach d,$(LIB_DIRS),$(eval $(call LIB_RULES,$(d))))

# The tool sees the library's headers too (it is built on the library).
$(BUILD)/tool/%.o: src/tool/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_INC) -Isrc/tool $(GPT2_INC) -c -o $@ $<

# common/ goes into the library (PIC) and is linked into the trainer from it.
$(BUILD)/common/%.o: src/common/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(PIC) -Isrc/common -c -o $@ $<

$(BUILD)/gpt2/%.o: src/gpt2/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(GPT2_ARCH) $(GPT2_INC) -c -o $@ $<

# Examples see only the public header.
$(BUILD)/examples/%: examples/%.c $(BUILD)/libdeadpool.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libdeadpool.a $(LIB_LIBS)

$(BUILD)/tests/%: tests/%.c $(GPT2_OBJ) $(BUILD)/libdptool.a $(BUILD)/libdeadpool.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_INC) -Isrc/tool $(GPT2_INC) -o $@ $< $(GPT2_OBJ) $(BUILD)/libdptool.a $(BUILD)/libdeadpool.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# Benchmarks of the project's own code link its objects (the optimizer, util's clock and
# huge-page allocator).
$(BUILD)/bench/copy_floor: bench/copy_floor.c $(BUILD)/common/util.o
$(BUILD)/bench/update_place: bench/update_place.c $(BUILD)/gpt2/optimizer.o $(BUILD)/common/util.o
$(BUILD)/bench/copy_floor $(BUILD)/bench/update_place:
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(GPT2_INC) -o $@ $(filter %.c %.o,$^) -lm
# The replica payload's MAC against the CRC (replica.c).
$(BUILD)/bench/payload_mac: bench/payload_mac.c $(BUILD)/data/checksum.o $(BUILD)/common/util.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_INC) -o $@ $^ -lsodium -lm

# Fuzzing (docs/RELIABILITY.md). `make fuzz` builds the libFuzzer harnesses tests/fuzz/fuzz_NAME.c
# with clang under ASan+UBSan into build/fuzz/fuzz_NAME; tests/fuzz/run.sh [SECONDS] runs them.
# Without clang, `make fuzz-replay` builds the same harnesses with $(CC) and a plain main
# (build/fuzz/replay_NAME FILE...) that replays inputs. `make fuzz-corpus` regenerates the seeds.
FUZZ_CC     ?= clang
FUZZ_SAN     = -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CFLAGS  = -O1 -g -fno-omit-frame-pointer -std=c11 -D_GNU_SOURCE -Wall -Wextra -pthread -MMD -MP \
               -I/usr/include/hiredis -Iinclude $(LIB_INC) -Isrc/tool $(GPT2_INC) $(FUZZ_SAN)
FUZZ_SRC     = $(wildcard src/common/*.c) src/data/checkpoint.c src/data/checksum.c src/data/comm_auth.c $(wildcard src/control/control*.c) src/control/redis_url.c src/control/redis_connect.c \
               src/control/events.c src/job/secret.c \
               src/data/generation.c src/control/protocol.c src/control/recovery.c $(wildcard src/data/replica*.c) \
               src/gpt2/data.c src/gpt2/layers.c src/gpt2/model.c src/gpt2/modelfile.c
FUZZ_NAMES   = $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_LIBS    = $(LDLIBS)

fuzz: $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZ_NAMES))

fuzz-replay: $(patsubst %,$(BUILD)/fuzz/replay_%,$(FUZZ_NAMES))

fuzz-corpus: $(BUILD)/fuzz/gen_corpus
	rm -rf tests/fuzz/corpus && $(BUILD)/fuzz/gen_corpus tests/fuzz/corpus

$(BUILD)/fuzz/obj/%.o: src/%.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(BUILD)/fuzz/libfuzzdp.a: $(patsubst src/%.c,$(BUILD)/fuzz/obj/%.o,$(FUZZ_SRC))
	ar rcs $@ $^

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.h $(BUILD)/fuzz/libfuzzdp.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -Wl,--wrap=alloc_huge -o $@ $< $(BUILD)/fuzz/libfuzzdp.a $(FUZZ_LIBS)

$(BUILD)/fuzz/replay-obj/%.o: src/%.c
	@mkdir -p $(@D)
	$(CC) $(FUZZ_CFLAGS) -c -o $@ $<

$(BUILD)/fuzz/libreplaydp.a: $(patsubst src/%.c,$(BUILD)/fuzz/replay-obj/%.o,$(FUZZ_SRC))
	ar rcs $@ $^

$(BUILD)/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.h tests/fuzz/replay_main.c $(BUILD)/fuzz/libreplaydp.a
	$(CC) $(FUZZ_CFLAGS) -Wl,--wrap=alloc_huge -o $@ $< tests/fuzz/replay_main.c $(BUILD)/fuzz/libreplaydp.a $(FUZZ_LIBS)

$(BUILD)/fuzz/gen_corpus: tests/fuzz/gen_corpus.c $(GPT2_OBJ) $(BUILD)/libdptool.a $(BUILD)/libdeadpool.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_INC) -Isrc/tool $(GPT2_INC) -o $@ $< $(GPT2_OBJ) $(BUILD)/libdptool.a $(BUILD)/libdeadpool.a $(LDLIBS)

# What is installed may run on another CPU than the one that built it: it is built again
# with the trainer portable too, in build/portable.
# The pkg-config file names PREFIX, so it is written at install time, never reused.
PORTABLE = $(BUILD)/portable
install:
	$(MAKE) BUILD=$(PORTABLE) GPT2_ARCH= BIN=$(PORTABLE)/deadpool $(PORTABLE)/deadpool $(PORTABLE)/libdeadpool.so $(PORTABLE)/libdeadpool.a
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(PORTABLE)/deadpool $(DESTDIR)$(PREFIX)/bin/deadpool
	install -m 644 include/deadpool.h $(DESTDIR)$(PREFIX)/include/deadpool.h
	install -m 644 $(PORTABLE)/libdeadpool.a $(DESTDIR)$(PREFIX)/lib/libdeadpool.a
	install -m 755 $(PORTABLE)/libdeadpool.so $(DESTDIR)$(PREFIX)/lib/libdeadpool.so.$(MAJOR)
	ln -sf libdeadpool.so.$(MAJOR) $(DESTDIR)$(PREFIX)/lib/libdeadpool.so
	install -d $(DESTDIR)$(PREFIX)/lib/python3/dist-packages/deadpool
	install -m 644 python/deadpool/*.py $(DESTDIR)$(PREFIX)/lib/python3/dist-packages/deadpool/
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: deadpool\nDescription: in-memory fault tolerance for training loops\nVersion: %s\nLibs: -L$${libdir} -ldeadpool\nLibs.private: %s\nCflags: -I$${includedir}\n' \
	  '$(PREFIX)' '$(VERSION)' '$(LIB_LIBS)' >$(DESTDIR)$(PREFIX)/lib/pkgconfig/deadpool.pc

tests: all $(TESTS)

test: deps tests
	tests/run_all.sh

# Installs the Debian packages the build and the tests need (no-op when present).
deps:
	@scripts/install-deps.sh --test

clean:
	rm -rf $(BUILD) deadpool

.PHONY: all tests test deps clean install fuzz fuzz-replay fuzz-corpus
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
