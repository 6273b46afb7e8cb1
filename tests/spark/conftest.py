"""A real local SparkSession for the Spark connector tests (session-scoped: one JVM for all).

Spark needs Java 17+ and the `spark` extra (`pyspark>=4.0`, pyarrow, numpy); without pyspark or
without java these tests are skipped, not failed.

Starting Spark's JVM is a good part of these tests' time (class loading and JIT: ~15 s of CPU per
JVM here, three JVMs: this session and the two example subprocesses). C1-only JIT
(`TieredStopAtLevel=1`, fine for short jobs) is always on. With `DELAYD_SPARK_CDS=1` the tests also
use a class-data-sharing archive of the classes Spark loads, which makes each JVM start 2-3x faster:
the first such session records it when its JVM exits (`-XX:ArchiveClassesAtExit`, ~170 MB, ~20 s
once, kept in pytest's cache dir `.pytest_cache/d/`), later JVMs map it. Off by default because a
fresh checkout (CI) would only pay the recording. A stale or mismatched archive is ignored by the
JVM (`-Xshare:auto`): the worst case is the slow start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0")
pytest.importorskip("pyarrow")
pytest.importorskip("numpy")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java 17+ (no java on PATH, no JAVA_HOME)", allow_module_level=True)

from tests.support.daemon import DaemonProcess  # noqa: E402

# Quiet JVM logging (CDS prints a warning per class it cannot archive) except errors.
JVM_QUIET = "-Xlog:disable -Xlog:all=error:stderr"
TEST_JAVA_OPTIONS = f"-XX:TieredStopAtLevel=1 -XX:+UseParallelGC {JVM_QUIET}"

_archive: dict[str, Path | None] = {}  # "path": where this JVM/pyspark pair's archive lives


def spark_env() -> dict[str, str]:
    """Environment for a process that starts Spark on loopback with this interpreter's workers."""
    return {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def archive_path(config: pytest.Config) -> Path | None:
    """None unless DELAYD_SPARK_CDS=1 and pytest's cache is on: then no archive is used or made."""
    if "path" not in _archive:
        import pyspark

        cache = getattr(config, "cache", None)
        if cache is None or os.environ.get("DELAYD_SPARK_CDS", "") in ("", "0"):
            _archive["path"] = None
            return None

        home = os.environ.get("JAVA_HOME")
        exe = os.path.join(home, "bin", "java") if home else "java"
        java = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=60).stderr
        key = hashlib.sha256(f"{java}|{pyspark.__version__}|{pyspark.__file__}".encode()).hexdigest()[:16]
        _archive["path"] = Path(cache.mkdir("delayd-spark-cds")) / f"spark-{key}.jsa"
    return _archive["path"]


def java_options(config: pytest.Config) -> str:
    """JVM options for a test Spark driver: with the class archive once there is one."""
    path = archive_path(config)
    return f"{TEST_JAVA_OPTIONS} -XX:SharedArchiveFile={path}" if path and path.is_file() else TEST_JAVA_OPTIONS


@pytest.fixture(scope="session")
def spark(pytestconfig: pytest.Config) -> Iterator[Any]:
    os.environ.update(spark_env())
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from delayd.spark import register

    archive = archive_path(pytestconfig)
    recording = None
    options = java_options(pytestconfig)
    if archive is not None and not archive.is_file():
        recording = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
        options += f" -XX:ArchiveClassesAtExit={recording}"
    session = (SparkSession.builder.master("local[2]").appName("delayd-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.extraJavaOptions", options)
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
    gateway = SparkContext._gateway
    if recording is not None and gateway is not None and getattr(gateway, "proc", None) is not None:
        # The JVM exits (and writes the archive) when its stdin closes; then keep the archive.
        gateway.shutdown()
        gateway.proc.stdin.close()
        rc = gateway.proc.wait(180)
        SparkContext._gateway = None
        SparkContext._jvm = None
        if rc == 0 and recording.is_file() and archive is not None:
            os.replace(recording, archive)
        else:
            recording.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon per test module; tests use their own topics."""
    d = DaemonProcess(tmp_path_factory.mktemp("spark-daemon") / "data").start()
    yield d
    d.stop()
