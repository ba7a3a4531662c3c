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
	"time"

	"github.com/google/go-cmp/cmp"
)

// codecCases are records that must survive AppendRecord + DecodeRecord.
var codecCases = map[string]Record{
	"zero delivery": {Kind: KindDelivery},
	"full delivery": {
		Kind:        KindDelivery,
		ID:          42,
		Time:        time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.UTC),
		Queue:       "orders",
		Exchange:    "amq.direct",
		RoutingKey:  "orders.eu",
		ConsumerTag: "ctag-1.0",
		Redelivered: true,
		Properties:  []byte{0x90, 0x00, 0x0a, 't', 'e', 'x', 't', '/', 'p', 'l', 'a', 'i', 'n', 0x02},
		Body:        []byte("hello, world"),
	},
	"basic.get delivery without consumer tag": {
		Kind:       KindDelivery,
		ID:         7,
		Time:       time.Unix(1, 0),
		Queue:      "q",
		RoutingKey: "q",
		Properties: []byte{0, 0},
		Body:       []byte{0},
	},
	"redelivery repeating an earlier delivery": {
		Kind: KindDelivery, ID: 300, Epoch: 1, Time: time.Unix(1700000003, 0), Repeats: 129,
		Queue: "q", RoutingKey: "q", Redelivered: true, Properties: []byte{0, 0}, Body: []byte("again"),
	},
	"cutoff marker": {Kind: KindCutoff, ID: 1000, Epoch: 3, Time: time.Unix(1700000000, 5)},
	"resume marker": {Kind: KindResume, ID: 1000, Epoch: 3, Time: time.Unix(1700000001, 0)},
	"publish": {
		Kind: KindPublish, ID: 41, Epoch: 2, Time: time.Unix(1700000002, 0), For: 40,
		Exchange: "results", RoutingKey: "orders.done", Body: bytes.Repeat([]byte{0x5a}, PublishDigestLen),
	},
	"max IDs":          {Kind: KindCutoff, ID: math.MaxUint64, Epoch: math.MaxUint64, Time: time.Unix(0, math.MaxInt64)},
	"time before 1970": {Kind: KindDelivery, ID: 1, Time: time.Unix(0, math.MinInt64)},
	"unicode strings": {
		Kind:        KindDelivery,
		ID:          128, // first two-byte varint
		Queue:       "очередь",
		Exchange:    "交换",
		RoutingKey:  "ключ.🔑",
		ConsumerTag: "\x00\xff",
	},
	"large body": {
		Kind:        KindDelivery,
		ID:          1 << 40,
		Queue:       strings.Repeat("q", 255),
		ConsumerTag: strings.Repeat("c", 255), // the longest AMQP short string
		Body:        bytes.Repeat([]byte{0xab}, 70000),
	},
}

