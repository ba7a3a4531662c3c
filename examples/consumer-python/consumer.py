#!/usr/bin/python3
"""A stateful RabbitMQ consumer in pika: the Python twin of examples/consumer.

It folds a SHA-256 hash chain over the bodies of the messages it processes,
keeps that state in memory only, and serves it over HTTP. It reconnects by
itself, keeping its state, whenever its connection or channel drops.
Runs on Debian's python3 with python3-pika 1.2. See examples/README.md.
"""

import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pika
import pika.exceptions

USAGE = """\
Usage: consumer.py

Consumes a RabbitMQ queue with manual acks, folds a SHA-256 hash chain over the
message bodies, and serves the state at GET /state (and GET /healthz). It
reconnects by itself, keeping its state, until SIGTERM or SIGINT.

Environment:
  AMQP_URL         broker URL (default amqp://guest:guest@127.0.0.1:5672/)
  QUEUE            queue to consume (default orders)
  PREFETCH         basic.qos prefetch count; 0 means no limit (default 1)
  WORK_MS          milliseconds of work per message (default 50)
  HTTP_ADDR        address of the state server (default 127.0.0.1:8080)
  DECLARE          declare the queue as durable before consuming (default true)
  CONNECTION_NAME  client-provided connection name (default ms2m-example-consumer)
  SKIP_REDELIVERIES  skip a redelivered message whose numeric message-id is
                   not above the last folded one's (default false: fold
                   everything, so that the hash shows every duplicate)
  EXCHANGE         subscribe to this fanout exchange instead of consuming
                   QUEUE: declare it (durable), and consume a queue of its
                   own that the broker names (amq.gen-*), exclusive and
                   auto-delete, bound to it; a new one on every reconnect
                   (default unset). ms2m refuses to migrate such a consumer
"""

MIN_BACKOFF = 0.1
MAX_BACKOFF = 2.0

# What a dropped connection or channel raises. AMQPError is the base of all
# pika errors; the others are named for the reader.
DISCONNECTED = (
    pika.exceptions.AMQPConnectionError,  # incl. ConnectionClosed, StreamLostError
    pika.exceptions.AMQPChannelError,  # incl. ChannelClosed, ChannelWrongStateError
    pika.exceptions.AMQPError,
    OSError,
)

log = logging.getLogger("consumer")


class ConfigError(Exception):
    pass


class Config:
    def __init__(self, env):
        self.url = env.get("AMQP_URL") or "amqp://guest:guest@127.0.0.1:5672/"
        self.queue = env.get("QUEUE") or "orders"
        self.http_addr = env.get("HTTP_ADDR") or "127.0.0.1:8080"
        self.conn_name = env.get("CONNECTION_NAME") or "ms2m-example-consumer"
        self.exchange = env.get("EXCHANGE") or ""
        self.prefetch = _int(env, "PREFETCH", 1, 0, 65535)
        self.work = _int(env, "WORK_MS", 50, 0, None) / 1000.0
        self.declare = _bool(env, "DECLARE", True)
        self.skip_redeliveries = _bool(env, "SKIP_REDELIVERIES", False)
        try:
            pika.URLParameters(self.url)
        except Exception as e:  # pika raises several types for a bad URL
            raise ConfigError("AMQP_URL: %s" % e)


def _int(env, name, default, lo, hi):
    v = env.get(name)
    if not v:  # unset or empty
        return default
    try:
        n = int(v)
    except ValueError:
        n = None
    if n is None or n < lo or (hi is not None and n > hi):
        want = "from %d to %d" % (lo, hi) if hi is not None else ">= %d" % lo
        raise ConfigError("%s=%r: want an integer %s" % (name, v, want))
    return n


def _bool(env, name, default):
    v = env.get(name)
    if not v:  # unset or empty
        return default
    if v.lower() in ("1", "t", "true"):
        return True
    if v.lower() in ("0", "f", "false"):
        return False
    raise ConfigError("%s=%r: want true or false" % (name, v))


