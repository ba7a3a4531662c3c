package main

import (
	"os"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/testenv"
)

// TestRoundAgainstNATS runs one small round of every path against the
// real nats-server: each drain consumes every message (through the relay
// too, which must pass the protocol through untouched), the sidecar's log
// holds exactly them (round checks it), the target replays exactly them
// and switches to the server (round checks it too), and nothing of the
// bench's is left on the server.
func TestRoundAgainstNATS(t *testing.T) {
	n, js := connectJetStream(t)
	before := natsbenchStreams(t, js)
	const msgs = 500
	b := &bench{
		o:   options{server: n.Addr, messages: msgs, size: 10, chunk: 100, paths: []string{pathDirect, pathRelay, pathSidecar, pathReplay}},
		url: n.URL, logURL: n.URL, js: js, serverPID: findProcess("nats-server"),
	}
	out, err := b.round(t.Context(), 50, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 4 {
		t.Fatalf("%d results, want one per path: %+v", len(out), out)
	}
	for i, r := range out {
		if r.Path != b.o.paths[i] || r.Messages != msgs || r.MsgPerS <= 0 || len(r.ChunkMs) != msgs/100 {
			t.Errorf("result %d: %+v; want path %s, %d messages, a rate, %d chunks", i, r, b.o.paths[i], msgs, msgs/100)
		}
	}
	if s := out[2]; s.LogRecords != msgs || s.LogWrites == 0 {
		t.Errorf("sidecar round: %d records in %d log writes, want %d records", s.LogRecords, s.LogWrites, msgs)
	}
	if r := out[3]; r.MsgPerSFromStart <= 0 || r.MsgPerSFromStart > r.MsgPerS {
		t.Errorf("replay round: %.0f msg/s from the target's start, %.0f from Consume: want 0 < the first <= the second", r.MsgPerSFromStart, r.MsgPerS)
	}
	if after := natsbenchStreams(t, js); after > before {
		t.Errorf("%d natsbench streams after the round, %d before: the round left some behind", after, before)
	}
}

// connectJetStream connects to the real nats-server for a test.
func connectJetStream(t *testing.T) (testenv.NATS, jetstream.JetStream) {
	t.Helper()
	n := testenv.RequireNATS(t)
	_, js := testenv.ConnectJetStream(t, n.URL)
	return n, js
}

// natsbenchStreams counts the streams whose name the bench makes.
func natsbenchStreams(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	ctx := t.Context()
	count := 0
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if strings.HasPrefix(name, "natsbench-") {
			count++
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return count
}

// TestPubCostAgainstNATS runs -pubcost small against the real nats-server:
// both modes get every publish acknowledged (pubCost fails otherwise), and
// no stream is left behind.
func TestPubCostAgainstNATS(t *testing.T) {
	n, js := connectJetStream(t)
	before := natsbenchStreams(t, js)
	// Any process's CPU will do for the mechanics; the figures are not checked.
	o := options{server: n.Addr, serverPID: os.Getpid(), pubCostSizes: "100,1000", pubCostBytes: 10000}
	if err := pubCost(t.Context(), o); err != nil {
		t.Fatal(err)
	}
	if after := natsbenchStreams(t, js); after > before {
		t.Errorf("%d natsbench streams after -pubcost, %d before: it left some behind", after, before)
	}
	o.serverPID = 0
	if err := pubCost(t.Context(), o); err == nil {
		t.Error("-pubcost without -server-pid: want an error")
	}
}
