# DeadPool build. `make` builds ./deadpool; `make test` builds and runs the test suite.
# All C is C11 and must stay warning-free with -Wall -Wextra; the only C++ is the Gloo shim.
CC      ?= cc
CXX     ?= c++
OPT     ?= -O2 -march=native
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -pthread -I/usr/include/hiredis -MMD -MP
CXXFLAGS ?= $(OPT) -g
CXXFLAGS += -std=c++17 -Wall -Wextra -pthread -I/usr/include/hiredis -MMD -MP
LDLIBS  = -lgloo -lhiredis -lopenblas -lstdc++ -lm -pthread

BUILD   = build
LIB_C   = $(filter-out src/main.c,$(wildcard src/*.c))
LIB_CC  = $(wildcard src/*.cc)
LIB_OBJ = $(LIB_C:src/%.c=$(BUILD)/%.o) $(LIB_CC:src/%.cc=$(BUILD)/%.o)
TESTS   = $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c tests/tool_*.c))

all: deadpool

deadpool: $(BUILD)/main.o $(BUILD)/libdeadpool.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libdeadpool.a: $(LIB_OBJ)
	ar rcs $@ $^

$(BUILD)/%.o: src/%.c | $(BUILD)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: src/%.cc | $(BUILD)
	$(CXX) $(CXXFLAGS) -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(BUILD)/libdeadpool.a | $(BUILD)
	@mkdir -p $(BUILD)/tests
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(BUILD)/libdeadpool.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c | $(BUILD)
	@mkdir -p $(BUILD)/bench
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

$(BUILD):
	mkdir -p $(BUILD)

tests: deadpool $(TESTS)

test: deps tests
	tests/run_all.sh

# Installs the Debian packages the build and the tests need (no-op when present).
deps:
	@scripts/install-deps.sh

clean:
	rm -rf $(BUILD) deadpool

.PHONY: all tests test deps clean
-include $(wildcard $(BUILD)/*.d $(BUILD)/tests/*.d)
