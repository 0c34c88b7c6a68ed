#!/usr/bin/env bash
# e2e_python.sh — the Python binding's unit tests (tests/python/test_binding.py) under Debian's
# interpreter, which sees Debian's numpy and torch.
cd "$(dirname "$0")/.." || exit 2
exec timeout -k 5 500 /usr/bin/python3 tests/python/test_binding.py
