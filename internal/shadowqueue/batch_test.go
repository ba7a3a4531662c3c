package shadowqueue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// sortedCodecCases returns codecCases in name order.
func sortedCodecCases() []Record {
	names := make([]string, 0, len(codecCases))
	for name := range codecCases {
		names = append(names, name)
	}
	slices.Sort(names)
	recs := make([]Record, len(names))
	for i, name := range names {
		recs[i] = codecCases[name]
	}
	return recs
}

func TestMinRecordLen(t *testing.T) {
	r := codecCases["zero delivery"]
	if n := len(AppendRecord(nil, &r)); n != minRecordLen {
		t.Errorf("the zero delivery encodes to %d bytes, minRecordLen is %d", n, minRecordLen)
	}
}

func TestBatchRoundTrip(t *testing.T) {
	all := sortedCodecCases()
	many := make([]Record, 200) // a two-byte count
	for i := range many {
		many[i] = all[i%len(all)]
	}
	tests := map[string][]Record{
		"two zero deliveries": {codecCases["zero delivery"], codecCases["zero delivery"]},
		"every codec case":    all,
		"200 records":         many,
		"markers and a delivery": {
			codecCases["cutoff marker"], codecCases["full delivery"], codecCases["resume marker"],
		},
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			enc := appendBatch(nil, want)
			if got := batchLen(want); got != len(enc) {
				t.Errorf("batchLen = %d, want len(appendBatch) = %d", got, len(enc))
			}
			prefix := []Record{codecCases["max IDs"]}
			got, err := decodeBatch(slices.Clone(prefix), enc)
			if err != nil {
				t.Fatalf("decodeBatch: %v", err)
			}
			if diff := cmp.Diff(append(slices.Clone(prefix), want...), got, bytesEqual); diff != "" {
				t.Errorf("round trip mismatch (-want +got):\n%s", diff)
			}
			if again := appendBatch(nil, got[len(prefix):]); !bytes.Equal(again, enc) {
				t.Errorf("re-encoding differs:\n got %x\nwant %x", again, enc)
			}
		})
	}
}

func TestAppendBatchAppends(t *testing.T) {
	recs := sortedCodecCases()
	prefix := []byte("prefix")
	got := appendBatch(prefix, recs)
	if !bytes.HasPrefix(got, prefix) {
		t.Fatalf("appendBatch lost the prefix: %q", got[:len(prefix)])
	}
	if diff := cmp.Diff(appendBatch(nil, recs), got[len(prefix):]); diff != "" {
		t.Errorf("appended encoding differs (-want +got):\n%s", diff)
	}
}

// batchMsg builds a batch message by hand: the version, the count, then
// each entry as it is.
func batchMsg(count uint64, entries ...[]byte) []byte {
	b := binary.AppendUvarint([]byte{batchVersion}, count)
	for _, e := range entries {
		b = append(b, e...)
	}
	return b
}

// entry is a well-formed batch entry: r's encoding behind its length.
func entry(r Record) []byte {
	enc := AppendRecord(nil, &r)
	return append(binary.AppendUvarint(nil, uint64(len(enc))), enc...)
}

