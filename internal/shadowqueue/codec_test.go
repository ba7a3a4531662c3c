package shadowqueue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
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
	"cutoff marker":    {Kind: KindCutoff, ID: 1000, Epoch: 3, Time: time.Unix(1700000000, 5)},
	"resume marker":    {Kind: KindResume, ID: 1000, Epoch: 3, Time: time.Unix(1700000001, 0)},
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
		ConsumerTag: strings.Repeat("c", 300),
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
		"empty":           {in: nil, wantMsg: "version: truncated"},
		"version 0":       {in: []byte{0, 1, 0, 0, 0}, wantMsg: "version 0"},
		"version 2":       {in: []byte{2, 1, 0, 0, 0}, wantMsg: "version 2"},
		"kind 0":          {in: []byte{1, 0, 0, 0, 0}, wantMsg: "unknown kind 0"},
		"kind 4":          {in: []byte{1, 4, 0, 0, 0}, wantMsg: "unknown kind 4"},
		"unknown flag":    {in: []byte{1, 1, 0x04, 0, 0}, wantMsg: "unknown flags 0x4"},
		"no ID":           {in: []byte{1, 1, 0}, wantMsg: "ID: truncated varint"},
		"non-minimal ID":  {in: []byte{1, 1, 0, 0x80, 0x00}, wantMsg: "ID: non-minimal varint"},
		"overflowing ID":  {in: append([]byte{1, 1, 0}, bytes.Repeat([]byte{0xff}, 11)...), wantMsg: "ID: varint overflows"},
		"truncated time":  {in: []byte{1, 1, flagTime, 0, 0, 1, 2, 3}, wantMsg: "Time: need 8 bytes, have 3"},
		"queue too long":  {in: []byte{1, 1, 0, 0, 0, 5, 'a', 'b'}, wantMsg: "Queue: length 5 exceeds the 2 bytes left"},
		"huge body":       {in: append([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0}, 0xff, 0xff, 0xff, 0xff, 0x0f), wantMsg: "Body: length 4294967295 exceeds the 0 bytes left"},
		"missing body":    {in: valid[:len(valid)-2], wantMsg: "Body length: truncated varint"},
		"trailing byte":   {in: append(append([]byte{}, valid...), 0), wantMsg: "1 trailing bytes"},
		"non-minimal len": {in: []byte{1, 1, 0, 0, 0, 0x80, 0x00}, wantMsg: "Queue length: non-minimal varint"},
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
