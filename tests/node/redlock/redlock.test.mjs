// npm redlock (node-redlock, pinned by package-lock.json) against Cerberus'
// Redlock mode (redis.mode = "redlock") on the same three Redis masters.
//
// Which node-redlock: 4.2.0, npm's `latest` tag and the release most users
// run (4.x has been the stable line since 2019); 5.0.0 has only ever been
// published as betas (5.0.0-beta.1/beta.2, ioredis-only, TypeScript). 4.2.0
// takes any client with eval/evalsha; we give it ioredis 5.4.1, the client
// the semaphore interop pins too. Its per-node protocol is the one Cerberus
// speaks: key = the resource name, value = 16 random bytes in hex, acquire
// "no key? SET value PX ttl" by script, release = compare-and-DEL, extend =
// compare-and-SET PX; a quorum of floor(n/2)+1; validity ttl - elapsed -
// (ttl x 0.01 + 2 ms). Unlike 5.x it releases every node after a failed
// attempt.
//
// Run by run.sh with CERB_REDLOCK_PORTS (the masters, comma-separated) and
// CERB_RL_PEER (the rl_peer helper, a Cerberus client) in the environment.
// Every wait is on a condition with a deadline.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import Redis from 'ioredis';
import Redlock from 'redlock';

const PORTS = process.env.CERB_REDLOCK_PORTS.split(',').map(Number);
const PEER = process.env.CERB_RL_PEER;
const RUN = `${process.pid}-${Date.now().toString(36)}`;
const HEX32 = /^[0-9a-f]{32}$/;
const clients = [];
const peers = [];

function redis(port) {
  const r = new Redis({ host: '127.0.0.1', port, lazyConnect: false, maxRetriesPerRequest: 1 });
  clients.push(r);
  return r;
}
const nodes = PORTS.map((p) => redis(p));

after(async () => {
  for (const r of clients) await r.quit();
  for (const c of peers) if (c.exitCode === null) c.kill('SIGKILL');
});

// node-redlock over @servers (default: all masters) that tries once, as
// a caller of `acquire` with retryCount 0 does.
function redlock(servers = nodes, opts = {}) {
  return new Redlock(servers, { retryCount: 0, retryJitter: 0, ...opts });
}

const values = (name) => Promise.all(nodes.map((r) => r.get(name)));

// Poll @pred (async) every 20 ms until it is true or @ms pass.
async function until(pred, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    if (await pred()) return;
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// A Cerberus client holding `name` in Redlock mode, driven line by line.
function peer(name, leaseMs = 10000) {
  const child = spawn(PEER, [PORTS.join(','), '', name, String(leaseMs)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  peers.push(child);
  const lines = createInterface({ input: child.stdout });
  const queue = [];
  const waiting = [];
  lines.on('line', (l) => (waiting.length ? waiting.shift()(l) : queue.push(l)));
  const next = (ms) =>
    new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`rl_peer: no answer within ${ms} ms`)), ms);
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
    async crash() {
      const gone = new Promise((resolve) => child.on('exit', resolve));
      child.stdin.write('crash\n');
      await gone;
    },
    async quit() {
      const gone = new Promise((resolve) => child.on('exit', resolve));
      child.stdin.write('quit\n');
      await gone;
    },
  };
}

// The PX (ms) left on the nodes holding @value, the second shortest of
// them: what a majority needs to run out before anyone else can be
// granted (0 when fewer than two nodes hold it).
async function majorityPx(name, value) {
  const v = await values(name);
  const px = [];
  for (let i = 0; i < nodes.length; i++) if (v[i] === value) px.push(await nodes[i].pttl(name));
  px.sort((a, b) => a - b);
  return px.length >= 2 ? px[1] : 0;
}

// The owner token Cerberus wrote: the same 32-hex value on at least a
// majority of the masters.
async function ourToken(name) {
  const v = await values(name);
  const t = v.find((x) => x && HEX32.test(x));
  assert.ok(t, `no Cerberus token on any node: ${JSON.stringify(v)}`);
  assert.ok(v.filter((x) => x === t).length >= 2, `token on a minority only: ${JSON.stringify(v)}`);
  return t;
}

test('node-redlock holds: Cerberus is refused, and its waiter gets the lock once node-redlock releases', async () => {
  const name = `nrl-holds-${RUN}`;
  const lock = await redlock().lock(name, 10000);
  assert.match(lock.value, HEX32);
  assert.deepEqual(await values(name), PORTS.map(() => lock.value));
  const p = peer(name);
  assert.match(await p.ask('trylock'), /^err BUSY/);
  // The keys are node-redlock's still: our refused attempt left nothing.
  assert.deepEqual(await values(name), PORTS.map(() => lock.value));
  // A timed lock waits; node-redlock's release notifies nobody, so the
  // waiter must see it by re-checking — well before the 10 s PX would
  // have let it in.
  p.send('lock 8000');
  const t0 = Date.now();
  await lock.unlock();
  assert.match(await p.next(9000), /^ok [1-9]\d*$/);
  const took = Date.now() - t0;
  assert.ok(took < 5000, `granted ${took} ms after node-redlock's release (its PX had 10 s left)`);
  const ours = await ourToken(name);
  assert.notEqual(ours, lock.value);
  assert.equal(await p.ask('unlock'), 'ok');
  assert.deepEqual(await values(name), PORTS.map(() => null));
  await p.quit();
});

