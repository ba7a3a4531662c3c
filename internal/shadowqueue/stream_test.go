package shadowqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/ms2m/ms2m/internal/testenv"
)

// Compile-time check: StreamLog is a Log.
var _ Log = (*StreamLog)(nil)

// openTestStream opens a StreamLog on a fresh stream that is deleted when
// the test ends.
func openTestStream(t testing.TB, o StreamOptions) *StreamLog {
	t.Helper()
	uri := requireStream(t)
	if o.URI == "" {
		o.URI = uri
	}
	if o.Name == "" {
		o.Name = testenv.UniqueName("ms2m-test-" + strings.ReplaceAll(t.Name(), "/", "-"))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := OpenStream(ctx, o)
	if err != nil {
		t.Fatalf("OpenStream: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		if err := DeleteStream(ctx, o.URI, o.Name); err != nil {
			t.Errorf("DeleteStream: %v", err)
		}
	})
	return l
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// deliveries returns n delivery records with IDs first, first+1, ...
func deliveries(first uint64, n int, bodySize int) []Record {
	recs := make([]Record, n)
	for i := range recs {
		id := first + uint64(i)
		body := bytes.Repeat([]byte{byte(id)}, bodySize)
		copy(body, fmt.Sprintf("msg %d", id))
		recs[i] = Record{
			Kind:        KindDelivery,
			ID:          id,
			Time:        time.Unix(1700000000, int64(id)),
			Queue:       "orders",
			Exchange:    "amq.direct",
			RoutingKey:  "orders",
			ConsumerTag: "ctag-1",
			Redelivered: id%7 == 0,
			Properties:  []byte{0x10, 0x00, 0x02},
			Body:        body,
		}
	}
	return recs
}

// bytesEqual makes cmp compare byte slices with bytes.Equal: element by
// element, it takes seconds for megabytes.
var bytesEqual = cmp.Comparer(bytes.Equal)

// breakConnection closes the writer's connection behind the StreamLog's
// back, as a broker restart or network failure would.
func breakConnection(t testing.TB, l *StreamLog) {
	t.Helper()
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	if c == nil {
		t.Fatal("breakConnection: the log has no connection")
	}
	_ = c.env.Close()
}

func TestStreamWriteThenReadAll(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)

	var want []Record
	batches := [][]Record{
		deliveries(1, 3, 100),
		{{Kind: KindCutoff, ID: 3, Epoch: 1, Time: time.Unix(1700000100, 0)}},
		{{Kind: KindResume, ID: 3, Epoch: 1, Time: time.Unix(1700000101, 0)}},
		deliveries(4, 100, 1024),
		{{Kind: KindDelivery, ID: 104}}, // no time, no strings, no body
	}
	for _, b := range batches {
		start := time.Now()
		if err := l.Write(ctx, b); err != nil {
			t.Fatalf("Write of %d records: %v", len(b), err)
		}
		t.Logf("Write of %d records took %v", len(b), time.Since(start))
		want = append(want, b...)
	}
	if err := l.Write(ctx, nil); err != nil {
		t.Fatalf("Write of no records: %v", err)
	}

	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatalf("ReadAll: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadAll mismatch (-want +got):\n%s", diff)
	}
	// ReadAll's own tail markers are not records.
	got, err = l.ReadAll(ctx)
	if err != nil {
		t.Fatalf("second ReadAll: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("second ReadAll mismatch (-want +got):\n%s", diff)
	}
}

func TestStreamLast(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)

	for i := range 2 { // the second call sees the first call's tail marker
		r, ok, err := l.Last(ctx)
		if err != nil || ok {
			t.Fatalf("Last #%d on an empty log = %+v, %v, %v; want ok=false and no error", i+1, r, ok, err)
		}
	}
	if got, err := l.ReadAll(ctx); err != nil || len(got) != 0 {
		t.Fatalf("ReadAll on an empty log = %d records, %v; want none", len(got), err)
	}

	first := deliveries(1, 1, 10)
	if err := l.Write(ctx, first); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r, ok, err := l.Last(ctx)
		if err != nil || !ok {
			t.Fatalf("Last #%d = ok %v, %v; want the record", i+1, ok, err)
		}
		if diff := cmp.Diff(first[0], r); diff != "" {
			t.Errorf("Last #%d mismatch (-want +got):\n%s", i+1, diff)
		}
	}

	cutoff := Record{Kind: KindCutoff, ID: 1, Epoch: 1, Time: time.Unix(1700000000, 0)}
	if err := l.Write(ctx, []Record{cutoff}); err != nil {
		t.Fatal(err)
	}
	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last after a cutoff = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(cutoff, r); diff != "" {
		t.Errorf("Last after a cutoff mismatch (-want +got):\n%s", diff)
	}
}