func TestRecordRoundTrip(t *testing.T) {
	for name, want := range codecCases {
		t.Run(name, func(t *testing.T) {
			enc := AppendRecord(nil, &want)
			if got := encodedRecordLen(&want); got != len(enc) {
				t.Errorf("encodedRecordLen = %d, want len(AppendRecord) = %d", got, len(enc))
			}
			got, err := DecodeRecord(enc)
			if err != nil {
				t.Fatalf("DecodeRecord: %v", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("round trip mismatch (-want +got):\n%s", diff)
			}
			if again := AppendRecord(nil, &got); !bytes.Equal(again, enc) {
				t.Errorf("re-encoding differs:\n got %x\nwant %x", again, enc)
			}
		})
	}
}

func TestAppendRecordAppends(t *testing.T) {
	r := codecCases["full delivery"]
	prefix := []byte("prefix")
	got := AppendRecord(prefix, &r)
	if !bytes.HasPrefix(got, prefix) {
		t.Fatalf("AppendRecord lost the prefix: %q", got[:len(prefix)])
	}
	if diff := cmp.Diff(AppendRecord(nil, &r), got[len(prefix):]); diff != "" {
		t.Errorf("appended encoding differs (-want +got):\n%s", diff)
	}
}

func TestDecodeRecordErrors(t *testing.T) {
	valid := AppendRecord(nil, &Record{Kind: KindDelivery, ID: 5, Queue: "q", Body: []byte("b")})
	tests := map[string]struct {
		in      []byte
		wantMsg string
	}{
		"empty":                {in: nil, wantMsg: "version: truncated"},
		"version 0":            {in: []byte{0, 1, 0, 0, 0}, wantMsg: "version 0"},
		"version 2":            {in: []byte{2, 1, 0, 0, 0}, wantMsg: "version 2"},
		"kind 0":               {in: []byte{1, 0, 0, 0, 0}, wantMsg: "unknown kind 0"},
		"kind 5":               {in: []byte{1, 5, 0, 0, 0}, wantMsg: "unknown kind 5"},
		"unknown flag":         {in: []byte{1, 1, 0x10, 0, 0}, wantMsg: "unknown flags 0x10"},
		"zero Repeats":         {in: []byte{1, 1, flagRepeats, 5, 0, 0, 0, 0, 0, 0, 0}, wantMsg: "Repeats: zero is never encoded"},
		"Repeats not below ID": {in: []byte{1, 1, flagRepeats, 5, 0, 5, 0, 0, 0, 0, 0, 0}, wantMsg: "Repeats: 5 is not below the record's ID 5"},
		"Repeats on a marker":  {in: []byte{1, 2, flagRepeats, 5, 0, 4, 0, 0, 0, 0, 0, 0}, wantMsg: "Repeats: only a delivery repeats one"},
		"zero For":             {in: []byte{1, 4, flagFor, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, wantMsg: "For: zero is never encoded"},
		"truncated For":        {in: []byte{1, 4, flagFor, 0, 0}, wantMsg: "For: truncated varint"},
		"no ID":                {in: []byte{1, 1, 0}, wantMsg: "ID: truncated varint"},
		"non-minimal ID":       {in: []byte{1, 1, 0, 0x80, 0x00}, wantMsg: "ID: non-minimal varint"},
		"overflowing ID":       {in: append([]byte{1, 1, 0}, bytes.Repeat([]byte{0xff}, 11)...), wantMsg: "ID: varint overflows"},
		"truncated time":       {in: []byte{1, 1, flagTime, 0, 0, 1, 2, 3}, wantMsg: "Time: need 8 bytes, have 3"},
		"queue too long":       {in: []byte{1, 1, 0, 0, 0, 5, 'a', 'b'}, wantMsg: "Queue: length 5 exceeds the 2 bytes left"},
		"huge body":            {in: append([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0}, 0xff, 0xff, 0xff, 0xff, 0x0f), wantMsg: "Body: length 4294967295 exceeds the 0 bytes left"},
		"missing body":         {in: valid[:len(valid)-2], wantMsg: "Body length: truncated varint"},
		"trailing byte":        {in: append(append([]byte{}, valid...), 0), wantMsg: "1 trailing bytes"},
		"non-minimal len":      {in: []byte{1, 1, 0, 0, 0, 0x80, 0x00}, wantMsg: "Queue length: non-minimal varint"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeRecord(tc.in)
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("DecodeRecord error = %v, want one wrapping ErrBadRecord", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("DecodeRecord error = %q, want it to mention %q", err, tc.wantMsg)
			}
			if diff := cmp.Diff(Record{}, got); diff != "" {
				t.Errorf("DecodeRecord returned a partial record (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeRecordEveryTruncation(t *testing.T) {
	for name, r := range codecCases {
		enc := AppendRecord(nil, &r)
		for i := range len(enc) {
			if _, err := DecodeRecord(enc[:i]); !errors.Is(err, ErrBadRecord) {
				t.Fatalf("%s: DecodeRecord of the first %d of %d bytes: err = %v, want ErrBadRecord", name, i, len(enc), err)
			}
		}
	}
}

func TestDecodeRecordAliasesBody(t *testing.T) {
	r := Record{Kind: KindDelivery, ID: 1, Properties: []byte{1, 2}, Body: []byte("body")}
	enc := AppendRecord(nil, &r)
	enc = append(enc, "spare capacity"...)[:len(enc)]
	got, err := DecodeRecord(enc)
	if err != nil {
		t.Fatal(err)
	}
	if &got.Body[0] != &enc[len(enc)-len(r.Body)] {
		t.Errorf("Body does not alias the input")
	}
	if cap(got.Body) != len(got.Body) || cap(got.Properties) != len(got.Properties) {
		t.Errorf("aliased slices must have their capacity capped: cap(Body)=%d cap(Properties)=%d", cap(got.Body), cap(got.Properties))
	}
	_ = append(got.Properties, 0xee) // must not write into enc
	if got.Body[0] != 'b' {
		t.Errorf("appending to Properties overwrote Body")
	}
}

func TestAppendRecordAllocs(t *testing.T) {
	r := codecCases["full delivery"]
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() {
		buf = AppendRecord(buf[:0], &r)
	})
	if allocs != 0 {
		t.Errorf("AppendRecord into a large enough buffer allocates %v times, want 0", allocs)
	}
}

func TestDecodeRecordAllocs(t *testing.T) {
	r := codecCases["full delivery"]
	enc := AppendRecord(nil, &r)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := DecodeRecord(enc); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 4 {
		t.Errorf("DecodeRecord allocates %v times, want at most 4 (one per string field)", allocs)
	}
}

func BenchmarkAppendRecord(b *testing.B) {
	r := codecCases["full delivery"]
	r.Body = make([]byte, 1024)
	buf := make([]byte, 0, 2048)
	b.ReportAllocs()
	b.SetBytes(int64(encodedRecordLen(&r)))
	for b.Loop() {
		buf = AppendRecord(buf[:0], &r)
	}
}

func BenchmarkDecodeRecord(b *testing.B) {
	r := codecCases["full delivery"]
	r.Body = make([]byte, 1024)
	enc := AppendRecord(nil, &r)
	b.ReportAllocs()
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		if _, err := DecodeRecord(enc); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for _, r := range codecCases {
		f.Add(AppendRecord(nil, &r))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 1, 0, 0x80, 0x00})
	f.Add(binary.AppendUvarint([]byte{1, 2, flagTime}, math.MaxUint64))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := DecodeRecord(in)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("DecodeRecord error %v does not wrap ErrBadRecord", err)
			}
			return
		}
		if out := AppendRecord(nil, &r); !bytes.Equal(out, in) {
			t.Fatalf("decode then encode is not the identity:\n in %x\nout %x", in, out)
		}
		if n := encodedRecordLen(&r); n != len(in) {
			t.Fatalf("encodedRecordLen = %d, want %d", n, len(in))
		}
	})
}

