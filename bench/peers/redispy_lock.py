#!/usr/bin/python3
"""redis-py's Lock as a peer for cerberus-bench: uncontended acquire+release
cycles/s on distinct names, one thread or several (the GIL is redis-py's
own limit), against the same server in the same session.

usage: redispy_lock.py PORT [THREADS] [SECONDS]
prints: redispy uncontended threads=N ops_per_s=X p50_us=Y p99_us=Z
"""
import os
import sys
import threading
import time

import redis


def worker(port, idx, seconds, out):
    r = redis.Redis(host="127.0.0.1", port=port)
    name = "bench-redispy-%d-%d" % (os.getpid(), idx)
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        lock = r.lock(name, timeout=10)
        lock.acquire(blocking=False)
        lock.release()
        lat.append(time.perf_counter() - t0)
    out[idx] = lat


def main():
    port = int(sys.argv[1])
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    out = [None] * threads
    ts = [threading.Thread(target=worker, args=(port, i, seconds, out)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - t0
    lat = sorted(x for lst in out for x in lst)
    n = len(lat)
    print("redispy uncontended threads=%d ops_per_s=%.0f p50_us=%.1f p99_us=%.1f"
          % (threads, n / elapsed, lat[n // 2] * 1e6, lat[min(n - 1, n * 99 // 100)] * 1e6))


if __name__ == "__main__":
    main()
