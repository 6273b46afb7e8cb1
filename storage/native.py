"""Which implementation of the batch core runs: the compiled one, or the Python reference.

`compiled()` is the compiled module `delayd.storage._batch` (built from storage/_batch.c and the
storage/batch_*.c stage files by every `pip install`), or None when it is not built or `DELAYD_PURE=1` is set — then every batch function
runs its Python reference (storage/batch.py, and `scan_buffer_py` in storage/commitlog.py). This
module imports nothing of the storage engine, so any module may ask it without an import cycle.

The compiled module is looked up in `sys.modules`, never kept in a global here: the Spark data
source ships this package's code to its workers by value (cloudpickle), and a compiled module
reachable from a global would be shipped as if it were Python. A worker imports it itself, when
it has it.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from types import ModuleType

log = logging.getLogger("delayd.storage")

NAME = "delayd.storage._batch"
_tried_in = 0  # the process that tried the import (a forked or shipped copy tries again)


def compiled() -> ModuleType | None:
    global _tried_in
    if os.environ.get("DELAYD_PURE") == "1":
        return None
    module = sys.modules.get(NAME)
    if module is None and _tried_in != os.getpid():
        _tried_in = os.getpid()
        try:
            module = importlib.import_module(NAME)
        except ImportError as e:  # pragma: no cover - the build compiles it; say so if it did not
            log.warning("compiled batch core unavailable (%s); using the Python reference", e)
    return module
