// redis_semaphore.mjs — npm redis-semaphore's Semaphore measured the way
// cerberus-bench measures Cerberus's semaphores (bench/scenario_prims.c),
// run by bench/peers/redis_semaphore.sh.
//
//   node redis_semaphore.mjs HOST PORT DB PERMITS SECONDS
//
// 2 x PERMITS acquirers, each with its own ioredis connection and its own
// Semaphore (an acquirer is one identifier in the sorted set), on one key
// of PERMITS, loop acquire() + release() in one Node process (Node's way:
// concurrent awaits, not threads). acquire waits without a practical limit
// (acquireTimeout 10 min) and polls every retryInterval (the package's
// default, 10 ms). The latency is the acquire wait (process.hrtime, i.e.
// CLOCK_MONOTONIC). An unmeasured warm-up of a tenth of the time first.
// Prints one "result ..." line of the peer protocol (bench/peers/peerlib.py).
import Redis from 'ioredis';
import { Semaphore } from 'redis-semaphore';

const [host, port, db, permitsS, secondsS] = process.argv.slice(2);
const permits = Number(permitsS), seconds = Number(secondsS), n = 2 * permits;
const key = `bench-rsem-${process.pid}`;
const now = () => process.hrtime.bigint();
const warm = BigInt(Math.round(Math.min(0.5, Math.max(0.05, seconds / 10)) * 1e9));
const clients = [], sems = [];
for (let i = 0; i < n; i++) {
  const c = new Redis({ host, port: Number(port), db: Number(db), lazyConnect: true,
                        maxRetriesPerRequest: 2 });
  await c.connect();
  clients.push(c);
  sems.push(new Semaphore(c, key, permits, { acquireTimeout: 600000 }));
}
const start = now() + warm, end = start + BigInt(Math.round(seconds * 1e9));
const lat = [];
await Promise.all(sems.map(async (s) => {
  for (;;) {
    const t0 = now();
    await s.acquire();
    const t1 = now();
    await s.release();
    if (t1 >= end) break;
    if (t0 >= start) lat.push(Number(t1 - t0));
  }
}));
await Promise.all(clients.map((c) => c.quit()));
lat.sort((a, b) => a - b);
const pct = (q) => lat[Math.max(0, Math.min(lat.length - 1, Math.ceil(q * lat.length) - 1))] / 1000;
if (!lat.length) {
  console.error('no acquisition measured');
  process.exit(1);
}
console.log(`result peer=redis-semaphore scenario=semaphore threads=${n} ` +
  `ops_per_s=${(lat.length / seconds).toFixed(1)} p50_us=${pct(0.5).toFixed(1)} ` +
  `p90_us=${pct(0.9).toFixed(1)} p99_us=${pct(0.99).toFixed(1)} ` +
  `max_us=${(lat[lat.length - 1] / 1000).toFixed(1)} samples=${lat.length} ` +
  `# npm redis-semaphore Semaphore, ${permits} permits, ${n} acquirers with a connection ` +
  `each in one Node process, acquire + release (polling every 10 ms, the default); ` +
  `latency = acquire wait`);
process.exit(0);