// fragment returns a fragment message: h's header, then payload.
func fragment(h fragmentHeader, payload []byte) []byte {
	return append(h.encode(nil), payload...)
}

// naiveFragments cuts the encoding of r into fragments of chunk bytes the
// obvious way, to check appendFragments against.
func naiveFragments(r *Record, chunk int) [][]byte {
	enc := AppendRecord(nil, r)
	h := fragmentHeader{ID: r.ID, Count: uint64(fragmentCount(len(enc), chunk)), Total: uint64(len(enc))}
	var out [][]byte
	for h.Index = 0; h.Index < h.Count; h.Index++ {
		lo := int(h.Index) * chunk
		out = append(out, fragment(h, enc[lo:min(lo+chunk, len(enc))]))
	}
	return out
}

func TestFragmentHeaderRoundTrip(t *testing.T) {
	tests := map[string]fragmentHeader{
		"first of two":  {ID: 1, Index: 0, Count: 2, Total: 2},
		"last of many":  {ID: 1 << 40, Index: 299, Count: 300, Total: 250 << 20},
		"largest":       {ID: math.MaxUint64, Index: maxAssembledLen - 1, Count: maxAssembledLen, Total: maxAssembledLen},
		"two-byte vars": {ID: 128, Index: 128, Count: 129, Total: 1 << 14},
	}
	for name, h := range tests {
		t.Run(name, func(t *testing.T) {
			payload := []byte("payload")
			if h.Total < uint64(len(payload)) {
				payload = payload[:h.Total]
			}
			msg := fragment(h, payload)
			if got := h.encodedLen(); got != len(msg)-len(payload) {
				t.Errorf("encodedLen = %d, want %d", got, len(msg)-len(payload))
			}
			if h.encodedLen() > maxFragmentHeaderLen {
				t.Errorf("encodedLen = %d, over maxFragmentHeaderLen %d", h.encodedLen(), maxFragmentHeaderLen)
			}
			var got fragmentHeader
			gotPayload, err := got.decode(msg)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if diff := cmp.Diff(h, got); diff != "" {
				t.Errorf("header mismatch (-want +got):\n%s", diff)
			}
			if !bytes.Equal(gotPayload, payload) {
				t.Errorf("payload = %q, want %q", gotPayload, payload)
			}
		})
	}
}

