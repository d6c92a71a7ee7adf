// A Ratchet tool worker in Node.js, written from docs/protocol.md ("Serving a tool from
// another process or language") with the npm packages `nats` (2.x) and `@msgpack/msgpack`.
//
// Serves, for one tenant, `echo` (a read) and `pay` (a write with a query: it files a claim
// at the finance simulator under the request's idempotency key). With
// RATCHET_TOOL_DIE_AFTER_EFFECT set, it SIGKILLs itself after the claim is committed and
// before replying.
//
//   node node_tool_worker.js <nats-url> <tenant>     (env: RATCHET_FINANCE_URL)
"use strict";
const { connect, AckPolicy, DiscardPolicy, RetentionPolicy, StorageType, headers, nanos } =
  require("nats");
const { encode, decode } = require("@msgpack/msgpack");

const [url, tenant] = process.argv.slice(2);
const STREAM = `RATCHET_TOOLS_${tenant}`;  // one stream per tenant
const finance = process.env.RATCHET_FINANCE_URL;

// Tool code: each returns the result (an object), or null for a query that found nothing,
// or throws {code, message} (a reply code of docs/protocol.md).
const tools = {
  echo: {
    call: async (req) => ({ text: req.args.text, pid: process.pid }),
  },
  pay: {
    call: async (req) => {
      const key = req.idempotency_key;
      const res = await fetch(`${finance}/claims`, {
        method: "POST",
        headers: { "content-type": "application/json", "Idempotency-Key": key },
        body: JSON.stringify({ idempotency_key: key, report_id: req.args.invoice,
                               employee: "e", amount: req.args.amount }),
      });
      if (res.status >= 500) throw { code: "OUTCOME_UNKNOWN", message: `HTTP ${res.status}` };
      if (res.status >= 400) throw { code: "INVALID_ARGUMENT", message: `HTTP ${res.status}` };
      const claim = await res.json();
      if (process.env.RATCHET_TOOL_DIE_AFTER_EFFECT) process.kill(process.pid, "SIGKILL");
      return { provider_id: claim.provider_id, status: claim.status };
    },
    query: async (req) => {
      const key = encodeURIComponent(req.idempotency_key);
      const res = await fetch(`${finance}/actions/${key}`);
      if (res.status === 404) return null;
      if (res.status !== 200) throw { code: "UNAVAILABLE", message: `HTTP ${res.status}` };
      const found = (await res.json()).result;
      return { provider_id: found.provider_id, status: found.status };
    },
  },
};

async function ensureStream(jsm) {
  // A node creates it at its first call; a worker that may (this one: no NATS users) and
  // comes first creates it with the same configuration.
  try {
    await jsm.streams.info(STREAM);
  } catch {
    try {
      await jsm.streams.add({
        name: STREAM, subjects: [`ratchet.tools.${tenant}.>`],
        retention: RetentionPolicy.Workqueue, storage: StorageType.File,
        discard: DiscardPolicy.New, duplicate_window: nanos(120_000),
        max_msgs: 100_000, max_bytes: 256 * 1024 * 1024,
      });
    } catch (e) {
      await jsm.streams.info(STREAM);  // made meanwhile by a node; else this throws
    }
  }
}

async function bind(js, jsm, name) {
  const durable = `tools-${tenant}-${name}`;
  try {
    await jsm.consumers.info(STREAM, durable);  // the first worker's settings stand
  } catch {
    await jsm.consumers.add(STREAM, {
      durable_name: durable, filter_subject: `ratchet.tools.${tenant}.${name}`,
      ack_policy: AckPolicy.Explicit, ack_wait: nanos(30_000), max_deliver: 5,
    });
  }
  return js.consumers.get(STREAM, durable);
}

async function serve(nc, consumer, name) {
  const messages = await consumer.consume({ max_messages: 16 });
  for await (const m of messages) {
    let req;
    try {
      req = decode(m.data);
    } catch (e) {
      m.term();  // malformed: never redelivered
      continue;
    }
    if (req.tenant !== tenant || req.tool !== name ||
        !String(req.reply_to).startsWith(`ratchet.toolreply.${tenant}.`)) {
      m.term();
      continue;
    }
    if (req.deadline * 1000 < Date.now()) {  // nobody waits any more: the node will query
      m.ack();
      continue;
    }
    const reply = { schema_version: 1, correlation_id: req.correlation_id,
                    idempotency_key: req.idempotency_key ?? null };
    try {
      const fn = tools[name][req.op];
      if (!fn) throw { code: "INVALID_ARGUMENT", message: `no ${req.op} op` };
      reply.ok = true;
      reply.result = await fn(req);
    } catch (e) {
      reply.ok = false;
      reply.error = { code: e.code || "OUTCOME_UNKNOWN", message: String(e.message || e),
                      retryable: e.code === "UNAVAILABLE" };
    }
    const h = headers();
    h.set("Ratchet-Correlation-Id", req.correlation_id);
    nc.publish(req.reply_to, encode(reply), { headers: h });
    m.ack();  // after the reply: a worker dying in between leaves it to be redelivered
  }
}

(async () => {
  const nc = await connect({ servers: url, name: "node-tool-worker" });
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  await ensureStream(jsm);
  const names = Object.keys(tools);
  const consumers = await Promise.all(names.map((name) => bind(js, jsm, name)));
  const loops = names.map((name, i) => serve(nc, consumers[i], name));
  console.log(JSON.stringify({ serving: Object.keys(tools).sort(), tenants: [tenant],
                               pid: process.pid }));
  process.on("SIGTERM", async () => { await nc.drain(); process.exit(0); });
  await Promise.all(loops);
})().catch((e) => { console.error(e); process.exit(1); });
