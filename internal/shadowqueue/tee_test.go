package shadowqueue

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// memLog is an in-memory Log for the Tee's own logic; the Tee against the
// real stream is tested through the sidecar.
type memLog struct {
	mu      sync.Mutex
	recs    []Record
	fail    int // fail this many writes
	writes  int
	release chan struct{} // if set, each write waits for it
}

func (m *memLog) Write(ctx context.Context, recs []Record) error {
	if m.release != nil {
		select {
		case <-m.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writes++
	if m.fail > 0 {
		m.fail--
		return errors.New("log down")
	}
	m.recs = append(m.recs, recs...)
	return nil
}
func (m *memLog) Last(context.Context) (Record, bool, error) { return Record{}, false, nil }
func (m *memLog) Close() error                               { return nil }

func (m *memLog) ids() []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []uint64
	for _, r := range m.recs {
		out = append(out, r.ID)
	}
	return out
}

func runTee(t *testing.T, l Log, last Record) *Tee {
	t.Helper()
	tee := NewTee(l, last, TeeOptions{RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := tee.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("tee.Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return tee
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestTeeNumbersFromTheLastRecord(t *testing.T) {
	l := &memLog{}
	tee := runTee(t, l, Record{Kind: KindCutoff, ID: 41, Epoch: 3})
	var last Ticket
	for range 5 {
		_, last = tee.Append(Record{Queue: "q"})
	}
	if err := tee.Wait(waitCtx(t), last); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]uint64{42, 43, 44, 45, 46}, l.ids()); d != "" {
		t.Errorf("IDs (-want +got):\n%s", d)
	}
	for _, r := range l.recs {
		if r.Epoch != 3 || r.Kind != KindDelivery || r.Time.IsZero() {
			t.Errorf("record %+v: want a stamped delivery in epoch 3", r)
		}
	}
}

func TestTeeRetriesInOrder(t *testing.T) {
	l := &memLog{fail: 3}
	tee := runTee(t, l, Record{})
	var last Ticket
	for range 10 {
		_, last = tee.Append(Record{})
	}
	if err := tee.Wait(waitCtx(t), last); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, l.ids()); d != "" {
		t.Errorf("IDs after retries (-want +got):\n%s", d)
	}
	if s := tee.Status(); s.Degraded || s.ConfirmedID != 10 || s.Pending != 0 {
		t.Errorf("status after recovery = %+v", s)
	}
}

func TestTeeWaitBlocksUntilDurable(t *testing.T) {
	l := &memLog{release: make(chan struct{})}
	tee := runTee(t, l, Record{})
	_, tk := tee.Append(Record{})
	if tee.Durable(tk) {
		t.Fatal("durable before the log confirmed it")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := tee.Wait(ctx, tk); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want deadline exceeded while the log holds the write", err)
	}
	close(l.release)
	if err := tee.Wait(waitCtx(t), tk); err != nil || !tee.Durable(tk) {
		t.Fatalf("Wait = %v, durable %v after the log confirmed", err, tee.Durable(tk))
	}
}

func TestTeeDegradedWhileFailing(t *testing.T) {
	l := &memLog{fail: 1 << 30}
	tee := runTee(t, l, Record{})
	tee.Append(Record{})
	deadline := time.Now().Add(5 * time.Second)
	for !tee.Status().Degraded {
		if time.Now().After(deadline) {
			t.Fatal("never degraded")
		}
		time.Sleep(time.Millisecond)
	}
	if s := tee.Status(); s.Pending != 1 || s.ConfirmedID != 0 || s.LastError == "" {
		t.Errorf("status = %+v, want one pending record and the error", s)
	}
}

func TestTeeMarkers(t *testing.T) {
	l := &memLog{}
	tee := runTee(t, l, Record{})
	tee.Append(Record{})
	tee.Append(Record{})
	id, epoch, _ := tee.AppendMarker(KindCutoff)
	if id != 2 || epoch != 1 {
		t.Fatalf("cutoff = id %d epoch %d, want 2 and 1", id, epoch)
	}
	id, epoch, tk := tee.AppendMarker(KindResume)
	if id != 2 || epoch != 1 {
		t.Fatalf("resume = id %d epoch %d, want 2 and 1", id, epoch)
	}
	if err := tee.Wait(waitCtx(t), tk); err != nil {
		t.Fatal(err)
	}
	nextID, tk := tee.Append(Record{})
	if err := tee.Wait(waitCtx(t), tk); err != nil {
		t.Fatal(err)
	}
	if nextID != 3 {
		t.Errorf("delivery after the markers got ID %d, want 3", nextID)
	}
	var kinds []Kind
	for _, r := range l.recs {
		kinds = append(kinds, r.Kind)
	}
	if d := cmp.Diff([]Kind{KindDelivery, KindDelivery, KindCutoff, KindResume, KindDelivery}, kinds); d != "" {
		t.Errorf("kinds (-want +got):\n%s", d)
	}
}

// TestTeeBackpressure: the pending bounds, in records and in bytes, make
// WaitRoom block once reached, until the log has taken the backlog down to
// half; Append itself never blocks, and nothing is dropped.
func TestTeeBackpressure(t *testing.T) {
	body := make([]byte, 1000)
	recLen := int64(encodedRecordLen(&Record{Kind: KindDelivery, ID: 1, Time: time.Unix(1, 0), Queue: "q", Body: body}))
	for _, tc := range []struct {
		name string
		opts TeeOptions
		full int // appends after which WaitRoom blocks
	}{
		{"records", TeeOptions{MaxPendingRecords: 10, MaxPendingBytes: 1 << 30}, 10},
		{"bytes", TeeOptions{MaxPendingRecords: 1 << 20, MaxPendingBytes: 5 * recLen}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &memLog{release: make(chan struct{})}
			tc.opts.RetryMin, tc.opts.RetryMax = time.Millisecond, 5*time.Millisecond
			tee := NewTee(l, Record{}, tc.opts)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				if err := tee.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("tee.Run: %v", err)
				}
			}()
			t.Cleanup(func() { cancel(); <-done })

			for i := range tc.full + 3 { // past the bound: Append does not block
				if i == tc.full-1 && tee.Full() {
					t.Fatalf("full after %d appends, want after %d", i, tc.full)
				}
				tee.Append(Record{Queue: "q", Body: body, Time: time.Unix(1, 0)})
			}
			if !tee.Full() || !tee.Status().Backpressure {
				t.Fatalf("status = %+v after %d appends, want backpressure", tee.Status(), tc.full+3)
			}
			short, c := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer c()
			if err := tee.WaitRoom(short); err == nil {
				t.Fatal("WaitRoom returned at the bound")
			}
			close(l.release) // the log takes everything
			wctx, c2 := context.WithTimeout(t.Context(), 10*time.Second)
			defer c2()
			if err := tee.WaitRoom(wctx); err != nil {
				t.Fatalf("WaitRoom after the log caught up: %v", err)
			}
			_, tk := tee.Append(Record{Queue: "q"})
			if err := tee.Wait(wctx, tk); err != nil {
				t.Fatal(err)
			}
			st := tee.Status()
			if st.Backpressure || st.Pending != 0 || st.PendingBytes != 0 || st.BackpressureEpisodes != 1 {
				t.Errorf("status after the log caught up = %+v, want no backpressure, nothing pending, one episode", st)
			}
			want := make([]uint64, tc.full+4)
			for i := range want {
				want[i] = uint64(i + 1)
			}
			if diff := cmp.Diff(want, l.ids()); diff != "" {
				t.Errorf("logged IDs (-want +got):\n%s", diff)
			}
		})
	}
}