func TestFragmentHeaderDecodeErrors(t *testing.T) {
	tests := map[string]struct {
		in          []byte
		wantMsg     string
		wantTooLong bool
	}{
		"empty":             {in: nil, wantMsg: "version: truncated"},
		"record version":    {in: []byte{1, 1, 0, 2, 2, 'x'}, wantMsg: "fragment version 1, want 2"},
		"no ID":             {in: []byte{2}, wantMsg: "fragment ID: truncated varint"},
		"no total":          {in: []byte{2, 1, 0, 2}, wantMsg: "fragment total: truncated varint"},
		"non-minimal index": {in: []byte{2, 1, 0x80, 0x00, 2, 2, 'x'}, wantMsg: "fragment index: non-minimal varint"},
		"overflowing count": {in: append([]byte{2, 1, 0}, bytes.Repeat([]byte{0xff}, 11)...), wantMsg: "fragment count: varint overflows"},
		"count 0":           {in: []byte{2, 1, 0, 0, 2, 'x'}, wantMsg: "count 0 for 2 bytes, want 2 to 2"},
		"count 1":           {in: []byte{2, 1, 0, 1, 2, 'x'}, wantMsg: "count 1 for 2 bytes"},
		"count over total":  {in: []byte{2, 1, 0, 3, 2, 'x'}, wantMsg: "count 3 for 2 bytes"},
		"index = count":     {in: []byte{2, 1, 2, 2, 2, 'x'}, wantMsg: "index 2 of 2"},
		"no payload":        {in: []byte{2, 1, 0, 2, 2}, wantMsg: "0 payload bytes, want 1 to 2"},
		"payload over total": {
			in: []byte{2, 1, 0, 2, 2, 'x', 'y', 'z'}, wantMsg: "3 payload bytes, want 1 to 2",
		},
		"total over the cap": {
			in:      fragment(fragmentHeader{ID: 9, Count: 2, Total: maxAssembledLen + 1}, []byte("x")),
			wantMsg: "record ID 9: the record would be 268435457 bytes, over the 256 MiB cap", wantTooLong: true,
		},
		"total overflows": {
			in:      fragment(fragmentHeader{ID: 9, Count: 2, Total: math.MaxUint64}, []byte("x")),
			wantMsg: "over the 256 MiB cap", wantTooLong: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := fragmentHeader{ID: 77, Index: 1, Count: 2, Total: 2} // decode must clear it
			payload, err := h.decode(tc.in)
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("decode error = %v, want one wrapping ErrBadRecord", err)
			}
			if got := errors.Is(err, ErrRecordTooLarge); got != tc.wantTooLong {
				t.Errorf("errors.Is(%v, ErrRecordTooLarge) = %v, want %v", err, got, tc.wantTooLong)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("decode error = %q, want it to mention %q", err, tc.wantMsg)
			}
			if payload != nil || h != (fragmentHeader{}) {
				t.Errorf("decode returned payload %q and header %+v with its error, want nil and zero", payload, h)
			}
		})
	}
}

