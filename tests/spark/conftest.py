"""A real local SparkSession for the Spark connector tests (session-scoped: one JVM for all).

Spark needs Java 17+ and `pip install 'pyspark>=4.0' pyarrow numpy` (the `spark` extra); without
pyspark these tests are skipped, not failed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.0")
pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from tests.support.daemon import DaemonProcess  # noqa: E402

# Faster JVM start for short test jobs (C1 only); long jobs (bench/spark_bench.py) leave it out.
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC"


def spark_env() -> dict[str, str]:
    """Environment for a process that starts Spark on loopback with this interpreter's workers."""
    return {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    from client.spark import register

    session = (SparkSession.builder.master("local[2]").appName("delayd-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.extraJavaOptions", TEST_JAVA_OPTIONS)
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon per test module; tests use their own topics."""
    d = DaemonProcess(tmp_path_factory.mktemp("spark-daemon") / "data").start()
    yield d
    d.stop()


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    return tmp_path
