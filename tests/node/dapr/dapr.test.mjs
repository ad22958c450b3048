// dapr.test.mjs — the real Dapr JS SDK (@dapr/dapr, HTTP mode) against
// `cerberus serve`'s Dapr façade. It starts nothing: run.sh starts the
// daemon and passes its address in the environment:
//   CERB_DAPR_PORT   the daemon's TCP port on 127.0.0.1
//   CERB_DAPR_TOKEN  its token (sent by the SDK as dapr-api-token)
//   CERB_DAPR_STORE  the lock store name (default "cerberus")
// Every resource id is new per run, so reruns never meet old holds.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import dapr from "@dapr/dapr";

const { DaprClient, CommunicationProtocolEnum, LogLevel } = dapr;

const PORT = process.env.CERB_DAPR_PORT;
const TOKEN = process.env.CERB_DAPR_TOKEN;
const STORE = process.env.CERB_DAPR_STORE || "cerberus";
assert.ok(PORT && TOKEN, "CERB_DAPR_PORT and CERB_DAPR_TOKEN must be set (run.sh does)");

// Dapr's UnlockResponse statuses (the SDK's LockStatus).
const SUCCESS = 0, DOES_NOT_EXIST = 1, BELONGS_TO_OTHERS = 2;

const clients = [];
function client(token = TOKEN) {
  const c = new DaprClient({
    daprHost: "127.0.0.1",
    daprPort: PORT,
    communicationProtocol: CommunicationProtocolEnum.HTTP,
    daprApiToken: token,
    logger: { level: LogLevel.Error },
  });
  clients.push(c);
  return c;
}
after(async () => {
  for (const c of clients) await c.stop().catch(() => {});
});

const resource = (tag) => `${tag}-${randomUUID()}`;

test("lock A, lock B, unlock B, unlock A, unlock A again", async () => {
  const c = client();
  const r = resource("order");
  assert.deepEqual(await c.lock.lock(STORE, r, "owner-A", 30), { success: true });
  assert.deepEqual(await c.lock.lock(STORE, r, "owner-B", 30), { success: false });
  assert.deepEqual(await c.lock.lock(STORE, r, "owner-A", 30), { success: false }); // not reentrant
  assert.equal((await c.lock.unlock(STORE, r, "owner-B")).status, BELONGS_TO_OTHERS);
  assert.equal((await c.lock.unlock(STORE, r, "owner-A")).status, SUCCESS);
  assert.equal((await c.lock.unlock(STORE, r, "owner-A")).status, DOES_NOT_EXIST);
});

test("two SDK clients exclude each other", async () => {
  const one = client(), two = client();
  const r = resource("shared");
  const [a, b] = await Promise.all([
    one.lock.lock(STORE, r, "client-one", 30),
    two.lock.lock(STORE, r, "client-two", 30),
  ]);
  assert.equal(Number(a.success) + Number(b.success), 1, "exactly one of two concurrent locks");
  const [winner, loser, wname, lname] = a.success
    ? [one, two, "client-one", "client-two"]
    : [two, one, "client-two", "client-one"];
  assert.deepEqual(await loser.lock.lock(STORE, r, lname, 30), { success: false });
  assert.equal((await loser.lock.unlock(STORE, r, lname)).status, BELONGS_TO_OTHERS);
  assert.equal((await winner.lock.unlock(STORE, r, wname)).status, SUCCESS);
  assert.deepEqual(await loser.lock.lock(STORE, r, lname, 30), { success: true });
  assert.deepEqual(await winner.lock.lock(STORE, r, wname, 30), { success: false });
  assert.equal((await loser.lock.unlock(STORE, r, lname)).status, SUCCESS);
});

test("the expiry frees the resource, not before", async () => {
  const c = client();
  const r = resource("expiring");
  const t0 = Date.now();
  assert.deepEqual(await c.lock.lock(STORE, r, "short", 1), { success: true });
  // Polled under a deadline: the façade, like daprd, has no blocking lock.
  let got = false;
  while (!got && Date.now() - t0 < 5000) {
    got = (await c.lock.lock(STORE, r, "next", 30)).success;
    if (!got) await new Promise((res) => setTimeout(res, 50));
  }
  const ms = Date.now() - t0;
  assert.ok(got, "the resource was not freed within 5 s of a 1 s expiry");
  assert.ok(ms >= 950, `freed after ${ms} ms, before its 1 s expiry`);
  assert.equal((await c.lock.unlock(STORE, r, "short")).status, BELONGS_TO_OTHERS);
  assert.equal((await c.lock.unlock(STORE, r, "next")).status, SUCCESS);
  assert.equal((await c.lock.unlock(STORE, r, "short")).status, DOES_NOT_EXIST);
});

test("daprd's validation errors reach the SDK as errors", async () => {
  const c = client();
  await assert.rejects(c.lock.lock(STORE, resource("bad"), "o", 0), /400/);
  await assert.rejects(c.lock.lock(STORE, "", "o", 5), /400/);
  await assert.rejects(c.lock.lock("no-such-store", resource("bad"), "o", 5), /404/);
});

test("a wrong token is refused", async () => {
  // The SDK's own request path (its dapr-api-token header), without its
  // start-up probe, which would retry a refused token for 60 s.
  const bad = client(`${TOKEN}-wrong`).daprClient;
  const url = `http://127.0.0.1:${PORT}/v1.0-alpha1/lock/${STORE}`;
  const body = { resourceId: resource("token"), lockOwner: "o", expiryInSeconds: 5 };
  await assert.rejects(bad.execute("/metadata", { method: "GET" }, false), /401/);
  await assert.rejects(bad.execute(url, { method: "POST", body }, false), /401/);
  const good = client().daprClient;
  const ok = await good.execute(url, { method: "POST", body }, false);
  assert.deepEqual(ok, { success: true });
});
