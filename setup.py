"""The compiled batch core, built by every `pip install` (everything else is in pyproject.toml).

`storage/_batch.c` (the module table) and the stage files beside it (`storage/batch_*.c`, sharing
`storage/batch_core.h`) become `delayd.storage._batch`; `storage/batch.py` is its Python reference.
`DELAYD_CFLAGS` adds compiler flags (the AddressSanitizer run of the differential tests uses it).
"""

import os
import shlex

from setuptools import Extension, setup

FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
SOURCES = ["storage/_batch.c", "storage/batch_util.c", "storage/batch_produce.c", "storage/batch_timer.c",
           "storage/batch_release.c", "storage/batch_pull.c", "storage/batch_keyseq.c", "storage/batch_keys.c",
           "storage/batch_keyrows.c", "storage/batch_sync.c", "storage/batch_recovery.c"]

setup(ext_modules=[Extension("delayd.storage._batch", SOURCES, depends=["storage/batch_core.h"],
                             extra_compile_args=FLAGS + shlex.split(os.environ.get("DELAYD_CFLAGS", "")),
                             extra_link_args=shlex.split(os.environ.get("DELAYD_LDFLAGS", "")))])
