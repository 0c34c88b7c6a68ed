"""The `deadpool` Python package: pure Python over libdeadpool.so (ctypes), no compiler needed.
`pip install ./python` (offline: setuptools comes from the system) or `make install`."""
from setuptools import setup

setup(
    name="deadpool",
    version="1.1.0",  # include/deadpool.h DEADPOOL_VERSION (tests/e2e_python.sh checks)
    description="DeadPool: in-memory fault tolerance for training loops (binding of libdeadpool)",
    packages=["deadpool"],
    python_requires=">=3.9",
)
