// A stateful NATS JetStream consumer in nats.js (the npm package nats): the
// Node twin of examples/consumer-nats (nats.go).
//
// It consumes a durable JetStream consumer with explicit acks, folds a
// SHA-256 hash chain over the message bodies, keeps that state in memory only
// and serves it over HTTP. nats.js reconnects by itself, keeping the state.
// `make consumer-nats-node` installs nats.js at the version package.json
// pins into node_modules/ beside this file. See examples/README.md.
"use strict";

const crypto = require("node:crypto");
const http = require("node:http");
const { connect } = require("nats");

const ACK = new TextEncoder().encode("+ACK");
const RESULT = new TextEncoder().encode("result-");

const USAGE = `Usage: node consumer.js

Consumes a NATS JetStream durable consumer with explicit acks, folds a
SHA-256 hash chain over the message bodies, and serves the state at GET
/state (and GET /healthz). nats.js reconnects by itself, keeping the state,
until SIGTERM or SIGINT.

Environment:
  NATS_URL   server URL (default nats://127.0.0.1:4222)
  STREAM     the stream (default ORDERS)
  CONSUMER   the durable consumer, which must exist (default worker)
  MODE       push or pull (default pull): a push consumer is consumed on its
             deliver subject, a pull consumer with consume()
  PREFETCH   pull: messages asked for per pull request (default 1)
  WORK_MS    milliseconds of work per message (default 50)
  HTTP_ADDR  address of the state server (default 127.0.0.1:8080)
  RESULT_SUBJECT  publish "result-" + body to this subject with a JetStream
             publish (waiting for the server's publish ack) before acking
             each message, a side effect (default unset: none)
`;

class ConfigError extends Error {}

function intEnv(env, name, def, lo, hi) {
  const v = env[name] || "";
  if (v === "") return def;
  const n = /^-?[0-9]+$/.test(v) ? Number(v) : NaN;
  if (!Number.isSafeInteger(n) || n < lo || n > hi) {
    throw new ConfigError(`${name}=${JSON.stringify(v)}: want an integer from ${lo} to ${hi}`);
  }
  return n;
}

function loadConfig(env) {
  const cfg = {
    url: env.NATS_URL || "nats://127.0.0.1:4222",
    stream: env.STREAM || "ORDERS",
    consumer: env.CONSUMER || "worker",
    mode: env.MODE || "pull",
    httpAddr: env.HTTP_ADDR || "127.0.0.1:8080",
    result: env.RESULT_SUBJECT || "",
  };
  if (cfg.mode !== "push" && cfg.mode !== "pull") {
    throw new ConfigError(`MODE=${JSON.stringify(cfg.mode)}: want push or pull`);
  }
  cfg.prefetch = intEnv(env, "PREFETCH", 1, 1, 1 << 20);
  cfg.workMs = intEnv(env, "WORK_MS", 50, 0, 1 << 30);
  const i = cfg.httpAddr.lastIndexOf(":");
  const port = cfg.httpAddr.slice(i + 1);
  if (i < 0 || !/^[0-9]+$/.test(port)) {
    throw new ConfigError(`HTTP_ADDR=${JSON.stringify(cfg.httpAddr)}: want host:port`);
  }
  cfg.httpHost = cfg.httpAddr.slice(0, i);
  cfg.httpPort = Number(port);
  return cfg;
}

// The consumer's in-memory state: the hash chain over the bodies folded so far.
class State {
  constructor() {
    this.h = Buffer.alloc(32);
    this.count = 0;
    this.last = "";
    this.connected = false;
    this.sessions = 0;
  }

  // fold advances the chain by one body: h = SHA256(h || body).
  fold(body) {
    this.h = crypto.createHash("sha256").update(this.h).update(body).digest();
    this.count++;
    this.last = Buffer.from(body).toString("utf8");
  }

  setConnected(c) {
    if (c && !this.connected) this.sessions++;
    this.connected = c;
  }