test("Cerberus holds: node-redlock's acquire fails and leaves our keys alone", async () => {
  const name = `nrl-out-${RUN}`;
  const p = peer(name);
  assert.match(await p.ask('trylock'), /^ok [1-9]\d*$/);
  const ours = await ourToken(name);
  const rl = redlock();
  await assert.rejects(rl.lock(name, 10000), (e) => e.name === 'LockError');
  // Its failed attempt ran its release everywhere: a compare-and-DEL that
  // did not match ours.
  assert.ok((await values(name)).filter((v) => v === ours).length >= 2);
  assert.match(await p.ask('state'), /^ok VALID$/);
  assert.equal(await p.ask('unlock'), 'ok');
  // Free again: node-redlock gets it at once.
  const lock = await rl.lock(name, 10000);
  await lock.unlock();
  await p.quit();
});

test("a stale node-redlock holder's release and extend cannot touch our hold", async () => {
  const name = `nrl-stale-${RUN}`;
  const rl = redlock();
  const stale = await rl.lock(name, 300);
  // Its PX runs out on every node (it never renewed: a paused process).
  await until(async () => (await values(name)).every((v) => v === null), 3000, 'the 300 ms PX');
  const p = peer(name);
  assert.match(await p.ask('trylock'), /^ok [1-9]\d*$/);
  const ours = await ourToken(name);
  // It wakes up and releases: no node's value is its own, no vote.
  await assert.rejects(stale.unlock(), (e) => e.name === 'LockError');
  // A holder that believes its lock valid (its clock says so) extends:
  // the server-side compare refuses on every node.
  const believer = new Redlock.Lock(rl, name, stale.value, Date.now() + 10000, 1, 0);
  await assert.rejects(believer.extend(10000), (e) => e.name === 'LockError');
  const v = await values(name);
  assert.ok(v.filter((x) => x === ours).length >= 2, `ours after the stale calls: ${JSON.stringify(v)}`);
  assert.ok(!v.includes(stale.value));
  assert.match(await p.ask('state'), /^ok VALID$/);
  assert.equal(await p.ask('unlock'), 'ok');
  await p.quit();
});

test("expiry both ways: neither side takes the other's lock before its PX has run out", async () => {
  // node-redlock holds 1500 ms and never releases (a crashed holder).
  const name = `nrl-expiry-${RUN}`;
  const lock = await redlock().lock(name, 1500);
  // A grant needs a majority free: the second-shortest PX left must pass.
  let t0 = Date.now();
  let need = await majorityPx(name, lock.value);
  const p = peer(name, 1500);
  assert.match(await p.ask('lock 6000', 8000), /^ok [1-9]\d*$/);
  const took = Date.now() - t0;
  assert.ok(took >= need - 50, `Cerberus granted ${took} ms after node-redlock's PX had ${need} ms left on a majority`);
  assert.ok(!(await values(name)).includes(lock.value));
  // Now Cerberus crashes holding it (lease 1500 ms, renewed every 500 ms;
  // no release, no more renewals): node-redlock retrying every 50 ms gets
  // it only once our PX has run out on a majority.
  const ours = await ourToken(name);
  await p.crash();
  t0 = Date.now();
  need = await majorityPx(name, ours);
  assert.ok(need > 0, 'our keys are still there after the crash');
  const rl = redlock(nodes, { retryCount: 200, retryDelay: 50 });
  const mine = await rl.lock(name, 10000);
  const took1 = Date.now() - t0;
  assert.ok(took1 >= need - 50, `node-redlock granted ${took1} ms after our crash, our PX had ${need} ms left on a majority`);
  assert.ok(took1 < need + 5000, `node-redlock waited ${took1} ms for a ${need} ms PX`);
  await mine.unlock();
});

test('a partial grant left by node-redlock (one node of three) does not stop Cerberus, nor is it ours to delete', async () => {
  const name = `nrl-partial-${RUN}`;
  // As a node-redlock client that died after reaching node 0 only.
  const left = await redlock([nodes[0]]).lock(name, 10000);
  const p = peer(name);
  assert.match(await p.ask('trylock'), /^ok [1-9]\d*$/);
  const v = await values(name);
  assert.equal(v[0], left.value, 'node 0 keeps the partial grant');
  assert.ok(HEX32.test(v[1]) && v[1] === v[2] && v[1] !== left.value, JSON.stringify(v));
  // A full node-redlock now finds a majority held by us.
  await assert.rejects(redlock().lock(name, 10000), (e) => e.name === 'LockError');
  assert.equal(await p.ask('unlock'), 'ok');
  assert.deepEqual(await values(name), [left.value, null, null]);
  await nodes[0].del(name);
  await p.quit();
});
