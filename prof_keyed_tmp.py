import asyncio, tempfile, time, sys, subprocess, signal
from pathlib import Path
import psutil
from tests.support.daemon import DaemonProcess
from bench.produce_keys_bench import produce
spy = len(sys.argv) > 1
with tempfile.TemporaryDirectory() as tmp:
    d = DaemonProcess(Path(tmp) / "data").start()
    p = psutil.Process(d.proc.pid)
    if spy:
        sp = subprocess.Popen([".venv/bin/py-spy", "record", "-p", str(d.proc.pid), "-r", "500", "-f", "raw", "-o", "/tmp/keyed.txt", "--threads"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); time.sleep(1)
    for kind in ("keyless", "keyed", "keyless", "keyed"):
        t0 = {t.id: t.user_time + t.system_time for t in p.threads()}
        rate = asyncio.run(produce(d.url, 200_000, None if kind == "keyless" else f"k{time.time()}", 8))
        t1 = {t.id: t.user_time + t.system_time for t in p.threads()}
        per = sorted(((t1[k] - t0.get(k, 0)) / 200_000 * 1e6 for k in t1), reverse=True)
        print(kind, f"{rate:,.0f} msg/s", "thread CPU us/msg:", [round(x, 2) for x in per if x > 0.01])
        time.sleep(2.5)
    if spy:
        sp.send_signal(signal.SIGINT); sp.wait()
    d.stop()