  snapshot() {
    return {
      count: this.count, hash: this.h.toString("hex"), last: this.last, skipped_redeliveries: 0,
      connected: this.connected, reconnects: Math.max(this.sessions - 1, 0),
    };
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function run(cfg, st, stopped) {
  const nc = await connect({
    servers: cfg.url, name: "ms2m-example-consumer-nats-node",
    maxReconnectAttempts: -1, reconnectTimeWait: 100,
  });
  (async () => {
    for await (const s of nc.status()) {
      if (s.type === "disconnect") st.setConnected(false);
      else if (s.type === "reconnect") st.setConnected(true);
    }
  })();
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  let info;
  while (!stopped.done) {
    try {
      info = await jsm.consumers.info(cfg.stream, cfg.consumer);
      break;
    } catch (e) {
      console.error(`cannot bind to the consumer ${cfg.consumer} of stream ${cfg.stream} yet; retrying: ${e.message}`);
      await sleep(500);
    }
  }
  if (!info) {
    await nc.close();
    return;
  }
  const push = Boolean(info.config.deliver_subject);
  if ((cfg.mode === "push") !== push) {
    await nc.close();
    throw new ConfigError(`consumer ${cfg.consumer} is a ${push ? "push" : "pull"} consumer: set MODE=${push ? "push" : "pull"}`);
  }
  const work = async (data) => {
    if (cfg.workMs > 0) await sleep(cfg.workMs);
    st.fold(data);
    if (cfg.result) {
      const out = new Uint8Array(RESULT.length + data.length);
      out.set(RESULT);
      out.set(data, RESULT.length);
      try {
        await js.publish(cfg.result, out);
      } catch (e) {
        console.error(`result publish to ${cfg.result} failed: ${e.message}`);
      }
    }
  };
  st.setConnected(true);
  console.error(`consuming stream ${cfg.stream} consumer ${cfg.consumer} mode ${cfg.mode}, state at http://${cfg.httpAddr}/state`);
  if (push) {
    // A plain subscription on the consumer's deliver subject: nats.js 2's
    // js.subscribe refuses a push consumer that has a subscriber already
    // ("duplicate subscription"), which a second instance of the app meets
    // while the first still consumes (a migration target started afresh).
    // The messages are JetStream's all the same: the ack is "+ACK" to the
    // reply subject, and a flow-control request is answered empty.
    const sub = nc.subscribe(info.config.deliver_subject);
    stopped.stop = () => sub.unsubscribe();
    for await (const m of sub) {
      if (m.headers && m.headers.code === 100) { // idle heartbeat, flow control
        if (m.reply) m.respond();
        continue;
      }
      await work(m.data);
      m.respond(ACK);
    }
  } else {
    const c = await js.consumers.get(cfg.stream, cfg.consumer);
    const msgs = await c.consume({ max_messages: cfg.prefetch });
    stopped.stop = () => msgs.stop();
    for await (const m of msgs) {
      await work(m.data);
      m.ack();
    }
  }
  await nc.drain().catch(() => nc.close());
}

async function main() {
  if (process.argv.length > 2) {
    process.stderr.write(USAGE);
    process.exit(2);
  }
  let cfg;
  try {
    cfg = loadConfig(process.env);
  } catch (e) {
    process.stderr.write(`consumer-nats-node: ${e.message}\n`);
    process.exit(2);
  }
  const st = new State();
  const srv = http.createServer((req, res) => {
    if (req.method === "GET" && req.url === "/state") {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify(st.snapshot()) + "\n");
    } else if (req.method === "GET" && req.url === "/healthz") {
      res.writeHead(200, { "Content-Type": "text/plain" });
      res.end("ok\n");
    } else {
      res.writeHead(404);
      res.end();
    }
  });
  await new Promise((resolve, reject) => {
    srv.once("error", reject);
    srv.listen(cfg.httpPort, cfg.httpHost, resolve);
  });
  const stopped = { done: false, stop: () => {} };
  const onSignal = () => {
    stopped.done = true;
    stopped.stop();
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);
  try {
    await run(cfg, st, stopped);
  } catch (e) {
    process.stderr.write(`consumer-nats-node: ${e.message}\n`);
    process.exitCode = e instanceof ConfigError ? 2 : 1;
  }
  srv.close();
  process.exit();
}

main();
