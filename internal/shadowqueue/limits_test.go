package shadowqueue

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// longRoutingKey is the attack of issue 20: a record that a client with the
// stream's credentials writes into someone's log, with a routing key no
// broker can deliver. Replayed, it made the target sidecar panic in
// amqpwire.AppendShortstr.
func longRoutingKey() Record {
	return Record{Kind: KindDelivery, ID: 2, Queue: "orders", Exchange: "shop", RoutingKey: strings.Repeat("k", 300), Body: []byte("m")}
}

// TestDecodeRecordRejects300ByteRoutingKey: a record with a 300-byte
// routing key is refused wherever it comes from, a record message, a batch
// or fragments, with an error naming the field.
func TestDecodeRecordRejects300ByteRoutingKey(t *testing.T) {
	r := longRoutingKey()
	good := Record{Kind: KindDelivery, ID: 1, Queue: "orders", Body: []byte("m")}
	for name, msgs := range map[string][][]byte{
		"record":    {AppendRecord(nil, &r)},
		"batch":     {appendBatch(nil, []Record{good, r})},
		"fragments": naiveFragments(&r, 100),
	} {
		t.Run(name, func(t *testing.T) {
			var a reassembler
			var recs []Record
			var err error
			for i, m := range msgs {
				if recs, err = a.add(recs, int64(i), m); err != nil {
					break
				}
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error = %v, want a *FieldError wrapping ErrBadRecord", err)
			}
			if fe.Field != "RoutingKey" || !strings.Contains(err.Error(), "length 300 exceeds the 255 bytes of an AMQP short string") {
				t.Errorf("error = %q (field %q), want one naming RoutingKey and its length 300 against 255", err, fe.Field)
			}
			if len(recs) != 0 {
				t.Errorf("the reader handed out %d records of a message holding a bad one, want none", len(recs))
			}
		})
	}
}

