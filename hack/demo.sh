#!/usr/bin/env bash
# make demo-sidecar: an unmodified consumer behind the ms2m sidecar, handed over to
# a second instance with exactly its state.
#
# It starts the sidecar in front of the local RabbitMQ, points the sample Go
# consumer at it, feeds it with the sample producer, and walks through what
# the migrator does: read the state, quiesce for a checkpoint, resume. Then
# a target sidecar in replay mode and a second, empty consumer start; the
# source is stopped at a cutoff; the target replays the log up to it and
# takes over the queue. At the end the target's hash equals the producer's:
# every message processed once, in order, across the handoff.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=bin
QUEUE=ms2m-demo-$$
LOG=ms2m-demo.log-$$ # shaped as the webhook names logs: <namespace>.<name>
TOKEN=demo-token-$$
AMQP=127.0.0.1:5672
SIDECAR=127.0.0.1:15672
CONTROL=127.0.0.1:18089
APP_HTTP=127.0.0.1:18080
TARGET=127.0.0.1:15673
TARGET_CONTROL=127.0.0.1:18090
TARGET_HTTP=127.0.0.1:18081
work=$(mktemp -d)
pids=()

cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rabbitmqctl -q delete_queue "$QUEUE" >/dev/null 2>&1 || true
	rabbitmqctl -q delete_queue "$LOG" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ctl() { curl -fsS -X "$1" -H "Authorization: Bearer $TOKEN" "http://$CONTROL$2"; }
tctl() { curl -fsS -X "$1" -H "Authorization: Bearer $TOKEN" "http://$TARGET_CONTROL$2"; }
app_state() { curl -fsS "http://$APP_HTTP/state"; }
target_state() { curl -fsS "http://$TARGET_HTTP/state"; }
wait_http() { for _ in $(seq 100); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "no answer from $1" >&2; exit 1; }

step "Start the sidecar: the app will connect to $SIDECAR as if it were the broker"
MS2M_LISTEN=$SIDECAR MS2M_UPSTREAM=$AMQP \
	MS2M_STREAM_URI=rabbitmq-stream://guest:guest@127.0.0.1:5552/ MS2M_LOG_NAME=$LOG \
	MS2M_CONTROL_LISTEN=$CONTROL MS2M_CONTROL_TOKEN=$TOKEN MS2M_LOG_LEVEL=warn \
	"$BIN/sidecar" 2>"$work/sidecar.log" &
pids+=($!)
wait_http "http://$CONTROL/readyz"
echo "sidecar ready (log: $LOG)"

step "Start the unmodified Go consumer, pointed at the sidecar (50 ms of work per message)"
AMQP_URL=amqp://guest:guest@$SIDECAR/ QUEUE=$QUEUE PREFETCH=10 WORK_MS=50 HTTP_ADDR=$APP_HTTP \
	"$BIN/consumer" 2>"$work/consumer.log" &
pids+=($!)
wait_http "http://$APP_HTTP/healthz"

step "Produce 100 messages at 20 msg/s, straight to the broker"
"$BIN/producer" -url amqp://guest:guest@$AMQP/ -queue "$QUEUE" -rate 20 -count 100 >"$work/producer.json" 2>/dev/null &
producer=$!
pids+=($producer)
sleep 2

step "GET /state: position, in-flight deliveries, live λ and μ"
ctl GET /state

step "POST /quiesce: hold new deliveries, wait for the app's acks, return the checkpoint ID"
ctl POST /quiesce
sleep 1
echo "app while quiesced: $(app_state)"

step "POST /resume"
ctl POST /resume
sleep 1

step "Start a target: a sidecar in replay mode on the same log, and a second, empty consumer"
MS2M_LISTEN=$TARGET MS2M_UPSTREAM=$AMQP \
	MS2M_STREAM_URI=rabbitmq-stream://guest:guest@127.0.0.1:5552/ MS2M_LOG_NAME=$LOG \
	MS2M_CONTROL_LISTEN=$TARGET_CONTROL MS2M_CONTROL_TOKEN=$TOKEN MS2M_LOG_LEVEL=warn \
	MS2M_REPLAY_START=0 MS2M_REPLAY_CUTOFF=marker \
	"$BIN/sidecar" 2>"$work/target.log" &
pids+=($!)
wait_http "http://$TARGET_CONTROL/readyz"
AMQP_URL=amqp://guest:guest@$TARGET/ QUEUE=$QUEUE PREFETCH=10 WORK_MS=50 HTTP_ADDR=$TARGET_HTTP \
	"$BIN/consumer" 2>"$work/target-consumer.log" &
pids+=($!)
wait_http "http://$TARGET_HTTP/healthz"
sleep 1
echo "target consumer, replaying the log while the source serves: $(target_state)"

step "POST /stop on the source: cancel upstream, requeue what its app never saw, write a cutoff marker"
ctl POST /stop
echo "source consumer at the cutoff: $(app_state)"

step "The target replays up to the cutoff, then takes over the queue"
wait "$producer"
want=$(sed -n 's/.*"hash":"\([0-9a-f]*\)".*/\1/p' "$work/producer.json")
for _ in $(seq 300); do
	target_state | grep -q "\"count\":100," && break
	sleep 0.1
done
tctl GET /state | sed -n '/"replay"/,/^  }/p'

step "Result"
got=$(target_state | sed -n 's/.*"hash":"\([0-9a-f]*\)".*/\1/p')
echo "producer hash: $want"
echo "target hash:   $got"
if [ "$want" = "$got" ]; then
	echo "exact: every message processed once, in order, across the handoff"
else
	echo "MISMATCH" >&2
	exit 1
fi
