import asyncio, tempfile, time, sys
from pathlib import Path
import psutil, aiohttp, msgpack
from tests.support.daemon import DaemonProcess
async def main(url, proc, path):
    async with aiohttp.ClientSession() as s:
        q = [path] * 4000
        async def w():
            while q:
                p = q.pop()
                async with s.get(url + p) as r:
                    await r.read()
        a = proc.cpu_times(); t = time.perf_counter()
        await asyncio.gather(*(w() for _ in range(64)))
        b = proc.cpu_times()
        print(f"{path}: {(b.user-a.user+b.system-a.system)/4000*1e6:.0f} us daemon CPU a request (user {(b.user-a.user)/4000*1e6:.0f}), {4000/(time.perf_counter()-t):.0f} req/s")
with tempfile.TemporaryDirectory() as tmp:
    d = DaemonProcess(Path(tmp) / "data", **({"cmd_prefix": None} if False else {})).start()
    p = psutil.Process(d.proc.pid)
    for path in ("/healthz", "/v1/info", "/healthz"):
        asyncio.run(main(d.url, p, path))
    print("threads", p.num_threads(), [ (t.id, t.user_time) for t in p.threads()])
    d.stop()
