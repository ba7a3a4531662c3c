package shadowqueue

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// followN follows l from the start until fn has seen n records, and
// returns them with their offsets.
func followN(t testing.TB, l *StreamLog, n int) (recs []Record, offsets []int64) {
	t.Helper()
	errEnough := errors.New("enough")
	err := l.Follow(testCtx(t), func(offset int64, r Record) error {
		recs = append(recs, r)
		offsets = append(offsets, offset)
		if len(recs) == n {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("Follow after %d of %d records: %v", len(recs), n, err)
	}
	return recs, offsets
}

// recordOffsets decodes the stream's raw messages on their own and returns
// the offset at which each record must come out of Follow: a batch's
// offset for each of its records, a fragmented record's last fragment's.
func recordOffsets(t testing.TB, l *StreamLog) []int64 {
	t.Helper()
	var offsets []int64
	var asm reassembler
	var recs []Record
	for _, m := range rawMessages(t, l) {
		var err error
		if recs, err = asm.add(recs[:0], m.offset, m.body); err != nil {
			t.Fatalf("offset %d: %v", m.offset, err)
		}
		for range recs {
			offsets = append(offsets, m.offset)
		}
	}
	return offsets
}

// skipSeen drops each delivery whose ID is not above the last one kept, as
// replay's Collector does with records that a retried write stored twice.
func skipSeen(recs []Record) []Record {
	var out []Record
	var last uint64
	for _, r := range recs {
		if len(out) > 0 && r.ID <= last {
			continue
		}
		out = append(out, r)
		last = r.ID
	}
	return out
}

// TestStreamBatchedWrite writes 1000 small records in one Write: they take
// a handful of batch messages and read back the same through every reader.
func TestStreamBatchedWrite(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	want := deliveries(1, 1000, 2500) // about 2.5 MB: three batches
	if err := l.Write(ctx, want); err != nil {
		t.Fatalf("Write: %v", err)
	}

	msgs := rawMessages(t, l)
	if len(msgs) != 3 {
		t.Errorf("a Write of 1000 records of about 2.5 kB made %d messages, want 3", len(msgs))
	}
	total := 0
	for _, m := range msgs {
		got, err := decodeBatch(nil, m.body)
		if err != nil {
			t.Fatalf("message at offset %d is not a batch: %v", m.offset, err)
		}
		total += len(got)
	}
	if total != len(want) {
		t.Errorf("the batches hold %d records, want %d", total, len(want))
	}

	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatalf("ReadAll: %v", err)
	}
	if diff := cmp.Diff(want, got, bytesEqual); diff != "" {
		t.Errorf("ReadAll mismatch (-want +got):\n%s", diff)
	}
	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(want[len(want)-1], r, bytesEqual); diff != "" {
		t.Errorf("Last mismatch (-want +got):\n%s", diff)
	}

	wantOffsets := recordOffsets(t, l)
	if n := len(slices.Compact(slices.Clone(wantOffsets))); n != 3 {
		t.Fatalf("the records lie at %d offsets, want 3", n)
	}
	followed, offsets := followN(t, l, len(want))
	if diff := cmp.Diff(want, followed, bytesEqual); diff != "" {
		t.Errorf("Follow mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantOffsets, offsets); diff != "" {
		t.Errorf("Follow offsets mismatch (-want +got):\n%s", diff)
	}

	// Last finds the last record of a batch behind more markers than its
	// first window holds.
	more := deliveries(1001, 2, 10)
	if err := l.Write(ctx, more); err != nil {
		t.Fatal(err)
	}
	env := mustReadEnv(t, l)
	for range 20 {
		if _, err := l.tail(ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	r, ok, err = l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(more[1], r); diff != "" {
		t.Errorf("Last behind markers mismatch (-want +got):\n%s", diff)
	}
}

// TestStreamBatchesAroundFragments writes small records, a 5 MiB one and
// small records again in one Write.
func TestStreamBatchesAroundFragments(t *testing.T) {
	l := openTestStream(t, StreamOptions{})
	ctx := testCtx(t)
	want := append(append(deliveries(1, 100, 100), bigRecord(101, 5<<20)), deliveries(102, 100, 100)...)
	if err := l.Write(ctx, want); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if got, wantKinds := messageKinds(t, l), "3"+"222222"+"3"; got != wantKinds {
		t.Errorf("messages in the stream, by first byte: %s, want %s", got, wantKinds)
	}

	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatalf("ReadAll: %v", err)
	}
	if diff := cmp.Diff(want, got, bytesEqual); diff != "" {
		t.Errorf("ReadAll mismatch (-want +got):\n%s", diff)
	}
	r, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last = ok %v, %v", ok, err)
	}
	if diff := cmp.Diff(want[len(want)-1], r, bytesEqual); diff != "" {
		t.Errorf("Last mismatch (-want +got):\n%s", diff)
	}

	followed, offsets := followN(t, l, len(want))
	if diff := cmp.Diff(want, followed, bytesEqual); diff != "" {
		t.Errorf("Follow mismatch (-want +got):\n%s", diff)
	}
	var wantOffsets []int64
	for range 100 {
		wantOffsets = append(wantOffsets, 0) // the first batch
	}
	wantOffsets = append(wantOffsets, 6) // the last fragment
	for range 100 {
		wantOffsets = append(wantOffsets, 7) // the second batch
	}
	if diff := cmp.Diff(wantOffsets, offsets); diff != "" {
		t.Errorf("Follow offsets mismatch (-want +got):\n%s", diff)
	}
}

// TestStreamInterruptedBatchedWrite stores the first messages of a Write,
// as a write that fails part-way does, then writes the records again as
// the Tee would: readers see every record stored, some twice, and a reader
// that skips the IDs it has seen (as replay does) sees each record once,
// in order.
func TestStreamInterruptedBatchedWrite(t *testing.T) {
	recs := append(append(deliveries(1, 600, 2000), bigRecord(601, 3<<20)), deliveries(602, 50, 100)...)
	bodies, parts, err := encodeBodies(recs, fragmentChunk)
	if err != nil {
		t.Fatal(err)
	}
	// Two batches, four fragments, one batch.
	if len(bodies) != 7 || parts[1].batch == 0 || parts[2].count != 4 || parts[6].batch != 50 {
		t.Fatalf("test setup: the Write makes messages %+v, want two batches, four fragments and a batch of 50", parts)
	}
	tests := map[string]struct {
		sent       int // messages stored before the failure
		wantStored []Record
	}{
		"after the first batch":     {sent: 1, wantStored: recs[:parts[1].rec]},
		"inside the large record":   {sent: 4, wantStored: recs[:600]},
		"before the last batch":     {sent: 6, wantStored: recs[:601]},
		"before anything was saved": {sent: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l := openTestStream(t, StreamOptions{})
			ctx := testCtx(t)
			if tc.sent > 0 {
				if err := l.writeBodies(ctx, bodies[:tc.sent], func(i int) string { return fmt.Sprintf("message %d", i) }); err != nil {
					t.Fatal(err)
				}
			}
			got, err := l.ReadAll(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantStored, got, bytesEqual); diff != "" {
				t.Errorf("ReadAll of the cut-short write mismatch (-want +got):\n%s", diff)
			}
			r, ok, err := l.Last(ctx)
			if err != nil || ok != (len(tc.wantStored) > 0) {
				t.Fatalf("Last of the cut-short write = ok %v, %v; want ok %v", ok, err, len(tc.wantStored) > 0)
			}
			if ok {
				if diff := cmp.Diff(tc.wantStored[len(tc.wantStored)-1], r, bytesEqual); diff != "" {
					t.Errorf("Last of the cut-short write mismatch (-want +got):\n%s", diff)
				}
			}

			// The retry.
			if err := l.Write(ctx, recs); err != nil {
				t.Fatal(err)
			}
			wantAll := append(slices.Clone(tc.wantStored), recs...)
			got, err = l.ReadAll(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantAll, got, bytesEqual); diff != "" {
				t.Errorf("ReadAll after the retry mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(recs, skipSeen(got), bytesEqual); diff != "" {
				t.Errorf("ReadAll after the retry, seen IDs skipped, mismatch (-want +got):\n%s", diff)
			}
			r, ok, err = l.Last(ctx)
			if err != nil || !ok {
				t.Fatalf("Last after the retry = ok %v, %v", ok, err)
			}
			if diff := cmp.Diff(recs[len(recs)-1], r, bytesEqual); diff != "" {
				t.Errorf("Last after the retry mismatch (-want +got):\n%s", diff)
			}
			followed, _ := followN(t, l, len(wantAll))
			if diff := cmp.Diff(recs, skipSeen(followed), bytesEqual); diff != "" {
				t.Errorf("Follow after the retry, seen IDs skipped, mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
