#!/usr/bin/env python3
"""bench_lock.py — uncontended acquire + release through the Python binding
of Cerberus against redis-py's Lock, on the same Redis server, in one run.

    CERBERUS_LIB=build/libcerberus.so python3 python/bench/bench_lock.py --port 6379

Cases, each run for --duration seconds per side, the two sides one after
the other (Cerberus first, then redis-py, then again in the other order
when --rounds is 2 or more; the best round of each side counts):

  1 thread    one thread, one lock name, acquire (no wait) then release
  N threads   --threads threads, a name each
  N tasks     --tasks asyncio tasks, a name each: Cerberus through
              ``async with client.alock(name, wait=0)`` (the client's own
              threads), against redis.asyncio's Lock (native asyncio) and
              against redis-py's Lock run in the loop's default executor
              (--executor-threads threads)

Both sides do what a caller of each does for an uncontended lock: Cerberus
a ``Lock.acquire(wait=0)`` and ``Hold.release()`` (one acquire script with
its fence, one release script); redis-py ``Lock.acquire(blocking=False)``
(SET NX PX) and ``release()`` (a script). Cerberus runs in its own key
prefix, prepared with init_stores; redis-py uses keys of its own names.

It prints operations (acquire + release pairs) per second per side and the
ratio Cerberus / redis-py. Use a library built without sanitizers. Nothing
here is a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import secrets
import sys
import threading
import time
from typing import Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the package from the source tree

import cerberus  # noqa: E402

try:
    import redis
    import redis.asyncio
except ImportError:  # pragma: no cover
    sys.exit("bench_lock: redis-py is needed (Debian python3-redis)")


def run_threads(n: int, duration: float, make_loop: Callable[[int], Callable[[], None]]) -> float:
    """Run @n threads, each calling its op in a loop for @duration s; ops/s."""
    ops = [0] * n
    stop = threading.Event()
    start = threading.Barrier(n + 1)

    def worker(i: int) -> None:
        op = make_loop(i)
        op()  # warm: connections, scripts, handles
        start.wait()
        k = 0
        while not stop.is_set():
            op()
            k += 1
        ops[i] = k

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(duration)  # the measurement window, not a synchronisation
    stop.set()
    for t in ts:
        t.join()
    return sum(ops) / (time.perf_counter() - t0)


def run_tasks(n: int, duration: float, executor_threads: int, setup) -> float:
    """Run @n asyncio tasks, each awaiting its op in a loop; ops/s. @setup
    is an async function of the task count returning (ops, cleanup), made
    inside the loop (redis.asyncio's connections belong to one loop)."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=executor_threads))
        ready, cleanup = await setup(n)
        ops = [0] * n
        stop = asyncio.Event()
        for op in ready:
            await op()  # warm

        async def task(i: int) -> None:
            op = ready[i]
            k = 0
            while not stop.is_set():
                await op()
                k += 1
            ops[i] = k

        t0 = time.perf_counter()
        ts = [asyncio.create_task(task(i)) for i in range(n)]
        await asyncio.sleep(duration)  # the measurement window
        stop.set()
        await asyncio.gather(*ts)
        rate = sum(ops) / (time.perf_counter() - t0)
        await cleanup()
        return rate

    return asyncio.run(main())


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=int(os.environ.get("CERB_REDIS_PORT", 6379)))
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per case and side")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--executor-threads", type=int, default=8,
                    help="threads of the event loop's default executor (asyncio case)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds per case; sides alternate who goes first")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)

    tag = "bench-%d-%s" % (os.getpid(), secrets.token_hex(3))
    prefix = tag + ":"
    cfg = ('engines = ("redis");\nredis = { host = "%s"; port = %d; prefix = "%s"; '
           'pool_max = %d; };\n' % (args.host, args.port, prefix,
                                    max(args.threads, args.tasks) + 4))
    cerberus.init_stores(text=cfg, force=True)  # a new prefix: no first-grant wait
    client = cerberus.Client(text=cfg)
    r = redis.Redis(host=args.host, port=args.port,
                    max_connections=max(args.threads, args.tasks) + 4)

    def cerb_thread(i: int) -> Callable[[], None]:
        lock = client.lock("t%d" % i)

        def op() -> None:
            lock.acquire(wait=0).release()
        return op

    def rpy_thread(i: int) -> Callable[[], None]:
        lock = r.lock("%s-rpy-t%d" % (tag, i), timeout=10)

        def op() -> None:
            if not lock.acquire(blocking=False):
                raise RuntimeError("redis-py lock busy")
            lock.release()
        return op

    async def cerb_tasks(n: int):
        def make(i: int):
            name = "a%d" % i

            async def op() -> None:
                async with client.alock(name, wait=0):
                    pass
            return op

        async def cleanup() -> None:
            pass
        return [make(i) for i in range(n)], cleanup

    async def rpy_tasks(n: int):
        ar = redis.asyncio.Redis(host=args.host, port=args.port, max_connections=n + 4)

        def make(i: int):
            lock = ar.lock("%s-rpy-a%d" % (tag, i), timeout=10)

            async def op() -> None:
                if not await lock.acquire(blocking=False):
                    raise RuntimeError("redis-py lock busy")
                await lock.release()
            return op

        async def cleanup() -> None:
            await ar.close()
        return [make(i) for i in range(n)], cleanup

    async def rpy_exec_tasks(n: int):
        """redis-py's (blocking) Lock from asyncio, through the executor."""
        loop = asyncio.get_running_loop()

        def make(i: int):
            sync_op = rpy_thread(1000 + i)

            async def op() -> None:
                await loop.run_in_executor(None, sync_op)
            return op

        async def cleanup() -> None:
            pass
        return [make(i) for i in range(n)], cleanup

    tasks = lambda f: run_tasks(args.tasks, args.duration, args.executor_threads, f)  # noqa: E731
    # (case, runner, cerberus side, [(reference name, reference side)])
    cases = [
        ("1 thread", lambda f: run_threads(1, args.duration, f), cerb_thread,
         [("redis-py Lock", rpy_thread)]),
        ("%d threads" % args.threads, lambda f: run_threads(args.threads, args.duration, f),
         cerb_thread, [("redis-py Lock", rpy_thread)]),
        ("%d asyncio tasks" % args.tasks, tasks, cerb_tasks,
         [("redis.asyncio Lock", rpy_tasks), ("redis-py Lock in executor", rpy_exec_tasks)]),
    ]
    print("bench_lock: libcerberus %s (%s), redis-py %s, redis %s:%d, %.1f s per side, "
          "best of %d" % (cerberus.library_version, cerberus.library_path, redis.__version__,
                          args.host, args.port, args.duration, args.rounds))
    print("%-17s %14s  %-26s %10s %7s" % ("case", "cerberus op/s", "against", "its op/s",
                                          "ratio"))
    out: Dict[str, Dict[str, float]] = {}
    for name, run, cerb, refs in cases:
        sides = [("cerberus", cerb)] + refs
        best = {label: 0.0 for label, _ in sides}
        for rnd in range(args.rounds):
            order = sides if rnd % 2 == 0 else sides[::-1]
            for label, f in order:
                best[label] = max(best[label], run(f))
        out[name] = {"cerberus": best["cerberus"]}
        for label, _ in refs:
            ratio = best["cerberus"] / best[label] if best[label] else float("inf")
            out[name][label] = best[label]
            out[name]["ratio vs " + label] = ratio
            print("%-17s %14.0f  %-26s %10.0f %6.2fx" % (name, best["cerberus"], label,
                                                         best[label], ratio), flush=True)
    client.close()
    r.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