func TestAppendFragments(t *testing.T) {
	for name, r := range codecCases {
		n := encodedRecordLen(&r)
		for _, chunk := range []int{1, 2, 7, 4096, n / 2, n - 1} {
			if chunk < 1 || fragmentCount(n, chunk) < 2 || fragmentCount(n, chunk) > 1000 {
				continue
			}
			prefix := []byte("prefix")
			dst := append(make([]byte, 0, 8), prefix...) // too small: appendFragments grows it
			before := [][]byte{prefix}
			dst, bodies := appendFragments(dst, before, &r, chunk)
			if !bytes.HasPrefix(dst, prefix) || !bytes.Equal(bodies[0], prefix) {
				t.Fatalf("%s, chunk %d: appendFragments lost what dst and bodies held", name, chunk)
			}
			bodies = bodies[1:]
			if diff := cmp.Diff(naiveFragments(&r, chunk), bodies, bytesEqual); diff != "" {
				t.Fatalf("%s, chunk %d: fragments mismatch (-want +got):\n%s", name, chunk, diff)
			}
			if got, want := len(dst)-len(prefix), fragmentsLen(r.ID, n, chunk); got != want {
				t.Errorf("%s, chunk %d: appended %d bytes, fragmentsLen says %d", name, chunk, got, want)
			}
			for i, b := range bodies {
				if cap(b) != len(b) {
					t.Fatalf("%s, chunk %d: fragment %d has spare capacity %d", name, chunk, i, cap(b)-len(b))
				}
			}
		}
	}
}

// TestAppendFragmentsInPlace checks that appendFragments into a buffer with
// room enough allocates nothing: it does not encode the record on the side.
func TestAppendFragmentsInPlace(t *testing.T) {
	r := codecCases["large body"]
	const chunk = 4096
	buf := make([]byte, 0, fragmentsLen(r.ID, encodedRecordLen(&r), chunk))
	bodies := make([][]byte, 0, fragmentCount(encodedRecordLen(&r), chunk))
	allocs := testing.AllocsPerRun(20, func() {
		buf, bodies = appendFragments(buf[:0], bodies[:0], &r, chunk)
	})
	if allocs != 0 {
		t.Errorf("appendFragments into large enough buffers allocates %v times, want 0", allocs)
	}
}

// msg is one stream message for a reassembler test.
type msg struct {
	offset int64
	body   []byte
}

// feed passes msgs to a new reassembler and returns the records it hands
// out, with the offsets at which it did, and the first error.
func feed(msgs []msg) (recs []Record, at []int64, err error) {
	var a reassembler
	for _, m := range msgs {
		n := len(recs)
		recs, err = a.add(recs, m.offset, m.body)
		if err != nil {
			if len(recs) != n {
				return recs, at, fmt.Errorf("add returned %d records with its error %w", len(recs)-n, err)
			}
			return recs, at, err
		}
		for range len(recs) - n {
			at = append(at, m.offset)
		}
	}
	return recs, at, nil
}

