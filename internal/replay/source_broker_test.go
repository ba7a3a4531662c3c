package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/internal/replay"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// recording wraps a Follower and keeps every record ID that the log reader
// handed out, in order, so that the test sees duplicates the Collector
// would hide.
type recording struct {
	replay.Follower
	mu  sync.Mutex
	ids []uint64
}

func (r *recording) FollowFrom(ctx context.Context, o shadowqueue.FollowOptions, fn func(int64, shadowqueue.Record) error) (int64, error) {
	return r.Follower.FollowFrom(ctx, o, func(off int64, rec shadowqueue.Record) error {
		r.mu.Lock()
		r.ids = append(r.ids, rec.ID)
		r.mu.Unlock()
		return fn(off, rec)
	})
}

func (r *recording) seen() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.ids...)
}

// killStreamConnections ends, on the broker, every stream connection whose
// client-provided name is name, as a broker restart or an operator's close
// would, and returns how many it ended. It touches no other connection: the
// broker is shared.
func killStreamConnections(t *testing.T, name string) int {
	t.Helper()
	expr := fmt.Sprintf(`Named = fun(P) -> case catch rabbit_stream_reader:info(P, [client_properties]) of `+
		`[{client_properties, Props}] -> lists:member({<<"connection_name">>, longstr, <<"%s">>}, Props); _ -> false end end, `+
		`length([exit(P, kill) || P <- rabbit_stream:list(<<"/">>), Named(P)]).`, name)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out []byte
	var err error
	// Listing races with other tests' connections coming and going (a
	// noproc error): try again.
	for attempt := 1; attempt <= 5; attempt++ {
		if out, err = exec.CommandContext(ctx, "rabbitmqctl", "-q", "eval", expr).CombinedOutput(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("rabbitmqctl eval (close the reader's connection): %v: %s", err, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("rabbitmqctl eval: %q: %v", out, err)
	}
	return n
}

// TestSourceReconnectsAfterBrokerClose (issue 21): the broker closes the
// replay reader's connection, twice, while the source is still writing;
// the Source says it is reconnecting, follows the log again from where it
// stopped, and hands out every record once, in order: no gap, no
// duplicate, including a record in fragments.
func TestSourceReconnectsAfterBrokerClose(t *testing.T) {
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		testenv.Missing(t, "rabbitmqctl", "run the tests on the machine that runs RabbitMQ (hack/setup.sh)")
	}
	b := testenv.RequireBroker(t)
	name := testenv.UniqueName("ms2m-test-reconnect")
	readerName := testenv.UniqueName("ms2m-test-reader")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer cancel()
		if err := shadowqueue.DeleteStream(c, b.StreamURI, name); err != nil {
			t.Logf("delete the test's stream %s: %v", name, err)
		}
	})
	w, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{URI: b.StreamURI, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{URI: b.StreamURI, Name: name, ReaderName: readerName})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	const n = 300
	big := bytes.Repeat([]byte("f"), 5<<19) // 2.5 MiB: three fragments
	rec := func(id uint64) shadowqueue.Record {
		q := "a"
		if id%3 == 0 {
			q = "b"
		}
		body := []byte(fmt.Sprintf("m-%d", id))
		if id == 150 || id == 250 {
			body = big
		}
		return shadowqueue.Record{Kind: shadowqueue.KindDelivery, ID: id, Queue: q, Body: body, Time: time.Unix(int64(id), 0)}
	}
	// write IDs from..to: half in one batch message, the rest one by one.
	write := func(from, to uint64) {
		t.Helper()
		var batch []shadowqueue.Record
		for id := from; id <= to; id++ {
			batch = append(batch, rec(id))
			if id < (from+to)/2 && id != to {
				continue
			}
			if err := w.Write(ctx, batch); err != nil {
				t.Fatalf("write IDs up to %d: %v", id, err)
			}
			batch = nil
		}
	}

	follower := &recording{Follower: r}
	src, err := replay.NewSource(follower, replay.Range{Start: 0, Cutoff: n})
	if err != nil {
		t.Fatal(err)
	}
	src.RetryMin, src.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	src.Logger = testLogger(t)
	runDone := make(chan error, 1)
	go func() { runDone <- src.Run(ctx) }()

	write(1, 100)
	waitFor := func(what string, cond func(replay.Status) bool) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, what, func() bool { return cond(src.Status()) })
	}
	waitFor("the reader to read ID 100", func(s replay.Status) bool { return s.LogLast == 100 && s.Reader == replay.ReaderFollowing })

	for round, upTo := range []uint64{200, n} {
		if k := killStreamConnections(t, readerName); k < 1 {
			t.Fatalf("round %d: the broker has no stream connection named %s to close", round, readerName)
		}
		// Write on while the reader is down or coming back.
		write(src.Status().LogLast+1, upTo)
		waitFor(fmt.Sprintf("reconnect %d", round+1), func(s replay.Status) bool { return s.Reconnects >= uint64(round+1) })
		if upTo < n {
			waitFor(fmt.Sprintf("the reader to read ID %d", upTo), func(s replay.Status) bool { return s.LogLast == upTo })
		}
	}
	select {
	case err := <-runDone:
		if err != nil {
			t.Fatalf("Run = %v, want nil once the range is complete", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not end with the range complete; status %+v", src.Status())
	}

	want := make([]uint64, n)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	if diff := cmp.Diff(want, follower.seen()); diff != "" {
		t.Errorf("IDs the reader handed out across the reconnects (-want +got):\n%s", diff)
	}
	var got []uint64
	for _, q := range []string{"a", "b"} {
		for i := 0; ; i++ {
			rec, done, err := src.Next(ctx, q, i)
			if err != nil {
				t.Fatalf("Next(%s, %d): %v", q, i, err)
			}
			if done {
				break
			}
			if wantBody := string(recBody(rec.ID, big)); string(rec.Body) != wantBody {
				t.Errorf("record %d: body of %d bytes, want %d", rec.ID, len(rec.Body), len(wantBody))
			}
			got = append(got, rec.ID)
		}
	}
	if len(got) != n {
		t.Errorf("the queues hold %d records, want %d", len(got), n)
	}
	if s := src.Status(); s.Reader != replay.ReaderDone || !s.Complete || s.Reconnects != 2 {
		t.Errorf("status = %+v, want done, complete, 2 reconnects", s)
	}
}

func recBody(id uint64, big []byte) []byte {
	if id == 150 || id == 250 {
		return big
	}
	return []byte(fmt.Sprintf("m-%d", id))
}

// fakeFollower fails with a lost connection until it is let through, and
// then hands out records from the offset it is asked for.
type fakeFollower struct {
	mu    sync.Mutex
	recs  []shadowqueue.Record // offset i holds recs[i]
	down  bool
	froms []int64
}

func (f *fakeFollower) FollowFrom(ctx context.Context, o shadowqueue.FollowOptions, fn func(int64, shadowqueue.Record) error) (int64, error) {
	f.mu.Lock()
	f.froms = append(f.froms, o.From)
	down, recs := f.down, f.recs
	f.mu.Unlock()
	if down {
		return o.From, fmt.Errorf("%w: connection refused", shadowqueue.ErrReaderDisconnected)
	}
	if o.Subscribed != nil {
		o.Subscribed()
	}
	next := o.From
	for i := o.From; i < int64(len(recs)); i++ {
		if err := fn(i, recs[i]); err != nil {
			return i, err
		}
		next = i + 1
		if i == 1 {
			f.mu.Lock()
			f.down = true // the connection drops after offset 1
			f.mu.Unlock()
			return next, fmt.Errorf("%w: subscription closed", shadowqueue.ErrReaderDisconnected)
		}
	}
	<-ctx.Done()
	return next, context.Cause(ctx)
}

// TestSourceStatusWhileDisconnected: while the reader cannot reconnect,
// Status says reconnecting, since when and why, and Next waits rather than
// fail; once the log is reachable, the reader goes on from the offset after
// the last record it took.
func TestSourceStatusWhileDisconnected(t *testing.T) {
	f := &fakeFollower{}
	for id := uint64(1); id <= 4; id++ {
		f.recs = append(f.recs, shadowqueue.Record{Kind: shadowqueue.KindDelivery, ID: id, Queue: "q"})
	}
	src, err := replay.NewSource(f, replay.Range{Cutoff: 4})
	if err != nil {
		t.Fatal(err)
	}
	src.RetryMin, src.RetryMax = time.Millisecond, 5*time.Millisecond
	src.Logger = testLogger(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()

	testenv.Eventually(t, 10*time.Second, "the reader to report reconnecting", func() bool {
		s := src.Status()
		return s.Reader == replay.ReaderReconnecting && s.DisconnectedSince != nil && strings.Contains(s.Disconnected, "connection refused")
	})
	if s := src.Status(); s.Offset != 2 || s.LogLast != 2 || s.Error != "" {
		t.Errorf("status while down = %+v, want offset 2, last ID 2, no error", s)
	}
	short, c := context.WithTimeout(ctx, 50*time.Millisecond)
	defer c()
	if _, _, err := src.Next(short, "q", 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next while down = %v, want it to wait", err)
	}
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	var ids []uint64
	for i := 0; ; i++ {
		rec, end, err := src.Next(ctx, "q", i)
		if err != nil {
			t.Fatal(err)
		}
		if end {
			break
		}
		ids = append(ids, rec.ID)
	}
	if diff := cmp.Diff([]uint64{1, 2, 3, 4}, ids); diff != "" {
		t.Errorf("replayed IDs (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	froms := f.froms
	f.mu.Unlock()
	if froms[0] != 0 || froms[len(froms)-1] != 2 {
		t.Errorf("followed from offsets %v, want 0 first and 2 last", froms)
	}
	if s := src.Status(); s.Reader != replay.ReaderDone || s.Reconnects != 1 || s.DisconnectedSince != nil {
		t.Errorf("status at the end = %+v, want done after one reconnect", s)
	}
}
