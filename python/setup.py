# The cffi extension hq._native is built against the installed hq (pkg-config hqcore):
# hq/_build.py extracts its declarations from the installed headers. build_ext always
# recompiles: pip builds a local directory in place (python/build), and an object left there
# from a build against another hq (other flags, other rpath) must not be reused.
import sys

from setuptools import setup

try:
    import cffi  # noqa: F401 -- its setuptools plugin is what builds cffi_modules
except ImportError:
    # without it setuptools ignores cffi_modules and installs a package with no extension
    sys.exit("hq: building the Python package needs cffi (pip install cffi)")

setup(cffi_modules=["hq/_build.py:ffibuilder"], options={"build_ext": {"force": True}})
