"""The compiled batch core, built by every `pip install` (everything else is in pyproject.toml).

`storage/_batch.c` becomes `delayd.storage._batch`; `storage/batch.py` is its Python reference.
`DELAYD_CFLAGS` adds compiler flags (the AddressSanitizer run of the differential tests uses it).
"""

import os
import shlex

from setuptools import Extension, setup

FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

setup(ext_modules=[Extension("delayd.storage._batch", ["storage/_batch.c"],
                             extra_compile_args=FLAGS + shlex.split(os.environ.get("DELAYD_CFLAGS", "")),
                             extra_link_args=shlex.split(os.environ.get("DELAYD_LDFLAGS", "")))])
