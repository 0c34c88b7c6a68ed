# DeadPool build. `make` builds ./deadpool, the libraries and the examples; `make test` builds
# and runs the test suite; `make install PREFIX=DIR` installs header, libraries, binary and
# pkg-config file. All C is C11 and must stay warning-free with -Wall -Wextra; the only C++ is
# the Gloo shim (src/lib/comm_gloo.cc).
#
#   include/    the public API (deadpool.h)
#   src/lib/    the library: runtime behind deadpool.h, snapshots, replicas, control plane,
#               coordinator, launcher           -> libdeadpool.a / libdeadpool.so
#   src/common/ clocks, logging, files, option tables (library and trainer alike)
#   src/gpt2/   the built-in GPT-2 trainer, a client of deadpool.h
#   src/cli/    the `deadpool` command
#   examples/   more clients of deadpool.h      -> build/examples/NAME
CC      ?= cc
CXX     ?= c++
OPT     ?= -O2 -march=native
PREFIX  ?= /usr/local
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -pthread -fPIC -I/usr/include/hiredis -Iinclude -MMD -MP
CXXFLAGS ?= $(OPT) -g
CXXFLAGS += -std=c++17 -Wall -Wextra -pthread -fPIC -I/usr/include/hiredis -MMD -MP
LIB_LIBS = -lgloo -lhiredis -lstdc++ -lm -pthread
LDLIBS  = $(LIB_LIBS) -lopenblas

BUILD    = build
LIB_INC  = -Isrc/lib -Isrc/common
GPT2_INC = -Isrc/gpt2 -Isrc/common
LIB_OBJ  = $(patsubst src/%.c,$(BUILD)/%.o,$(wildcard src/lib/*.c src/common/*.c)) \
           $(patsubst src/%.cc,$(BUILD)/%.o,$(wildcard src/lib/*.cc))
GPT2_OBJ = $(patsubst src/%.c,$(BUILD)/%.o,$(wildcard src/gpt2/*.c))
EXAMPLES = $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
TESTS    = $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c tests/tool_*.c))

all: deadpool $(BUILD)/libdeadpool.so $(EXAMPLES)

deadpool: $(BUILD)/cli/main.o $(GPT2_OBJ) $(BUILD)/libdeadpool.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libdeadpool.a: $(LIB_OBJ)
	ar rcs $@ $^

$(BUILD)/libdeadpool.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libdeadpool.so.1 -o $@ $^ $(LIB_LIBS)

$(BUILD)/lib/%.o: src/lib/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_INC) -c -o $@ $<

$(BUILD)/lib/%.o: src/lib/%.cc
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $(LIB_INC) -c -o $@ $<

$(BUILD)/common/%.o: src/common/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Isrc/common -c -o $@ $<

$(BUILD)/gpt2/%.o: src/gpt2/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(GPT2_INC) -c -o $@ $<

$(BUILD)/cli/%.o: src/cli/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_INC) $(GPT2_INC) -c -o $@ $<

# Examples see only the public header.
$(BUILD)/examples/%: examples/%.c $(BUILD)/libdeadpool.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libdeadpool.a $(LIB_LIBS)

$(BUILD)/tests/%: tests/%.c $(GPT2_OBJ) $(BUILD)/libdeadpool.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_INC) $(GPT2_INC) -o $@ $< $(GPT2_OBJ) $(BUILD)/libdeadpool.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# The pkg-config file names PREFIX, so it is written at install time, never reused.
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 deadpool $(DESTDIR)$(PREFIX)/bin/deadpool
	install -m 644 include/deadpool.h $(DESTDIR)$(PREFIX)/include/deadpool.h
	install -m 644 $(BUILD)/libdeadpool.a $(DESTDIR)$(PREFIX)/lib/libdeadpool.a
	install -m 755 $(BUILD)/libdeadpool.so $(DESTDIR)$(PREFIX)/lib/libdeadpool.so.1
	ln -sf libdeadpool.so.1 $(DESTDIR)$(PREFIX)/lib/libdeadpool.so
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: deadpool\nDescription: in-memory fault tolerance for training loops\nVersion: 1.0\nLibs: -L$${libdir} -ldeadpool\nLibs.private: %s\nCflags: -I$${includedir}\n' \
	  '$(PREFIX)' '$(LIB_LIBS)' >$(DESTDIR)$(PREFIX)/lib/pkgconfig/deadpool.pc

tests: all $(TESTS)

test: deps tests
	tests/run_all.sh

# Installs the Debian packages the build and the tests need (no-op when present).
deps:
	@scripts/install-deps.sh

clean:
	rm -rf $(BUILD) deadpool

.PHONY: all tests test deps clean install
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
