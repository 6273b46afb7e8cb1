import asyncio, tempfile, time, sys, subprocess, signal
from pathlib import Path
import psutil, aiohttp, msgpack
from tests.support.daemon import DaemonProcess
async def main(url, proc, n, conns=64):
    H={"Content-Type": "application/msgpack"}
    body = msgpack.packb({"messages": [{"body": b"x"*100, "delay_ms": 3600000}]})
    async with aiohttp.ClientSession() as s:
        left = [n]
        async def w():
            while left[0] > 0:
                left[0] -= 1
                async with s.post(url + "/v1/topics/t/messages", data=body, headers=H) as r:
                    await r.read(); assert r.status == 200
        a = proc.cpu_times(); t = time.perf_counter()
        await asyncio.gather(*(w() for _ in range(conns)))
        b = proc.cpu_times()
        print(f"single produce: {(b.user-a.user+b.system-a.system)/n*1e6:.0f} us daemon CPU a request, {n/(time.perf_counter()-t):.0f} req/s")
spy = len(sys.argv) > 1
with tempfile.TemporaryDirectory() as tmp:
    d = DaemonProcess(Path(tmp) / "data").start()
    p = psutil.Process(d.proc.pid)
    if spy:
        sp = subprocess.Popen([".venv/bin/py-spy", "record", "-p", str(d.proc.pid), "-r", "500", "-f", "raw", "-o", "/tmp/single.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); time.sleep(1)
    for _ in range(2): asyncio.run(main(d.url, p, 10000))
    if spy:
        sp.send_signal(signal.SIGINT); sp.wait()
    d.stop()
