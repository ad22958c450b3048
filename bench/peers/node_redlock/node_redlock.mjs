// node_redlock.mjs — npm redlock (node-redlock 4.2.0) measured the way
// cerberus-bench measures Cerberus's Redlock mode (bench/scenarios.c), on
// the same masters in the same run; run by bench/peers/node_redlock.sh.
//
//   node node_redlock.mjs uncontended|handoff THREADS SECONDS HOST:PORT,...
//
// uncontended  THREADS concurrent loops in one Node process (Node's way:
//              concurrent awaits on one connection per master, which
//              ioredis pipelines), each on a name of its own:
//              lock(name, 10000) with retryCount 0, then unlock(); a
//              cycle's latency is from before lock to after unlock.
// handoff      THREADS contenders on one name, each its own Redlock with
//              its own connections, blocking with node-redlock's default
//              retry (every 200 ms +-100 ms of jitter, here without a
//              count limit); a holder busy-works 20 us. The lock is not
//              fair, so a releaser rests one retry delay before contending
//              again, as a waiter that just missed would. Hand-off = the
//              next holder's lock() return minus the previous holder's
//              release stamp, taken just before it releases (between two
//              different contenders; process.hrtime, CLOCK_MONOTONIC).
// An unmeasured warm-up of a tenth of the time (0.05..0.5 s) first.
// Prints one "result ..." line of the peer protocol (bench/peers/peerlib.py).
import Redis from 'ioredis';
import Redlock from 'redlock';

const [scenario, threadsS, secondsS, nodesS] = process.argv.slice(2);
const threads = Number(threadsS), seconds = Number(secondsS);
const masters = nodesS.split(',').map((hp) => {
  const i = hp.lastIndexOf(':');
  return { host: hp.slice(0, i), port: Number(hp.slice(i + 1)) };
});
const now = () => process.hrtime.bigint();
const warm = BigInt(Math.round(Math.min(0.5, Math.max(0.05, seconds / 10)) * 1e9));
const clients = [];

async function connect() {
  const cs = [];
  for (const m of masters) {
    const c = new Redis({ host: m.host, port: m.port, lazyConnect: true, maxRetriesPerRequest: 2 });
    await c.connect();
    cs.push(c);
    clients.push(c);
  }
  return cs;
}

const busy = (ns) => {
  const t = now();
  while (now() - t < ns);
  return now();
};

const lat = [];
let cycles = 0;
const start = now() + warm, end = start + BigInt(Math.round(seconds * 1e9));
if (scenario === 'uncontended') {
  const rl = new Redlock(await connect(), { retryCount: 0 });
  await Promise.all(Array.from({ length: threads }, async (_, i) => {
    const name = `bench-noderedlock-${process.pid}-u${i}`;
    for (;;) {
      const t0 = now();
      const l = await rl.lock(name, 10000);
      await l.unlock();
      const t1 = now();
      if (t0 >= start && t1 < end) lat.push(Number(t1 - t0));
      if (t1 >= end) break;
    }
  }));
  cycles = lat.length;
} else {
  const name = `bench-noderedlock-${process.pid}-h`;
  const delay = 200;
  const rls = [];
  for (let i = 0; i < threads; i++) rls.push(new Redlock(await connect(), { retryCount: -1, retryDelay: delay, retryJitter: 100 }));
  let lastRel = null, lastWho = -1;
  await Promise.all(rls.map(async (rl, i) => {
    // Independent services retry at independent phases.
    await new Promise((r) => setTimeout(r, Math.random() * delay));
    for (;;) {
      const l = await rl.lock(name, 10000);
      const tAcq = now();
      if (lastRel !== null && lastWho !== i && tAcq >= start && tAcq < end) {
        lat.push(Number(tAcq - lastRel));
      }
      if (tAcq >= start && tAcq < end) cycles++;
      const tRel = busy(20000n);
      lastRel = tRel;
      lastWho = i;
      await l.unlock();
      if (tRel >= end) break;
      await new Promise((r) => setTimeout(r, delay));
    }
  }));
}
await Promise.all(clients.map((c) => c.quit()));
lat.sort((a, b) => a - b);
if (!lat.length) {
  console.error(`no ${scenario === 'uncontended' ? 'cycle' : 'hand-off'} measured`);
  process.exit(1);
}
const pct = (q) => lat[Math.max(0, Math.min(lat.length - 1, Math.ceil(q * lat.length) - 1))] / 1000;
const how = scenario === 'uncontended'
  ? `${threads} concurrent loop(s) in one Node process, one ioredis connection per master, lock(retryCount 0)+unlock on ${masters.length} masters`
  : `${threads} contenders in one Node process, each a Redlock with its own connections, retrying every 200 +-100 ms (the default); not fair, so a releaser rests one retry delay`;
console.log(`result peer=node-redlock scenario=${scenario} threads=${threads} ` +
  `ops_per_s=${(cycles / seconds).toFixed(1)} p50_us=${pct(0.5).toFixed(1)} ` +
  `p90_us=${pct(0.9).toFixed(1)} p99_us=${pct(0.99).toFixed(1)} ` +
  `max_us=${(lat[lat.length - 1] / 1000).toFixed(1)} samples=${lat.length} # ${how}`);
process.exit(0);
