package shadowqueue

import (
	"errors"
	"runtime"
	"testing"
)

// TestStreamForeignMessages writes, as any client with the stream's
// credentials can, messages that no sidecar writes into a real stream, and
// reads it the ways a sidecar does. A fragment that claims a 256 MiB record
// costs the reader what it carries (on 58fa1c0 ReadAll allocated 256 MiB
// for it); a record with a 300-byte routing key fails Follow and ReadAll
// with a *FieldError naming the field; Last passes over it, so that the
// log's writer still starts.
func TestStreamForeignMessages(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	good := Record{Kind: KindDelivery, ID: 1, Queue: "q", Body: []byte("m")}
	claim := fragment(fragmentHeader{ID: 9, Count: maxAssembledLen, Total: maxAssembledLen}, []byte{1})
	describe := func(int) string { return "a foreign message" }
	if err := l.writeBodies(ctx, [][]byte{AppendRecord(nil, &good), claim}, describe); err != nil {
		t.Fatal(err)
	}

	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	recs, err := l.ReadAll(ctx)
	runtime.ReadMemStats(&ms1)
	if err != nil || len(recs) != 1 || recs[0].ID != 1 {
		t.Fatalf("ReadAll = %d records, %v; want record 1 and the open fragment set dropped", len(recs), err)
	}
	if got := ms1.TotalAlloc - ms0.TotalAlloc; got > 64<<20 {
		t.Errorf("reading a log with a fragment that claims 256 MiB allocated %d MiB, want under 64 MiB (the stream client's buffers)", got>>20)
	}

	bad := longRoutingKey()
	if err := l.writeBodies(ctx, [][]byte{AppendRecord(nil, &bad)}, describe); err != nil {
		t.Fatal(err)
	}
	var fe *FieldError
	if _, err := l.ReadAll(ctx); !errors.As(err, &fe) || fe.Field != "RoutingKey" {
		t.Errorf("ReadAll of a log with a 300-byte routing key = %v, want a *FieldError on RoutingKey", err)
	}
	var seen []uint64
	err = l.Follow(ctx, func(_ int64, r Record) error { seen = append(seen, r.ID); return nil })
	if !errors.As(err, &fe) || fe.Field != "RoutingKey" {
		t.Errorf("Follow of a log with a 300-byte routing key = %v, want a *FieldError on RoutingKey", err)
	}
	if len(seen) != 1 || seen[0] != 1 {
		t.Errorf("Follow handed out records %v, want [1]: nothing from the bad record on", seen)
	}
	last, ok, err := l.Last(ctx)
	if err != nil || !ok || last.ID != 1 {
		t.Errorf("Last = %+v, %v, %v; want record 1, passing over the foreign messages", last, ok, err)
	}
}
