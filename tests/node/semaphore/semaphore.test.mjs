// npm redis-semaphore (pinned by package-lock.json) against Cerberus
// semaphores on one Redis: both count the same sorted set, both ways, and
// a release by npm lets a Cerberus waiter in (it notifies nobody: the
// waiting head re-checks). Run by run.sh with CERB_REDIS_PORT and
// CERB_SEM_PEER (the sem_peer helper) in the environment.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import Redis from 'ioredis';
import { Semaphore, MultiSemaphore } from 'redis-semaphore';

const PORT = Number(process.env.CERB_REDIS_PORT);
const PEER = process.env.CERB_SEM_PEER;
const RUN = `${process.pid}-${Date.now().toString(36)}`;
const clients = [];
const peers = [];

function redis(keyPrefix) {
  const r = new Redis({ host: '127.0.0.1', port: PORT, keyPrefix, lazyConnect: false });
  clients.push(r);
  return r;
}

after(async () => {
  for (const r of clients) await r.quit();
  for (const c of peers) if (c.exitCode === null) c.kill('SIGKILL');
});

// A Cerberus client holding permits of `name`, driven line by line.
function peer(name, limit, prefix = '', leaseMs = 10000) {
  const child = spawn(PEER, [String(PORT), prefix, name, String(limit), String(leaseMs)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  peers.push(child);
  const lines = createInterface({ input: child.stdout });
  const queue = [];
  const waiting = [];
  lines.on('line', (l) => (waiting.length ? waiting.shift()(l) : queue.push(l)));
  const next = (ms) =>
    new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`sem_peer: no answer within ${ms} ms`)), ms);
      const take = (l) => {
        clearTimeout(t);
        resolve(l);
      };
      if (queue.length) take(queue.shift());
      else waiting.push(take);
    });
  return {
    send(cmd) {
      child.stdin.write(cmd + '\n');
    },
    async ask(cmd, ms = 15000) {
      this.send(cmd);
      return next(ms);
    },
    next,
    async quit() {
      child.stdin.write('quit\n');
      await new Promise((resolve) => child.on('exit', resolve));
    },
  };
}

const opts = { lockTimeout: 10000, acquireTimeout: 3000, retryInterval: 20 };

test('npm holders count against our limit, and an npm release lets our waiter in', async () => {
  const name = `npm-in-${RUN}`;
  const r = redis();
  const a = new Semaphore(r, name, 2, opts);
  const b = new Semaphore(r, name, 2, opts);
  assert.equal(await a.tryAcquire(), true);
  assert.equal(await b.tryAcquire(), true);
  const p = peer(name, 2);
  assert.match(await p.ask('acquire 1 0'), /^err BUSY/);
  // Our waiter queues; npm's release (a plain ZREM) is seen by its re-check.
  p.send('acquire 1 5000');
  const t0 = Date.now();
  await b.release();
  assert.match(await p.next(6000), /^ok \d+$/);
  assert.ok(Date.now() - t0 < 2000, 'granted within a few re-checks');
  // The set holds npm's identifier and our token, side by side.
  const members = await r.zrange(`semaphore:${name}`, 0, -1);
  assert.equal(members.length, 2);
  assert.ok(members.includes(a.identifier));
  assert.ok(members.some((m) => /^[0-9a-f]{32}$/.test(m)));
  assert.match(await p.ask('holders'), /^ok 2 /);
  assert.equal(await p.ask('release'), 'ok');
  await a.release();
  assert.equal(await r.exists(`semaphore:${name}`), 0);
  await p.quit();
});

test('our holders count against npm limits (Semaphore and MultiSemaphore)', async () => {
  const name = `npm-out-${RUN}`;
  const r = redis();
  const p = peer(name, 3);
  assert.match(await p.ask('acquire 2 0'), /^ok \d+$/); // members <token>_0, <token>_1
  const one = new Semaphore(r, name, 3, opts);
  const two = new MultiSemaphore(r, name, 3, 2, opts);
  assert.equal(await two.tryAcquire(), false);
  assert.equal(await one.tryAcquire(), true);
  assert.equal(await r.zcard(`semaphore:${name}`), 3);
  assert.match(await p.ask('acquire 1 0'), /^err BUSY/);
  assert.equal(await p.ask('release'), 'ok');
  assert.equal(await two.tryAcquire(), true);
  // npm's two members of one hold count as two here too.
  assert.match(await p.ask('acquire 1 0'), /^err BUSY/);
  await two.release();
  await one.release();
  assert.match(await p.ask('acquire 3 0'), /^ok \d+$/);
  assert.equal(await p.ask('release'), 'ok');
  await p.quit();
});

test("with a key prefix: redis.prefix is ioredis' keyPrefix", async () => {
  const name = `npm-pfx-${RUN}`;
  const prefix = `app-${RUN}:`;
  const r = redis(prefix);
  const p = peer(name, 1, prefix);
  // A prefix nobody used has no data-loss marker: the first client makes
  // it and waits one lease (10 s) before its first grant.
  assert.match(await p.ask('acquire 1 15000', 20000), /^ok \d+$/);
  const s = new Semaphore(r, name, 1, opts);
  assert.equal(await s.tryAcquire(), false);
  const raw = redis();
  assert.equal(await raw.zcard(`${prefix}semaphore:${name}`), 1);
  assert.equal(await p.ask('release'), 'ok');
  assert.equal(await s.tryAcquire(), true);
  assert.match(await p.ask('acquire 1 0'), /^err BUSY/);
  await s.release();
  await p.quit();
  await raw.del(`${prefix}\x1fcerberus`);
});
