#!/usr/bin/python3
"""A stateful NATS JetStream consumer in nats-py: the Python twin of
examples/consumer-nats (nats.go).

It consumes a durable JetStream consumer with explicit acks, folds a SHA-256
hash chain over the message bodies, keeps that state in memory only and
serves it over HTTP. nats-py reconnects by itself, keeping the state.
Runs on Debian's python3 with nats-py from the folder pylib/ beside this
script, which `make consumer-nats-python` fills (pip install --target, at
the version the Makefile pins). See examples/README.md.
"""

import asyncio
import hashlib
import json
import logging
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_PYLIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pylib")
if os.path.isdir(_PYLIB):
    sys.path.insert(0, _PYLIB)

import nats  # noqa: E402  (after the pylib path)
import nats.errors  # noqa: E402

USAGE = """\
Usage: consumer.py

Consumes a NATS JetStream durable consumer with explicit acks, folds a
SHA-256 hash chain over the message bodies, and serves the state at GET
/state (and GET /healthz). nats-py reconnects by itself, keeping the state,
until SIGTERM or SIGINT.

Environment:
  NATS_URL   server URL (default nats://127.0.0.1:4222)
  STREAM     the stream (default ORDERS)
  CONSUMER   the durable consumer, which must exist (default worker)
  MODE       push or pull (default pull): a push consumer is consumed on its
             deliver subject, a pull consumer by fetching PREFETCH at a time
  PREFETCH   pull: messages asked for per pull request (default 1)
  WORK_MS    milliseconds of work per message (default 50)
  HTTP_ADDR  address of the state server (default 127.0.0.1:8080)
  RESULT_SUBJECT  publish "result-" + body to this subject with a JetStream
             publish (waiting for the server's publish ack) before acking
             each message, a side effect (default unset: none)
"""

log = logging.getLogger("consumer-nats-python")


class ConfigError(Exception):
    pass


def _int(env, name, default, lo, hi):
    v = env.get(name) or ""
    if v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        n = lo - 1
    if n < lo or n > hi:
        raise ConfigError(f"{name}={v!r}: want an integer from {lo} to {hi}")
    return n


class Config:
    def __init__(self, env):
        self.url = env.get("NATS_URL") or "nats://127.0.0.1:4222"
        self.stream = env.get("STREAM") or "ORDERS"
        self.consumer = env.get("CONSUMER") or "worker"
        self.mode = env.get("MODE") or "pull"
        self.http_addr = env.get("HTTP_ADDR") or "127.0.0.1:8080"
        self.result = env.get("RESULT_SUBJECT") or ""
        if self.mode not in ("push", "pull"):
            raise ConfigError(f"MODE={self.mode!r}: want push or pull")
        self.prefetch = _int(env, "PREFETCH", 1, 1, 1 << 20)
        self.work = _int(env, "WORK_MS", 50, 0, 1 << 30) / 1000.0
        host, sep, port = self.http_addr.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"HTTP_ADDR={self.http_addr!r}: want host:port")
        self.http_host, self.http_port = host, int(port)


class State:
    """The consumer's in-memory state: the hash chain over the bodies folded so far."""

    def __init__(self):
        self._lock = threading.Lock()
        self._h = bytes(32)
        self._count = 0
        self._last = ""
        self._connected = False
        self._sessions = 0

    def fold(self, body):
        """Advance the chain by one body: h = SHA256(h || body)."""
        with self._lock:
            self._h = hashlib.sha256(self._h + body).digest()
            self._count += 1
            self._last = body.decode("utf-8", "replace")

    def set_connected(self, c):
        with self._lock:
            if c and not self._connected:
                self._sessions += 1
            self._connected = c

    def snapshot(self):
        with self._lock:
            return {"count": self._count, "hash": self._h.hex(), "last": self._last,
                    "skipped_redeliveries": 0, "connected": self._connected,
                    "reconnects": max(self._sessions - 1, 0)}


def serve_state(cfg, st):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/state":
                body, ctype = json.dumps(st.snapshot()).encode() + b"\n", "application/json"
            elif self.path == "/healthz":
                body, ctype = b"ok\n", "text/plain"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            pass

    srv = ThreadingHTTPServer((cfg.http_host, cfg.http_port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


async def run(cfg, st):
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def disconnected():
        st.set_connected(False)

    async def reconnected():
        st.set_connected(True)

    async def error(e):
        log.warning("nats: %s", e)

    nc = await nats.connect(cfg.url, name="ms2m-example-consumer-nats-python",
                            max_reconnect_attempts=-1, reconnect_time_wait=0.1,
                            disconnected_cb=disconnected, reconnected_cb=reconnected, error_cb=error)
    js = nc.jetstream()

    async def handle(msg):
        await asyncio.sleep(cfg.work)
        st.fold(msg.data)
        if cfg.result:
            try:
                await js.publish(cfg.result, b"result-" + msg.data)
            except Exception as e:
                log.warning("result publish to %s failed: %s", cfg.result, e)
        try:
            await msg.ack()
        except Exception as e:  # the message comes again after the ack wait
            log.warning("ack failed; the message comes again: %s", e)

    while not stop.is_set():
        try:
            info = await js.consumer_info(cfg.stream, cfg.consumer)
            break
        except Exception as e:
            log.warning("cannot bind to the consumer %s of stream %s yet; retrying: %s", cfg.consumer, cfg.stream, e)
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
    else:
        await nc.close()
        return 0
    push = bool(info.config.deliver_subject)
    if (cfg.mode == "push") != push:
        await nc.close()
        raise ConfigError(f"consumer {cfg.consumer} is a {'push' if push else 'pull'} consumer: set MODE={'push' if push else 'pull'}")

    st.set_connected(True)
    log.info("consuming stream %s consumer %s mode %s, state at http://%s/state", cfg.stream, cfg.consumer, cfg.mode, cfg.http_addr)
    if push:
        # The subscription's callbacks run one at a time, in order.
        await js.subscribe_bind(stream=cfg.stream, config=info.config, consumer=cfg.consumer, cb=handle, manual_ack=True)
        await stop.wait()
    else:
        psub = await js.pull_subscribe_bind(durable=cfg.consumer, stream=cfg.stream)
        fetcher = asyncio.ensure_future(pull(psub, cfg, handle))
        await stop.wait()
        fetcher.cancel()
        try:
            await fetcher
        except asyncio.CancelledError:
            pass
    await nc.close()
    return 0


async def pull(psub, cfg, handle):
    while True:
        try:
            msgs = await psub.fetch(cfg.prefetch, timeout=5)
        except nats.errors.TimeoutError:
            continue
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a status the client reports, a reconnect: ask again
            log.warning("fetch: %s", e)
            await asyncio.sleep(0.1)
            continue
        for m in msgs:
            await handle(m)


def main(argv):
    if len(argv) > 1:
        sys.stderr.write(USAGE)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = Config(os.environ)
    except ConfigError as e:
        sys.stderr.write(f"consumer-nats-python: {e}\n")
        return 2
    st = State()
    srv = serve_state(cfg, st)
    try:
        return asyncio.run(run(cfg, st))
    except ConfigError as e:
        sys.stderr.write(f"consumer-nats-python: {e}\n")
        return 2
    finally:
        srv.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
