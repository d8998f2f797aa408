# The cffi extension hq._native is built against the installed hq (pkg-config hqcore):
# hq/_build.py extracts its declarations from the installed headers.
from setuptools import setup

setup(cffi_modules=["hq/_build.py:ffibuilder"])