func TestReassembler(t *testing.T) {
	small := func(id uint64) Record {
		return Record{Kind: KindDelivery, ID: id, Queue: "q", Body: []byte(fmt.Sprintf("small %d", id))}
	}
	big := func(id uint64) Record {
		r := codecCases["large body"]
		r.ID = id
		return r
	}
	const chunk = 20000 // "large body" makes 4 fragments
	frags := func(r Record) [][]byte { return naiveFragments(&r, chunk) }
	whole := func(r Record) [][]byte { return [][]byte{AppendRecord(nil, &r)} }
	batch := func(recs ...Record) [][]byte { return [][]byte{appendBatch(nil, recs)} }
	marker := [][]byte{{markerVersion, 'm', 'k'}}
	// numbered numbers the messages of parts from offset 0.
	numbered := func(parts ...[][]byte) []msg {
		var out []msg
		for _, p := range parts {
			for _, b := range p {
				out = append(out, msg{offset: int64(len(out)), body: b})
			}
		}
		return out
	}
	b1, b2 := big(1<<40), big(1<<40+1)
	if n := len(frags(b1)); n != 4 {
		t.Fatalf("test setup: %d fragments, want 4", n)
	}

	tests := map[string]struct {
		msgs    []msg
		want    []Record
		wantAt  []int64
		wantErr string
	}{
		"whole records and markers": {
			msgs: numbered(whole(small(1)), marker, whole(small(2))),
			want: []Record{small(1), small(2)}, wantAt: []int64{0, 2},
		},
		"fragments between small records": {
			msgs: numbered(whole(small(1)), frags(b1), whole(small(3))),
			want: []Record{small(1), b1, small(3)}, wantAt: []int64{0, 4, 5},
		},
		"markers between fragments": {
			msgs: numbered(frags(b1)[:2], marker, frags(b1)[2:3], marker, marker, frags(b1)[3:]),
			want: []Record{b1}, wantAt: []int64{6},
		},
		"retry of a cut-short record": {
			msgs: numbered(frags(b1)[:3], frags(b1)),
			want: []Record{b1}, wantAt: []int64{6},
		},
		"retry that starts with an earlier record": {
			msgs: numbered(whole(small(1)), frags(b1)[:2], whole(small(1)), frags(b1)),
			want: []Record{small(1), small(1), b1}, wantAt: []int64{0, 3, 7},
		},
		"cut-short set then another record's fragments": {
			msgs: numbered(frags(b1)[:1], frags(b2)),
			want: []Record{b2}, wantAt: []int64{4},
		},
		"cut-short set at the end": {
			msgs: numbered(whole(small(1)), frags(b1)[:3]),
			want: []Record{small(1)}, wantAt: []int64{0},
		},
		"read that starts mid-set": {
			msgs: numbered(frags(b1)[2:], whole(small(2)), frags(b2)),
			want: []Record{small(2), b2}, wantAt: []int64{2, 6},
		},
		"gap in a set": {
			msgs:    numbered(frags(b1)[:2], frags(b1)[3:]),
			wantErr: "fragment 3 of 4 of record ID 1099511627776 (70530 bytes) does not continue the set that began at offset 0, which expects fragment 2 of 4",
		},
		"another record's fragment inside a set": {
			msgs:    numbered(frags(b1)[:2], frags(b2)[2:]),
			wantErr: "fragment 2 of 4 of record ID 1099511627777 (70530 bytes) does not continue",
		},
		"short middle fragment": {
			msgs:    numbered(frags(b1)[:1], [][]byte{frags(b1)[1][:100]}),
			wantErr: "fragment 1 of 4 of record ID 1099511627776 carries",
		},
		"long last fragment": {
			msgs:    numbered(frags(b1)[:3], [][]byte{append(bytes.Clone(frags(b1)[3]), 0)}),
			wantErr: "fragment 3 of 4 of record ID 1099511627776 carries 10531 bytes, want 10530",
		},
		"count that does not suit the chunk": {
			msgs:    numbered([][]byte{fragment(fragmentHeader{ID: 5, Count: 3, Total: 100}, make([]byte, 60))}),
			wantErr: "fragment 0 of record ID 5 carries 60 bytes, which makes 100 bytes 2 fragments, not 3",
		},
		"fragments of garbage": {
			msgs: numbered([][]byte{
				fragment(fragmentHeader{ID: 5, Index: 0, Count: 2, Total: 4}, []byte{1, 1}),
				fragment(fragmentHeader{ID: 5, Index: 1, Count: 2, Total: 4}, []byte{0, 9}),
			}),
			wantErr: "record ID 5 reassembled from offsets 0 to 1: shadowqueue: malformed record: field Epoch: truncated varint",
		},
		"fragments of another ID's record": {
			msgs: numbered(func() [][]byte {
				f := frags(b1)
				for i := range f { // relabel b1's fragments as ID 7's
					var h fragmentHeader
					p, _ := h.decode(f[i])
					h.ID = 7
					f[i] = fragment(h, p)
				}
				return f
			}()),
			wantErr: "record reassembled from offsets 0 to 3 has ID 1099511627776, but its fragments say 7",
		},
		"bad whole record": {
			msgs:    numbered([][]byte{{1, 9}}),
			wantErr: "unknown kind 9",
		},
		"unknown version": {
			msgs:    numbered([][]byte{{4, 1, 0}}),
			wantErr: "unknown message version 4: want 1 (record), 2 (fragment), 3 (batch) or 0 (marker)",
		},
		"empty message": {
			msgs:    numbered([][]byte{{}}),
			wantErr: "empty message",
		},
		"batches, records and markers": {
			msgs: numbered(batch(small(1), small(2), small(3)), marker, whole(small(4)), batch(small(5), small(6))),
			want: []Record{small(1), small(2), small(3), small(4), small(5), small(6)}, wantAt: []int64{0, 0, 0, 2, 3, 3},
		},
		"batches around fragments": {
			msgs: numbered(batch(small(1), small(2)), frags(b1), batch(small(4), small(5))),
			want: []Record{small(1), small(2), b1, small(4), small(5)}, wantAt: []int64{0, 0, 4, 5, 5},
		},
		"retry that starts with a batch": {
			msgs: numbered(batch(small(1), small(2)), frags(b1)[:2], batch(small(1), small(2)), frags(b1)),
			want: []Record{small(1), small(2), small(1), small(2), b1}, wantAt: []int64{0, 0, 3, 3, 7},
		},
		"batch after a cut-short set": {
			msgs: numbered(frags(b1)[:2], batch(small(3), small(4)), frags(b1)[2:]),
			want: []Record{small(3), small(4)}, wantAt: []int64{2, 2},
		},
		"bad record in a batch": {
			msgs: numbered(batch(small(1), small(2)), [][]byte{func() []byte {
				b := appendBatch(nil, []Record{small(3), small(4)})
				b[4] = 9 // version, count, length, record version, kind
				return b
			}()}),
			wantErr: "record 0 of 2 in the batch: shadowqueue: malformed record: unknown kind 9",
		},
		"batch of one": {
			msgs:    numbered(batch(small(1))),
			wantErr: "batch of 1 records",
		},
		"over the cap": {
			msgs:    numbered(frags(b1)[:2], [][]byte{fragment(fragmentHeader{ID: 5, Count: 2, Total: maxAssembledLen + 1}, []byte("x"))}),
			wantErr: "over the 256 MiB cap",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, at, err := feed(tc.msgs)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one wrapping ErrBadRecord that mentions %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, bytesEqual); diff != "" {
				t.Errorf("records mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAt, at); diff != "" {
				t.Errorf("offsets of the records mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReassemblerRecordOwnsItsBytes checks that a reassembled record does
// not alias the fragment messages, which the caller may reuse.
func TestReassemblerRecordOwnsItsBytes(t *testing.T) {
	r := codecCases["large body"]
	var a reassembler
	var got []Record
	for i, f := range naiveFragments(&r, 30000) {
		var err error
		got, err = a.add(got, int64(i), f)
		if err != nil {
			t.Fatal(err)
		}
		clear(f)
	}
	if len(got) != 1 {
		t.Fatalf("the fragments made %d records, want 1", len(got))
	}
	if diff := cmp.Diff(r, got[0], bytesEqual); diff != "" {
		t.Errorf("record mismatch after its fragments were overwritten (-want +got):\n%s", diff)
	}
}

func FuzzFragmentHeader(f *testing.F) {
	f.Add(fragment(fragmentHeader{ID: 1, Index: 0, Count: 2, Total: 2}, []byte{1}))
	f.Add(fragment(fragmentHeader{ID: math.MaxUint64, Index: 5, Count: 6, Total: 6 << 20}, bytes.Repeat([]byte{7}, 100)))
	f.Add(fragment(fragmentHeader{ID: 9, Count: 2, Total: maxAssembledLen + 1}, []byte("x")))
	f.Add([]byte{2, 1, 0x80, 0x00, 2, 2, 'x'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		var h fragmentHeader
		payload, err := h.decode(in)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("decode error %v does not wrap ErrBadRecord", err)
			}
			if h != (fragmentHeader{}) || payload != nil {
				t.Fatalf("decode returned %+v and %d payload bytes with its error", h, len(payload))
			}
			return
		}
		if h.Count < 2 || h.Index >= h.Count || h.Count > h.Total || h.Total > maxAssembledLen {
			t.Fatalf("decode accepted an impossible header %+v", h)
		}
		if len(payload) == 0 || uint64(len(payload)) > h.Total {
			t.Fatalf("decode accepted %d payload bytes for %+v", len(payload), h)
		}
		if h.encodedLen() > maxFragmentHeaderLen {
			t.Fatalf("header %+v is %d bytes, over maxFragmentHeaderLen", h, h.encodedLen())
		}
		if out := fragment(h, payload); !bytes.Equal(out, in) {
			t.Fatalf("decode then encode is not the identity:\n in %x\nout %x", in, out)
		}
	})
}

// FuzzReassembler feeds arbitrary messages to a reassembler: it must not
// panic, and must hand out only records that DecodeRecord would accept. The
// input is cut into messages at the points that cuts lists, each a byte
// giving the length of the next message. The seeds fragment records at
// several chunk sizes and batch records.
func FuzzReassembler(f *testing.F) {
	for _, name := range []string{"full delivery", "unicode strings", "zero delivery"} {
		r := codecCases[name]
		for _, chunk := range []int{1, 5, 40} {
			if fragmentCount(encodedRecordLen(&r), chunk) < 2 {
				continue
			}
			var in, cuts []byte
			frags := naiveFragments(&r, chunk)
			for _, b := range append(frags[:len(frags)-1:len(frags)-1], append([][]byte{{0, 'm'}}, frags...)...) {
				if len(b) > 255 {
					break
				}
				in = append(in, b...)
				cuts = append(cuts, byte(len(b)))
			}
			f.Add(in, cuts)
		}
	}
	// A batch, a fragmented record cut short by another batch, and the
	// record again.
	zero, full := codecCases["zero delivery"], codecCases["full delivery"]
	var in, cuts []byte
	frags := naiveFragments(&full, 40)
	for _, b := range append([][]byte{appendBatch(nil, []Record{zero, zero, full}), frags[0], appendBatch(nil, []Record{full, zero})}, frags...) {
		in = append(in, b...)
		cuts = append(cuts, byte(len(b)))
	}
	f.Add(in, cuts)
	// A fragment that claims a 256 MiB record, and a batch with a record
	// whose routing key is over 255 bytes.
	in = fragment(fragmentHeader{ID: 1, Count: maxAssembledLen, Total: maxAssembledLen}, []byte{1})
	f.Add(in, []byte{byte(len(in))})
	bad := Record{Kind: KindDelivery, ID: 2, RoutingKey: strings.Repeat("k", 256)}
	in = appendBatch(nil, []Record{zero, bad})
	f.Add(in, []byte{byte(len(in))})
	f.Fuzz(func(t *testing.T, in, cuts []byte) {
		var msgs []msg
		for _, c := range cuts {
			n := min(int(c), len(in))
			// A fragment's Total is only a claim: the reassembler
			// allocates what arrives, so claims of any size stay cheap.
			msgs = append(msgs, msg{offset: int64(len(msgs)), body: in[:n:n]})
			in = in[n:]
		}
		recs, _, err := feed(msgs)
		if err != nil && !errors.Is(err, ErrBadRecord) {
			t.Fatalf("error %v does not wrap ErrBadRecord", err)
		}
		for _, r := range recs {
			enc := AppendRecord(nil, &r)
			if again, err := DecodeRecord(enc); err != nil || !cmp.Equal(r, again, bytesEqual) {
				t.Fatalf("handed out a record that does not round-trip: %+v (%v)", r, err)
			}
		}
	})
}

// TestCutoffQueues: a cutoff marker's queues go through the codec, and
// DecodeRecord refuses a marker whose list is not CutoffBody's.
func TestCutoffQueues(t *testing.T) {
	r := Record{Kind: KindCutoff, ID: 7, Epoch: 2, Body: CutoffBody([]string{"b", "a", "b", ""})}
	got, err := DecodeRecord(AppendRecord(nil, &r))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := got.CutoffQueues()
	if err != nil || !slices.Equal(qs, []string{"", "a", "b"}) {
		t.Fatalf("queues %q (%v), want \"\", a, b", qs, err)
	}
	for name, body := range map[string][]byte{
		"not ascending": appendString(appendString(nil, "b"), "a"),
		"twice":         appendString(appendString(nil, "a"), "a"),
		"truncated":     {5, 'a'},
		"too long":      appendString(nil, strings.Repeat("q", MaxCutoffQueueLen+1)),
	} {
		bad := Record{Kind: KindCutoff, ID: 7, Epoch: 2, Body: body}
		if _, err := DecodeRecord(AppendRecord(nil, &bad)); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: DecodeRecord = %v, want ErrBadRecord", name, err)
		}
	}
	// A resume marker's body is not a list: unchanged.
	if _, err := DecodeRecord(AppendRecord(nil, &Record{Kind: KindResume, ID: 7, Epoch: 2})); err != nil {
		t.Fatal(err)
	}
}