func TestDecodeBatchErrors(t *testing.T) {
	a := Record{Kind: KindDelivery, ID: 5, Queue: "q", Body: []byte("b")}
	zero := codecCases["zero delivery"]
	encA := AppendRecord(nil, &a)
	tests := map[string]struct {
		in      []byte
		wantMsg string
	}{
		"empty":              {in: nil, wantMsg: "field batch version: truncated"},
		"record version":     {in: encA, wantMsg: "batch version 1, want 3"},
		"fragment version":   {in: []byte{fragmentVersion, 1, 0, 2, 2, 'x'}, wantMsg: "batch version 2, want 3"},
		"no count":           {in: []byte{batchVersion}, wantMsg: "field batch count: truncated varint"},
		"non-minimal count":  {in: append([]byte{batchVersion, 0x82, 0x00}, append(entry(a), entry(a)...)...), wantMsg: "batch count: non-minimal varint"},
		"overflowing count":  {in: append([]byte{batchVersion}, bytes.Repeat([]byte{0xff}, 11)...), wantMsg: "batch count: varint overflows"},
		"count 0":            {in: batchMsg(0), wantMsg: "batch of 0 records in 0 bytes: want at least 2 records, of at least 12 bytes each"},
		"count 0 with bytes": {in: batchMsg(0, entry(a), entry(a)), wantMsg: "batch of 0 records"},
		"count 1":            {in: batchMsg(1, entry(a)), wantMsg: "batch of 1 records"},
		"count over what the bytes hold": {
			in: batchMsg(3, entry(zero), entry(zero)), wantMsg: "batch of 3 records in 24 bytes",
		},
		"huge count": {
			in: batchMsg(math.MaxUint64, entry(zero), entry(zero)), wantMsg: "batch of 18446744073709551615 records in 24 bytes",
		},
		"count under the entries": {
			in: batchMsg(2, entry(a), entry(a), entry(a)), wantMsg: fmt.Sprintf("%d trailing bytes after the batch's 2 records", len(entry(a))),
		},
		"trailing byte": {
			in: append(batchMsg(2, entry(a), entry(a)), 0), wantMsg: "1 trailing bytes after the batch's 2 records",
		},
		"empty entry": {
			in: batchMsg(2, entry(a), []byte{0}, bytes.Repeat([]byte{0}, minBatchEntryLen)), wantMsg: "record 1 of 2 in the batch: shadowqueue: malformed record: field version: truncated",
		},
		"non-minimal entry length": {
			in:      batchMsg(2, entry(a), append([]byte{0x80 | byte(len(encA)), 0x00}, encA...)),
			wantMsg: "record 1 of 2 in the batch: shadowqueue: malformed record: field batch entry length: non-minimal varint",
		},
		"entry over the bytes left": {
			in:      batchMsg(2, entry(a), append([]byte{byte(len(encA) + 1)}, encA...)),
			wantMsg: fmt.Sprintf("record 1 of 2 in the batch: shadowqueue: malformed record: field batch entry: length %d exceeds the %d bytes left", len(encA)+1, len(encA)),
		},
		"entry shorter than its record": {
			in:      batchMsg(2, append([]byte{byte(len(encA) - 1)}, encA...), entry(zero)),
			wantMsg: "record 0 of 2 in the batch: shadowqueue: malformed record: field Body: length 1 exceeds the 0 bytes left",
		},
		"entry longer than its record": {
			in:      batchMsg(2, append([]byte{byte(len(encA) + 1)}, append(slices.Clone(encA), 0)...), entry(zero)),
			wantMsg: "record 0 of 2 in the batch: shadowqueue: malformed record: 1 trailing bytes after Body",
		},
		"fragment inside": {
			in:      batchMsg(2, entry(a), append([]byte{13}, fragment(fragmentHeader{ID: 1, Count: 2, Total: 100}, bytes.Repeat([]byte{1}, 8))...)),
			wantMsg: "record 1 of 2 in the batch: shadowqueue: malformed record: version 2, want 1",
		},
		"batch inside": {
			in:      batchMsg(2, entry(a), append(binary.AppendUvarint(nil, uint64(len(batchMsg(2, entry(zero), entry(zero))))), batchMsg(2, entry(zero), entry(zero))...)),
			wantMsg: "record 1 of 2 in the batch: shadowqueue: malformed record: version 3, want 1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			prefix := []Record{a}
			dst := make([]Record, 1, 10)
			copy(dst, prefix)
			got, err := decodeBatch(dst, tc.in)
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("decodeBatch error = %v, want one wrapping ErrBadRecord", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("decodeBatch error = %q, want it to mention %q", err, tc.wantMsg)
			}
			if diff := cmp.Diff(prefix, got); diff != "" {
				t.Errorf("decodeBatch changed dst with its error (-want +got):\n%s", diff)
			}
			if spare := dst[1:10]; !slices.EqualFunc(spare, make([]Record, 9), func(x, y Record) bool { return cmp.Equal(x, y) }) {
				t.Errorf("decodeBatch left records of the refused batch in dst's spare capacity")
			}
		})
	}
}

func TestDecodeBatchEveryTruncation(t *testing.T) {
	enc := appendBatch(nil, sortedCodecCases())
	for i := range len(enc) {
		if got, err := decodeBatch(nil, enc[:i]); !errors.Is(err, ErrBadRecord) || len(got) != 0 {
			t.Fatalf("decodeBatch of the first %d of %d bytes = %d records, %v; want ErrBadRecord and none", i, len(enc), len(got), err)
		}
	}
}

func TestDecodeBatchAliasesBodies(t *testing.T) {
	recs := []Record{
		{Kind: KindDelivery, ID: 1, Properties: []byte{1, 2}, Body: []byte("first")},
		{Kind: KindDelivery, ID: 2, Properties: []byte{3, 4}, Body: []byte("second")},
	}
	enc := appendBatch(nil, recs)
	got, err := decodeBatch(nil, enc)
	if err != nil {
		t.Fatal(err)
	}
	if &got[1].Body[0] != &enc[len(enc)-len(recs[1].Body)] {
		t.Errorf("the last record's Body does not alias the message")
	}
	for i, r := range got {
		if cap(r.Body) != len(r.Body) || cap(r.Properties) != len(r.Properties) {
			t.Errorf("record %d: aliased slices must have their capacity capped: cap(Body)=%d cap(Properties)=%d", i, cap(r.Body), cap(r.Properties))
		}
	}
	_ = append(got[0].Body, "overwrite"...) // must not write into the next entry
	if diff := cmp.Diff(recs[1], got[1]); diff != "" {
		t.Errorf("appending to a record's Body changed the next record (-want +got):\n%s", diff)
	}
}