// TestStreamLastManyMarkers checks that Last walks back over more tail
// markers than its first window holds.
func TestStreamLastManyMarkers(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	want := deliveries(9, 1, 10)
	if err := l.Write(ctx, want); err != nil {
		t.Fatal(err)
	}
	for range 40 {
		if _, err := l.tail(ctx, mustReadEnv(t, l)); err != nil {
			t.Fatal(err)
		}
	}
	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(want[0], r); diff != "" {
		t.Errorf("Last mismatch (-want +got):\n%s", diff)
	}
}

func mustReadEnv(t testing.TB, l *StreamLog) *stream.Environment {
	t.Helper()
	env, err := l.readEnvironment(testCtx(t), "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close() })
	return env
}

func TestStreamLastAfter1000Records(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	const batch, total = 100, 1000
	start := time.Now()
	for id := uint64(1); id <= total; id += batch {
		if err := l.Write(ctx, deliveries(id, batch, 200)); err != nil {
			t.Fatalf("Write of IDs %d..%d: %v", id, id+batch-1, err)
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d records in batches of %d: %v, %.0f records/s, %v per Write",
		total, batch, elapsed, total/elapsed.Seconds(), elapsed/(total/batch))

	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(deliveries(total, 1, 200)[0], r); diff != "" {
		t.Errorf("Last mismatch (-want +got):\n%s", diff)
	}
	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != total {
		t.Fatalf("ReadAll returned %d records, want %d", len(got), total)
	}
	for i, r := range got {
		if r.ID != uint64(i+1) {
			t.Fatalf("ReadAll record %d has ID %d, want %d", i, r.ID, i+1)
		}
	}
}

// TestStreamWriteLargeBatch checks that a Write over the frame size is sent
// as several batch messages, in several frames, and that a record goes out
// as one message exactly as long as it fits one frame.
func TestStreamWriteLargeBatch(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	want := deliveries(1, 12, 300_000) // about 3.6 MB: four batches of three
	if err := l.Write(ctx, want); err != nil {
		t.Fatalf("Write: %v", err)
	}

	// The largest record that fits one message, and the smallest that
	// does not.
	fits := deliveries(13, 1, 0)
	fits[0].Body = make([]byte, maxRecordLen-encodedRecordLen(&fits[0])-4)
	for encodedRecordLen(&fits[0]) < maxRecordLen {
		fits[0].Body = append(fits[0].Body, 0)
	}
	over := deliveries(14, 1, 0)
	over[0].Body = append(bytes.Clone(fits[0].Body), 1)
	if encodedRecordLen(&over[0]) != maxRecordLen+1 {
		t.Fatalf("test setup: the record over the limit is %d bytes, want %d", encodedRecordLen(&over[0]), maxRecordLen+1)
	}
	for _, recs := range [][]Record{fits, over} {
		if err := l.Write(ctx, recs); err != nil {
			t.Fatalf("Write of a record of %d bytes: %v", encodedRecordLen(&recs[0]), err)
		}
		want = append(want, recs...)
	}

	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, bytesEqual); diff != "" {
		t.Errorf("ReadAll mismatch (-want +got):\n%s", diff)
	}
	wantKinds := "3333" + "1" + "22" + "0" // ReadAll's marker
	if got := messageKinds(t, l); got != wantKinds {
		t.Errorf("messages in the stream, by first byte: %s, want %s", got, wantKinds)
	}
	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(over[0], r, bytesEqual); diff != "" {
		t.Errorf("Last mismatch (-want +got):\n%s", diff)
	}
}

// rawMessages returns the stream's messages as they are, up to a tail
// marker that it appends (and leaves out).
func rawMessages(t testing.TB, l *StreamLog) []streamMessage {
	t.Helper()
	ctx := testCtx(t)
	env := mustReadEnv(t, l)
	end, err := l.tail(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := l.subscribe(env, stream.OffsetSpecification{}.First())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.close()
	var msgs []streamMessage
	for {
		m, err := sub.next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.offset >= end {
			return msgs
		}
		msgs = append(msgs, m)
	}
}

// messageKinds returns the first byte of each message in the stream as a
// digit: 1 for a record, 2 for a fragment, 3 for a batch, 0 for a marker.
func messageKinds(t testing.TB, l *StreamLog) string {
	t.Helper()
	var b strings.Builder
	for _, m := range rawMessages(t, l) {
		if len(m.body) == 0 {
			b.WriteByte('-')
			continue
		}
		fmt.Fprint(&b, m.body[0])
	}
	return b.String()
}

// bigRecord is a delivery with a body of size bytes, not all alike.
func bigRecord(id uint64, size int) Record {
	r := deliveries(id, 1, 0)[0]
	r.Body = make([]byte, size)
	for i := range r.Body {
		r.Body[i] = byte(i % 251) // a prime period: fragments differ
	}
	return r
}

// TestStreamFragmentedRecord writes a 5 MiB record between two small ones
// and reads it back through every reader.
func TestStreamFragmentedRecord(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	want := []Record{deliveries(1, 1, 10)[0], bigRecord(2, 5<<20), deliveries(3, 1, 10)[0]}
	start := time.Now()
	if err := l.Write(ctx, want); err != nil {
		t.Fatalf("Write: %v", err)
	}
	t.Logf("Write of a %d-byte record between two small ones took %v", encodedRecordLen(&want[1]), time.Since(start))

	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatalf("ReadAll: %v", err)
	}
	if diff := cmp.Diff(want, got, bytesEqual); diff != "" {
		t.Errorf("ReadAll mismatch (-want +got):\n%s", diff)
	}
	if got, want := messageKinds(t, l), "1"+"222222"+"1"+"0"; got != want {
		t.Errorf("messages in the stream, by first byte: %s, want %s", got, want)
	}

	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(want[2], r, bytesEqual); diff != "" {
		t.Errorf("Last mismatch (-want +got):\n%s", diff)
	}

	// Follow sees the three records, then a large one written while it runs.
	followCtx, stop := context.WithCancel(ctx)
	defer stop()
	type seen struct {
		offset int64
		r      Record
	}
	records := make(chan seen, 10)
	done := make(chan error, 1)
	go func() {
		done <- l.Follow(followCtx, func(offset int64, r Record) error {
			records <- seen{offset, r}
			return nil
		})
	}()
	next := func() seen {
		t.Helper()
		select {
		case s := <-records:
			return s
		case err := <-done:
			t.Fatalf("Follow returned early: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("Follow handed out no record for 10s")
		}
		return seen{}
	}
	// The fragmented record comes with its last fragment's offset.
	for i, wantOffset := range []int64{0, 6, 7} {
		s := next()
		if s.offset != wantOffset {
			t.Errorf("Follow record %d at offset %d, want %d", i, s.offset, wantOffset)
		}
		if diff := cmp.Diff(want[i], s.r, bytesEqual); diff != "" {
			t.Errorf("Follow record %d mismatch (-want +got):\n%s", i, diff)
		}
	}
	last := bigRecord(4, 5<<20)
	start = time.Now()
	if err := l.Write(ctx, []Record{last}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	t.Logf("Write of a %d-byte record alone took %v", encodedRecordLen(&last), time.Since(start))
	if diff := cmp.Diff(last, next().r, bytesEqual); diff != "" {
		t.Errorf("Follow of a record written while it runs mismatch (-want +got):\n%s", diff)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Follow returned %v after its context was cancelled, want context.Canceled", err)
	}

	r, ok, err = l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(last, r, bytesEqual); diff != "" {
		t.Errorf("Last of a fragmented record mismatch (-want +got):\n%s", diff)
	}
}

// TestStreamInterruptedFragmentedWrite stores the first fragments of a
// record, as a write that fails half-way does, then writes the record again
// as the Tee would: readers see it once, whole.
func TestStreamInterruptedFragmentedWrite(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	first := deliveries(1, 1, 10)
	if err := l.Write(ctx, first); err != nil {
		t.Fatal(err)
	}
	big := bigRecord(2, 5<<20)
	bodies, parts, err := encodeBodies([]Record{big}, fragmentChunk)
	if err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 6 || parts[5] != (bodyPart{rec: 0, index: 5, count: 6}) {
		t.Fatalf("test setup: %d fragments, the last %+v; want 6", len(bodies), parts[len(parts)-1])
	}
	if err := l.writeBodies(ctx, bodies[:3], func(i int) string { return fmt.Sprintf("fragment %d", i) }); err != nil {
		t.Fatal(err)
	}

	// The cut-short record is not in the log yet.
	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(first[0], r); diff != "" {
		t.Errorf("Last with a cut-short record at the end mismatch (-want +got):\n%s", diff)
	}
	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, got); diff != "" {
		t.Errorf("ReadAll with a cut-short record at the end mismatch (-want +got):\n%s", diff)
	}

	// The retry.
	rest := []Record{big, deliveries(3, 1, 10)[0]}
	if err := l.Write(ctx, rest); err != nil {
		t.Fatal(err)
	}
	want := append(first, rest...)
	got, err = l.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, bytesEqual); diff != "" {
		t.Errorf("ReadAll after the retry mismatch (-want +got):\n%s", diff)
	}
	if got, want := messageKinds(t, l), "1"+"222"+"00"+"222222"+"1"+"0"; got != want {
		t.Errorf("messages in the stream, by first byte: %s, want %s", got, want)
	}
	r, ok, err = l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(want[2], r); diff != "" {
		t.Errorf("Last after the retry mismatch (-want +got):\n%s", diff)
	}
	var followed []Record
	errEnough := errors.New("enough")
	err = l.Follow(ctx, func(_ int64, r Record) error {
		followed = append(followed, r)
		if len(followed) == len(want) {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("Follow = %v", err)
	}
	if diff := cmp.Diff(want, followed, bytesEqual); diff != "" {
		t.Errorf("Follow after the retry mismatch (-want +got):\n%s", diff)
	}
}

// TestStreamLastFragmentsBeforeWindow checks that Last finds a fragmented
// record whose first fragments lie before its first window: the tail
// markers after the record push its start out of the last 16 offsets.
func TestStreamLastFragmentsBeforeWindow(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	want := []Record{deliveries(1, 1, 10)[0], bigRecord(2, 5<<20)} // offsets 0, 1 to 6
	if err := l.Write(ctx, want); err != nil {
		t.Fatal(err)
	}
	env := mustReadEnv(t, l)
	for range 12 { // offsets 7 to 18; Last's marker at 19 reads from 3 first
		if _, err := l.tail(ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(want[1], r, bytesEqual); diff != "" {
		t.Errorf("Last mismatch (-want +got):\n%s", diff)
	}
}

// TestStreamWriteTooLarge checks that a record over the 256 MiB cap is
// refused before anything is sent.
func TestStreamWriteTooLarge(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	huge := deliveries(13, 1, 0)
	huge[0].Body = make([]byte, maxAssembledLen) // never written to: the pages stay untouched
	err := l.Write(ctx, append(deliveries(12, 1, 10), huge...))
	if !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("Write of a %d-byte body = %v, want ErrRecordTooLarge", len(huge[0].Body), err)
	}
	for _, s := range []string{l.opts.Name, "record ID 13", "256 MiB"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	if got := messageKinds(t, l); got != "" {
		t.Errorf("a refused batch left messages of kinds %s in the stream", got)
	}
}

func TestStreamRetention(t *testing.T) {
	var logs bytes.Buffer
	o := StreamOptions{
		MaxAge:       time.Hour,
		MaxBytes:     10 << 20,
		SegmentBytes: 1 << 20,
		Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
	}
	l := openTestStream(t, o)
	if logs.Len() != 0 {
		t.Errorf("declaring a new stream logged: %s", logs.String())
	}

	// Opening the same stream with other retention keeps it, with a warning.
	o2 := l.opts
	o2.MaxAge = 2 * time.Hour
	l2, err := OpenStream(testCtx(t), o2)
	if err != nil {
		t.Fatalf("OpenStream of an existing stream with other retention: %v", err)
	}
	defer l2.Close()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), l.opts.Name) {
		t.Errorf("no warning naming the stream; logs: %q", logs.String())
	}
	if err := l2.Write(testCtx(t), deliveries(1, 1, 1)); err != nil {
		t.Errorf("Write through the second log: %v", err)
	}

	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		t.Skip("rabbitmqctl not on PATH: cannot check the stream's arguments")
	}
	out, err := exec.Command(ctl, "list_queues", "-q", "name", "arguments", "--formatter", "json").Output()
	if err != nil {
		t.Skipf("rabbitmqctl list_queues: %v: cannot check the stream's arguments", err)
	}
	var queues []struct {
		Name      string  `json:"name"`
		Arguments [][]any `json:"arguments"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&queues); err != nil {
		t.Fatalf("parse rabbitmqctl output: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, q := range queues {
		if q.Name != l.opts.Name {
			continue
		}
		for _, a := range q.Arguments {
			if len(a) == 3 {
				got[fmt.Sprint(a[0])] = fmt.Sprint(a[2])
			}
		}
	}
	want := map[string]string{
		"x-queue-type":                    "stream",
		"x-max-age":                       "3600s",
		"x-max-length-bytes":              "10485760",
		"x-stream-max-segment-size-bytes": "1048576",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("stream argument %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

func TestStreamWriteReconnects(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	if err := l.Write(ctx, deliveries(1, 10, 10)); err != nil {
		t.Fatal(err)
	}

	breakConnection(t, l)
	if err := l.Write(ctx, deliveries(11, 10, 10)); err != nil {
		t.Fatalf("Write after the connection closed: %v", err)
	}

	// Once the broken connection is known dead, the next Write connects
	// before it sends.
	breakConnection(t, l)
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	select {
	case <-c.dead:
	case <-ctx.Done():
		t.Fatal("the closed connection was never marked dead")
	}
	if err := l.Write(ctx, deliveries(21, 10, 10)); err != nil {
		t.Fatalf("Write after the connection was marked dead: %v", err)
	}

	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(deliveries(1, 30, 10), got); diff != "" {
		t.Errorf("ReadAll mismatch (-want +got):\n%s", diff)
	}
}

func TestStreamWriteCancel(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	hold := make(chan struct{})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) })
	l.mu.Lock()
	l.holdConfirms = hold
	l.mu.Unlock()
	breakConnection(t, l) // the next connection holds its confirmations

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := l.Write(ctx, deliveries(77, 5, 10))
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write with unconfirmed records = %v, want context.DeadlineExceeded", err)
	}
	if elapsed > 2*time.Second {
		t.Errorf("Write took %v to notice its context ended", elapsed)
	}
	for _, s := range []string{l.opts.Name, "record ID 77"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}

	// Once confirmations flow again, writes succeed.
	release.Do(func() { close(hold) })
	l.mu.Lock()
	l.holdConfirms = nil
	l.mu.Unlock()
	if err := l.Write(testCtx(t), deliveries(78, 5, 10)); err != nil {
		t.Fatalf("Write after the hold: %v", err)
	}
}

// silentServer accepts TCP connections and never answers, like a broker
// that hangs.
func silentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

func TestOpenStreamHonoursContext(t *testing.T) {
	addr := silentServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := OpenStream(ctx, StreamOptions{URI: "rabbitmq-stream://guest:guest@" + addr + "/", Name: "never"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("OpenStream against a silent server = %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("OpenStream took %v to notice its context ended", elapsed)
	}
}

func TestStreamWriteReconnectHonoursContext(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	// Point the log at a broker that hangs, then lose the connection.
	addr := silentServer(t)
	r, err := streamResolver("rabbitmq-stream://guest:guest@" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	good, goodResolver := l.opts.URI, l.resolver
	l.opts.URI, l.resolver = "rabbitmq-stream://guest:guest@"+addr+"/", r
	l.mu.Unlock()
	breakConnection(t, l)

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = l.Write(ctx, deliveries(1, 1, 1))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write while reconnecting to a silent server = %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Write took %v to notice its context ended", elapsed)
	}

	l.mu.Lock()
	l.opts.URI, l.resolver = good, goodResolver
	l.mu.Unlock()
	if err := l.Write(testCtx(t), deliveries(1, 1, 1)); err != nil {
		t.Fatalf("Write once the broker is back: %v", err)
	}
}

func TestStreamFollow(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	if err := l.Write(ctx, deliveries(1, 5, 10)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Last(ctx); err != nil { // leaves a tail marker for Follow to skip
		t.Fatal(err)
	}

	followCtx, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	var got []Record
	lastOffset := int64(-1)
	done := make(chan error, 1)
	go func() {
		done <- l.Follow(followCtx, func(offset int64, r Record) error {
			mu.Lock()
			defer mu.Unlock()
			if offset < lastOffset { // equal for the records of one batch
				return fmt.Errorf("offset %d after %d", offset, lastOffset)
			}
			lastOffset = offset
			got = append(got, r)
			return nil
		})
	}()
	if err := l.Write(ctx, deliveries(6, 5, 10)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "Follow to see 10 records", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 10
	})
	stop()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Follow returned %v after its context was cancelled, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Follow did not return after its context was cancelled")
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(deliveries(1, 10, 10), got); diff != "" {
		t.Errorf("Follow mismatch (-want +got):\n%s", diff)
	}

	// An error from fn ends Follow and comes back as it is.
	errStop := errors.New("stop here")
	n := 0
	err := l.Follow(ctx, func(int64, Record) error {
		n++
		if n == 3 {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) || n != 3 {
		t.Errorf("Follow = %v after %d calls, want errStop after 3", err, n)
	}
}

func TestStreamResolver(t *testing.T) {
	tests := map[string]struct {
		uri      string
		wantHost string
		wantPort int
		wantErr  string
	}{
		"full":         {uri: "rabbitmq-stream://u:p@broker.example:5553/vh", wantHost: "broker.example", wantPort: 5553},
		"default port": {uri: "rabbitmq-stream://u:p@10.0.0.1/", wantHost: "10.0.0.1", wantPort: 5552},
		"ipv6":         {uri: "rabbitmq-stream://u:p@[::1]:5552/", wantHost: "::1", wantPort: 5552},
		"amqp scheme":  {uri: "amqp://u:p@h:5672/", wantErr: `scheme is "amqp"`},
		"no host":      {uri: "rabbitmq-stream:///", wantErr: "no host"},
		"bad port":     {uri: "rabbitmq-stream://h:port/", wantErr: "parse"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r, err := streamResolver(tc.uri)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("streamResolver(%q) error = %v, want one containing %q", tc.uri, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Host != tc.wantHost || r.Port != tc.wantPort {
				t.Errorf("streamResolver(%q) = %s:%d, want %s:%d", tc.uri, r.Host, r.Port, tc.wantHost, tc.wantPort)
			}
		})
	}
}

// BenchmarkStreamWriteFragmented measures one Write of a record with a
// 5 MiB body, sent as six fragments.
func BenchmarkStreamWriteFragmented(b *testing.B) {
	l := openTestStream(b, StreamOptions{})
	ctx := b.Context()
	recs := []Record{bigRecord(1, 5<<20)}
	b.ReportAllocs()
	b.SetBytes(int64(encodedRecordLen(&recs[0])))
	for b.Loop() {
		if err := l.Write(ctx, recs); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamWrite measures one Write of n records with 1 KiB bodies:
// its latency is ns/op.
func BenchmarkStreamWrite(b *testing.B) {
	for _, n := range []int{1, 100, 512} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			l := openTestStream(b, StreamOptions{})
			ctx := b.Context()
			recs := deliveries(1, n, 1024)
			b.ReportAllocs()
			b.SetBytes(int64(n * encodedRecordLen(&recs[0])))
			for b.Loop() {
				if err := l.Write(ctx, recs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// TestStreamRecent checks that Recent returns the log's last n records,
// oldest first, across windows that start inside batches, among tail
// markers, and on a log shorter than n.
func TestStreamRecent(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	if got, err := l.Recent(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("Recent on an empty log = %d records, %v; want none", len(got), err)
	}
	var all []Record
	for id := uint64(1); id <= 100; id++ { // one message each: a window of 64 holds too few
		rec := deliveries(id, 1, 10)
		if err := l.Write(ctx, rec); err != nil {
			t.Fatal(err)
		}
		all = append(all, rec...)
	}
	cutoff := Record{Kind: KindCutoff, ID: 100, Epoch: 1, Time: time.Unix(1700000000, 0)}
	batch := deliveries(101, 50, 10) // one message: the windows start inside none
	for _, recs := range [][]Record{{cutoff}, batch} {
		if err := l.Write(ctx, recs); err != nil {
			t.Fatal(err)
		}
		all = append(all, recs...)
	}
	env := mustReadEnv(t, l)
	for range 70 { // more markers than the first window
		if _, err := l.tail(ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []int{1, 30, 51, 52, 120, 151, 4096} {
		got, err := l.Recent(ctx, n)
		if err != nil {
			t.Fatalf("Recent(%d): %v", n, err)
		}
		want := all[max(0, len(all)-n):]
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Recent(%d) mismatch (-want +got):\n%s", n, diff)
		}
	}
}