class State:
    """The in-memory state and connection status, shared with the HTTP server."""

    def __init__(self, skip_redeliveries=False):
        self.skip_redeliveries = skip_redeliveries  # off: a duplicate shows in the hash
        self.lock = threading.Lock()
        self.hash = bytes(32)  # h0
        self.count = 0
        self.last = ""
        self.last_id = None  # message-id of the last folded message, if numeric
        self.skipped = 0
        self.connected = False
        self.sessions = 0
        self.max_latency_ms = 0.0

    def apply(self, body, message_id, redelivered, sent_at_ns, now_ns):
        """Folds one message and returns True. With skip_redeliveries on, it
        returns False instead when the message is a redelivery of one already
        folded: it is redelivered and its numeric message-id is not above that
        of the last folded message. That happens when the connection drops
        after a message was folded but before its ack reached the broker;
        skipping keeps the state exactly-once, but also hides a duplicate that
        something else caused, so it is off unless asked for."""
        try:
            msg_id = int(message_id)
        except (TypeError, ValueError):
            msg_id = None
        with self.lock:
            if (self.skip_redeliveries and redelivered and msg_id is not None
                    and self.last_id is not None
                    and msg_id <= self.last_id):
                self.skipped += 1
                return False
            self.hash = hashlib.sha256(self.hash + body).digest()
            self.count += 1
            self.last = body.decode("utf-8", "replace")
            self.last_id = msg_id
            if isinstance(sent_at_ns, int):
                latency_ms = (now_ns - sent_at_ns) / 1e6
                self.max_latency_ms = max(self.max_latency_ms, latency_ms)
            return True

    def set_connected(self, connected):
        with self.lock:
            self.connected = connected
            if connected:
                self.sessions += 1

    def snapshot(self):
        with self.lock:
            return {
                "count": self.count,
                "hash": self.hash.hex(),
                "last": self.last,
                "connected": self.connected,
                "reconnects": max(0, self.sessions - 1),
                "max_latency_ms": self.max_latency_ms,
                "skipped_redeliveries": self.skipped,
            }


def serve_http(addr, state):
    """Starts the state server in a daemon thread and returns it."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/state":
                self._reply(200, "application/json", json.dumps(state.snapshot()) + "\n")
            elif self.path == "/healthz":
                self._reply(200, "text/plain", "ok\n")
            else:
                self._reply(404, "text/plain", "not found\n")

        def _reply(self, code, ctype, text):
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def session(cfg, state, stop):
    """Connects and consumes until the connection or channel drops (raises),
    the broker cancels the consumer (returns), or stop is set (returns).
    Unacked messages go back to the queue when the connection closes."""
    params = pika.URLParameters(cfg.url)
    params.heartbeat = 30
    params.socket_timeout = 5
    params.client_properties = {"connection_name": cfg.conn_name}
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=cfg.prefetch)
        queue = cfg.queue
        if cfg.exchange:
            # A subscriber: a queue of this session's own, named by the
            # broker, exclusive and auto-delete, bound to the exchange.
            ch.exchange_declare(cfg.exchange, exchange_type="fanout", durable=True)
            queue = ch.queue_declare("", exclusive=True, auto_delete=True).method.queue
            ch.queue_bind(queue, cfg.exchange)
        elif cfg.declare:
            ch.queue_declare(cfg.queue, durable=True)
        deliveries = ch.consume(queue, auto_ack=False, inactivity_timeout=0.2)
        state.set_connected(True)
        log.info("consuming queue=%s", queue)
        try:
            for method, props, body in deliveries:
                if stop.is_set():
                    return
                if method is None:  # inactivity timeout
                    continue
                time.sleep(cfg.work)
                if stop.is_set():
                    return  # not processed; redelivered to the next consumer
                headers = props.headers or {}
                state.apply(body, props.message_id, method.redelivered,
                            headers.get("x-sent-at"), time.time_ns())
                ch.basic_ack(method.delivery_tag)
            log.warning("consumer cancelled by the broker queue=%s", queue)
        finally:
            state.set_connected(False)
    finally:
        if conn.is_open:
            try:
                conn.close()
            except DISCONNECTED:
                pass


def main(argv, env):
    if any(a in ("-h", "-help", "--help") for a in argv[1:]):
        sys.stdout.write(USAGE)
        return 0
    if len(argv) > 1:
        sys.stderr.write(USAGE)
        return 2
    try:
        cfg = Config(env)
    except ConfigError as e:
        sys.stderr.write("consumer.py: %s\n" % e)
        return 2
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # we log its errors ourselves

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    state = State(cfg.skip_redeliveries)
    try:
        server = serve_http(cfg.http_addr, state)
    except (OSError, ValueError) as e:
        log.error("listen on HTTP_ADDR %s failed: %s", cfg.http_addr, e)
        return 1
    host, port = server.server_address[:2]
    log.info("listening http=http://%s:%d queue=%s prefetch=%d work_ms=%d connection_name=%s"
             " skip_redeliveries=%s",
             host, port, cfg.queue, cfg.prefetch, cfg.work * 1000, cfg.conn_name,
             cfg.skip_redeliveries)

    backoff = MIN_BACKOFF
    while not stop.is_set():
        sessions_before = state.sessions
        err = None
        try:
            session(cfg, state, stop)
        except DISCONNECTED as e:
            err = e
        if stop.is_set():
            break
        if state.sessions > sessions_before:
            backoff = MIN_BACKOFF
        log.warning("disconnected, will reconnect err=%r in=%.1fs", err, backoff)
        stop.wait(backoff)
        backoff = min(2 * backoff, MAX_BACKOFF)

    log.info("stopping count=%d", state.snapshot()["count"])
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv, os.environ))