func TestAppendBatchAllocs(t *testing.T) {
	recs := deliveries(1, 512, 100)
	buf := make([]byte, 0, batchLen(recs))
	allocs := testing.AllocsPerRun(20, func() {
		buf = appendBatch(buf[:0], recs)
	})
	if allocs != 0 {
		t.Errorf("appendBatch into a large enough buffer allocates %v times, want 0", allocs)
	}
}

func TestDecodeBatchAllocs(t *testing.T) {
	recs := deliveries(1, 100, 100)
	enc := appendBatch(nil, recs)
	dst := make([]Record, 0, len(recs))
	allocs := testing.AllocsPerRun(20, func() {
		var err error
		if dst, err = decodeBatch(dst[:0], enc); err != nil {
			t.Fatal(err)
		}
	})
	if perRecord := allocs / float64(len(recs)); perRecord > 4 {
		t.Errorf("decodeBatch allocates %v times per record, want at most 4 (one per string field)", perRecord)
	}
}

// sized returns a delivery whose encoding is exactly n bytes (n >= 50).
func sized(id uint64, n int) Record {
	r := deliveries(id, 1, 0)[0]
	r.Body = make([]byte, n-encodedRecordLen(&r)-4)
	for encodedRecordLen(&r) < n {
		r.Body = append(r.Body, byte(len(r.Body)))
	}
	if encodedRecordLen(&r) != n {
		panic(fmt.Sprintf("sized: cannot make a record of %d bytes", n))
	}
	return r
}