// TestDecodeRecordFieldLimits: every field AMQP bounds is held to its
// bound, at the bound and one byte over, and the error names the field.
func TestDecodeRecordFieldLimits(t *testing.T) {
	digest := bytes.Repeat([]byte{1}, PublishDigestLen)
	tests := map[string]struct {
		r         Record
		wantField string // "" = valid
	}{
		"queue of 255":          {r: Record{Kind: KindDelivery, Queue: strings.Repeat("q", 255)}},
		"queue of 256":          {r: Record{Kind: KindDelivery, Queue: strings.Repeat("q", 256)}, wantField: "Queue"},
		"exchange of 255":       {r: Record{Kind: KindDelivery, Exchange: strings.Repeat("x", 255)}},
		"exchange of 256":       {r: Record{Kind: KindDelivery, Exchange: strings.Repeat("x", 256)}, wantField: "Exchange"},
		"routing key of 255":    {r: Record{Kind: KindDelivery, RoutingKey: strings.Repeat("k", 255)}},
		"routing key of 256":    {r: Record{Kind: KindDelivery, RoutingKey: strings.Repeat("k", 256)}, wantField: "RoutingKey"},
		"routing key of 300":    {r: longRoutingKey(), wantField: "RoutingKey"},
		"routing key of 1 MiB":  {r: Record{Kind: KindDelivery, RoutingKey: strings.Repeat("k", 1<<20)}, wantField: "RoutingKey"},
		"consumer tag of 256":   {r: Record{Kind: KindDelivery, ConsumerTag: strings.Repeat("c", 256)}, wantField: "ConsumerTag"},
		"properties of 1 byte":  {r: Record{Kind: KindDelivery, Properties: []byte{0x80}}, wantField: "Properties"},
		"properties of 2 bytes": {r: Record{Kind: KindDelivery, Properties: []byte{0, 0}}},
		"publish digest of 31":  {r: Record{Kind: KindPublish, For: 1, Body: digest[:31]}, wantField: "Body"},
		"publish digest of 32":  {r: Record{Kind: KindPublish, For: 1, Body: digest}},
		"publish without body":  {r: Record{Kind: KindPublish, For: 1}, wantField: "Body"},
		"delivery body of 31":   {r: Record{Kind: KindDelivery, Body: digest[:31]}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeRecord(AppendRecord(nil, &tc.r))
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("DecodeRecord: %v, want the record", err)
				}
				if diff := cmp.Diff(tc.r, got, bytesEqual); diff != "" {
					t.Errorf("round trip mismatch (-want +got):\n%s", diff)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrBadRecord) {
				t.Fatalf("DecodeRecord error = %v, want a *FieldError wrapping ErrBadRecord", err)
			}
			if fe.Field != tc.wantField {
				t.Errorf("DecodeRecord error names field %q (%v), want %q", fe.Field, err, tc.wantField)
			}
			if diff := cmp.Diff(Record{}, got); diff != "" {
				t.Errorf("DecodeRecord returned a partial record (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecodeRecordChecksLimitBeforeCopying: a short-string field that
// claims more than 255 bytes is refused on its length, whatever follows,
// without copying it.
func TestDecodeRecordChecksLimitBeforeCopying(t *testing.T) {
	r := Record{Kind: KindDelivery, RoutingKey: strings.Repeat("k", 64<<10)}
	enc := AppendRecord(nil, &r)
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := DecodeRecord(enc); err == nil {
			t.Fatal("DecodeRecord accepted a 64 KiB routing key")
		}
	})
	// The error itself allocates; the 64 KiB string must not be among it.
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	for range 16 {
		if _, err := DecodeRecord(enc); err == nil {
			t.Fatal("DecodeRecord took the oversized record")
		}
	}
	runtime.ReadMemStats(&ms1)
	if per := (ms1.TotalAlloc - ms0.TotalAlloc) / 16; per > 4<<10 {
		t.Errorf("DecodeRecord of a record with a 64 KiB routing key allocates %d bytes per call (%v allocations), want under 4 KiB: it must refuse the length before copying", per, allocs)
	}
}

// TestReassemblerAllocatesWhatArrives: a fragment that claims a 256 MiB
// record costs what it carries, not what it claims. On 58fa1c0 the
// reassembler allocated the claimed Total at fragment 0.
func TestReassemblerAllocatesWhatArrives(t *testing.T) {
	for name, h := range map[string]fragmentHeader{
		"one-byte chunks":    {ID: 1, Count: maxAssembledLen, Total: maxAssembledLen},
		"1000-byte chunks":   {ID: 1, Count: maxAssembledLen/1000 + 1, Total: maxAssembledLen},
		"a claim of 100 MiB": {ID: 1, Count: 100 << 10, Total: 100 << 20},
	} {
		t.Run(name, func(t *testing.T) {
			chunk := int((h.Total + h.Count - 1) / h.Count)
			first := fragment(h, bytes.Repeat([]byte{1}, chunk))
			var ms0, ms1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms0)
			var a reassembler
			// Fragment 0 and 1: a few bytes each, the rest never comes.
			if _, err := a.add(nil, 0, first); err != nil {
				t.Fatalf("fragment 0: %v", err)
			}
			h.Index = 1
			if _, err := a.add(nil, 1, fragment(h, bytes.Repeat([]byte{1}, chunk))); err != nil {
				t.Fatalf("fragment 1: %v", err)
			}
			runtime.ReadMemStats(&ms1)
			if got := ms1.TotalAlloc - ms0.TotalAlloc; got > 1<<20 {
				t.Errorf("two fragments of %d bytes claiming a %d MiB record made the reader allocate %d bytes, want under 1 MiB",
					chunk, h.Total>>20, got)
			}
			if c, l := cap(a.buf), len(a.buf); c > 2*l {
				t.Errorf("reassembly buffer holds %d bytes in a capacity of %d, want at most twice what arrived", l, c)
			}
		})
	}
}

// FuzzDecodeRecordSplit cuts an arbitrary input into fragments of chunk
// bytes, as a writer of big records does, and checks that the reassembler
// agrees with DecodeRecord on the whole: the same record, or an error for
// both. Whatever it accepts keeps AMQP's limits; its buffer never exceeds
// twice the bytes that arrived.
func FuzzDecodeRecordSplit(f *testing.F) {
	for _, r := range codecCases {
		if enc := AppendRecord(nil, &r); len(enc) < 4096 {
			f.Add(enc, uint16(7))
		}
	}
	bad := longRoutingKey()
	f.Add(AppendRecord(nil, &bad), uint16(50))
	f.Add(AppendRecord(nil, &Record{Kind: KindDelivery, Properties: []byte{1}}), uint16(1))
	f.Add(AppendRecord(nil, &Record{Kind: KindPublish, For: 3, Body: []byte{1}}), uint16(2))
	f.Fuzz(func(t *testing.T, in []byte, chunk uint16) {
		want, wantErr := DecodeRecord(in)
		if wantErr == nil {
			for field, s := range map[string]string{"Queue": want.Queue, "Exchange": want.Exchange, "RoutingKey": want.RoutingKey, "ConsumerTag": want.ConsumerTag} {
				if len(s) > maxShortstr {
					t.Fatalf("DecodeRecord accepted a %s of %d bytes", field, len(s))
				}
			}
			if n := len(want.Properties); n == 1 {
				t.Fatalf("DecodeRecord accepted a property list of 1 byte")
			}
			if want.Kind == KindPublish && len(want.Body) != PublishDigestLen {
				t.Fatalf("DecodeRecord accepted a publish digest of %d bytes", len(want.Body))
			}
		} else if !errors.Is(wantErr, ErrBadRecord) {
			t.Fatalf("DecodeRecord error %v does not wrap ErrBadRecord", wantErr)
		}
		c := int(chunk)%max(len(in), 1) + 1
		if len(in) < 2 || c >= len(in) {
			return // one fragment is no fragment set
		}
		var id uint64
		if wantErr == nil {
			id = want.ID
		}
		h := fragmentHeader{ID: id, Count: uint64(fragmentCount(len(in), c)), Total: uint64(len(in))}
		var a reassembler
		var got []Record
		var err error
		for h.Index = 0; h.Index < h.Count; h.Index++ {
			lo := int(h.Index) * c
			got, err = a.add(got, int64(h.Index), fragment(h, in[lo:min(lo+c, len(in))]))
			if err != nil {
				break
			}
			if l, cp := len(a.buf), cap(a.buf); cp > 2*l || uint64(cp) > h.Total {
				t.Fatalf("after fragment %d of %d: buffer of capacity %d for %d bytes received (record of %d)", h.Index, h.Count, cp, l, h.Total)
			}
		}
		switch {
		case wantErr != nil && err == nil:
			t.Fatalf("DecodeRecord refused the input (%v), the reassembler took its fragments", wantErr)
		case wantErr == nil && err != nil:
			t.Fatalf("DecodeRecord took the input, the reassembler refused its fragments: %v", err)
		case wantErr == nil && (len(got) != 1 || !cmp.Equal(want, got[0], bytesEqual)):
			t.Fatalf("reassembled %d records %+v, want %+v", len(got), got, want)
		}
	})
}