// TestEncodeBodies checks how Write groups records into messages: batches
// as large as a frame takes, a lone record as a record message, and records
// too large for a frame in fragments, in order.
func TestEncodeBodies(t *testing.T) {
	small := deliveries(1, 1000, 100)
	// Two records whose batch is exactly the largest message.
	pairFirst := sized(1, 1000)
	pairSecond := sized(2, maxRecordLen-batchHeaderLen(2)-fieldLen(1000)-3) // a 3-byte length
	if batchLen([]Record{pairFirst, pairSecond}) != maxRecordLen {
		t.Fatalf("test setup: the pair's batch is %d bytes, want %d", batchLen([]Record{pairFirst, pairSecond}), maxRecordLen)
	}
	pairOver := sized(2, encodedRecordLen(&pairSecond)+1)
	tests := map[string]struct {
		recs      []Record
		wantKinds string // first byte of each message
		wantParts []bodyPart
	}{
		"one record": {
			recs: small[:1], wantKinds: "1", wantParts: []bodyPart{{}},
		},
		"two records": {
			recs: small[:2], wantKinds: "3", wantParts: []bodyPart{{batch: 2}},
		},
		"1000 small records": {
			recs: small, wantKinds: "3", wantParts: []bodyPart{{batch: 1000}},
		},
		"records of 400 kB": {
			recs:      []Record{sized(1, 400_000), sized(2, 400_000), sized(3, 400_000), sized(4, 400_000), sized(5, 400_000)},
			wantKinds: "331", wantParts: []bodyPart{{batch: 2}, {rec: 2, batch: 2}, {rec: 4}},
		},
		"batch of exactly one frame": {
			recs: []Record{pairFirst, pairSecond, small[2]}, wantKinds: "31", wantParts: []bodyPart{{batch: 2}, {rec: 2}},
		},
		"one byte over a frame": {
			recs: []Record{pairFirst, pairOver, small[2]}, wantKinds: "13", wantParts: []bodyPart{{}, {rec: 1, batch: 2}},
		},
		"largest record alone, then small ones": {
			recs: []Record{sized(1, maxRecordLen), small[1], small[2]}, wantKinds: "13", wantParts: []bodyPart{{}, {rec: 1, batch: 2}},
		},
		"small, fragmented, small": {
			recs:      []Record{small[0], sized(2, maxRecordLen+1), small[2]},
			wantKinds: "1221",
			wantParts: []bodyPart{{}, {rec: 1, index: 0, count: 2}, {rec: 1, index: 1, count: 2}, {rec: 2}},
		},
		"batches around a fragmented record": {
			recs:      append(append(slices.Clone(small[:100]), bigRecord(101, 3<<20)), small[101:200]...),
			wantKinds: "3" + "2222" + "3",
			wantParts: []bodyPart{{batch: 100}, {rec: 100, count: 4}, {rec: 100, index: 1, count: 4}, {rec: 100, index: 2, count: 4}, {rec: 100, index: 3, count: 4}, {rec: 101, batch: 99}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bodies, parts, err := encodeBodies(tc.recs, fragmentChunk)
			if err != nil {
				t.Fatal(err)
			}
			var kinds strings.Builder
			var msgs []msg
			for i, b := range bodies {
				fmt.Fprint(&kinds, b[0])
				if len(b) > maxRecordLen {
					t.Errorf("message %d is %d bytes, over maxRecordLen %d", i, len(b), maxRecordLen)
				}
				if cap(b) != len(b) {
					t.Errorf("message %d has spare capacity %d", i, cap(b)-len(b))
				}
				msgs = append(msgs, msg{offset: int64(i), body: b})
			}
			if got := kinds.String(); got != tc.wantKinds {
				t.Errorf("messages by first byte: %s, want %s", got, tc.wantKinds)
			}
			if diff := cmp.Diff(tc.wantParts, parts, cmp.AllowUnexported(bodyPart{})); diff != "" {
				t.Errorf("parts mismatch (-want +got):\n%s", diff)
			}
			got, _, err := feed(msgs)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.recs, got, bytesEqual); diff != "" {
				t.Errorf("records read back mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEncodeBodiesTooLarge(t *testing.T) {
	huge := deliveries(13, 1, 0)[0]
	huge.Body = make([]byte, maxAssembledLen)
	_, _, err := encodeBodies([]Record{deliveries(12, 1, 10)[0], huge}, fragmentChunk)
	if !errors.Is(err, ErrRecordTooLarge) || !strings.Contains(err.Error(), "record ID 13") {
		t.Errorf("encodeBodies of a record over the cap = %v, want ErrRecordTooLarge naming record ID 13", err)
	}
}

// BenchmarkEncodeBodies measures the encoding of one Tee batch of small
// records.
func BenchmarkEncodeBodies(b *testing.B) {
	recs := deliveries(1, 512, 100)
	b.ReportAllocs()
	b.SetBytes(int64(batchLen(recs)))
	for b.Loop() {
		if _, _, err := encodeBodies(recs, fragmentChunk); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeBatch(b *testing.B) {
	recs := deliveries(1, 512, 100)
	enc := appendBatch(nil, recs)
	dst := make([]Record, 0, len(recs))
	b.ReportAllocs()
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		var err error
		if dst, err = decodeBatch(dst[:0], enc); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecodeBatch checks that decodeBatch never panics, refuses with
// ErrBadRecord and an unchanged dst, and accepts only the one encoding of
// a list of at least two records.
func FuzzDecodeBatch(f *testing.F) {
	all := sortedCodecCases()
	zero := codecCases["zero delivery"]
	f.Add(appendBatch(nil, []Record{zero, zero}))
	f.Add(appendBatch(nil, all[:3]))
	f.Add(appendBatch(nil, []Record{codecCases["full delivery"], codecCases["cutoff marker"], codecCases["unicode strings"]}))
	f.Add(batchMsg(130, entry(zero), entry(zero))) // a two-byte count; a valid one takes 1.5 kB, slow to minimise
	f.Add(batchMsg(1, entry(zero)))
	f.Add(batchMsg(3, entry(zero), entry(zero)))
	f.Add(batchMsg(2, entry(zero), []byte{0x80, 0x00}))
	f.Add([]byte{})
	f.Add([]byte{batchVersion})
	f.Fuzz(func(t *testing.T, in []byte) {
		prefix := Record{Kind: KindCutoff, ID: 99}
		dst := make([]Record, 1, 4)
		dst[0] = prefix
		got, err := decodeBatch(dst, in)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("decodeBatch error %v does not wrap ErrBadRecord", err)
			}
			if len(got) != 1 || !cmp.Equal(got[0], prefix) {
				t.Fatalf("decodeBatch changed dst with its error: %d records", len(got))
			}
			return
		}
		if len(got) < 3 || !cmp.Equal(got[0], prefix) {
			t.Fatalf("decodeBatch accepted a batch of %d records, or lost dst's", len(got)-1)
		}
		recs := got[1:]
		if out := appendBatch(nil, recs); !bytes.Equal(out, in) {
			t.Fatalf("decode then encode is not the identity:\n in %x\nout %x", in, out)
		}
		if n := batchLen(recs); n != len(in) {
			t.Fatalf("batchLen = %d, want %d", n, len(in))
		}
	})
}
