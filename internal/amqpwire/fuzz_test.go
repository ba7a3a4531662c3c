package amqpwire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// fuzzMaxFrame is small so that the fuzzer reaches both accepted and
// rejected frame sizes.
const fuzzMaxFrame = FrameMinSize

type parseResult struct {
	Frames   []gotFrame
	Err      string
	Buffered int
}

// parseAll feeds chunks to a fresh Parser, stopping at the first error.
func parseAll(maxFrame uint32, chunks [][]byte) parseResult {
	p := NewParser(maxFrame)
	var r parseResult
	for _, c := range chunks {
		if err := p.Parse(c, collect(&r.Frames)); err != nil {
			r.Err = err.Error()
			break
		}
	}
	r.Buffered = p.Buffered()
	return r
}

// FuzzParser checks that splitting the input at fuzz-chosen points gives
// the same frames and the same error as parsing it in one call. Each byte of
// cuts is the length of the next chunk; the rest of data is the last chunk.
func FuzzParser(f *testing.F) {
	// Seeds are small: the fuzzer minimizes every new interesting input,
	// which takes long for inputs of kilobytes.
	stream := cat(
		AppendMethodFrame(nil, 1, &BasicDeliver{ConsumerTag: "c", DeliveryTag: 1, RoutingKey: "q"}),
		AppendHeaderFrame(nil, 1, &ContentHeader{ClassID: 60, BodySize: 5, Props: Properties{DeliveryMode: 2, Flags: FlagDeliveryMode}}),
		AppendFrame(nil, FrameBody, 1, []byte("hel")),
		AppendFrame(nil, FrameBody, 1, []byte("lo")),
		AppendHeartbeat(nil),
	)
	f.Add(stream, []byte{1, 7, 20, 3})
	f.Add(stream[:50], []byte{0, 0, 6, 1})
	f.Add(AppendHeartbeat(nil), []byte{7})
	f.Add(cat(AppendHeartbeat(nil), []byte{1, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF}), []byte{9})
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0xCD}, []byte{})
	f.Add(ProtocolHeader, []byte{4})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		want := parseAll(fuzzMaxFrame, [][]byte{data})

		var chunks [][]byte
		rest := data
		for _, c := range cuts {
			n := min(int(c), len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		chunks = append(chunks, rest)
		got := parseAll(fuzzMaxFrame, chunks)

		if !sameFrames(want.Frames, got.Frames) || want.Err != got.Err || want.Buffered != got.Buffered {
			t.Errorf("split parse differs from one-call parse (-want +got):\n%s", cmp.Diff(want, got))
		}
		total := 0
		for _, fr := range want.Frames {
			if len(fr.Raw) > fuzzMaxFrame || fr.Raw[len(fr.Raw)-1] != FrameEnd {
				t.Errorf("accepted a bad frame of %d bytes", len(fr.Raw))
			}
			total += len(fr.Raw)
		}
		if want.Err == "" && total+want.Buffered != len(data) {
			t.Errorf("frames (%d bytes) and Buffered (%d) do not add up to the input (%d)", total, want.Buffered, len(data))
		}
	})
}

// cmpDecoded compares decoded values: NaN equals NaN, and RawProps, which
// aliases the input, is compared separately.
var cmpDecoded = cmp.Options{
	cmpopts.EquateNaNs(),
	cmpopts.IgnoreFields(ContentHeader{}, "RawProps"),
}

// checkDecodeError fails unless err is a FrameError or SyntaxError.
func checkDecodeError(t *testing.T, err error) {
	t.Helper()
	if code := errCode(t, err); code != FrameError && code != SyntaxError {
		t.Fatalf("error %v is not a FrameError or SyntaxError", err)
	}
}

func FuzzDecodeMethod(f *testing.F) {
	for _, tc := range methodCases() {
		f.Add(cat(u16(tc.wantClass), u16(tc.wantMethod), tc.wantArgs))
	}
	f.Add(AppendMethodPayload(nil, &BasicConsume{Queue: "q", Arguments: allFieldTypes()}))
	f.Add(cat(u16(50), u16(10)))
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := DecodeMethod(payload)
		if err != nil {
			if m != nil {
				t.Fatalf("DecodeMethod returned %#v with error %v", m, err)
			}
			if !errors.Is(err, ErrUnsupportedMethod) {
				checkDecodeError(t, err)
			}
			return
		}
		if err := ValidateMethod(m); err != nil {
			t.Fatalf("decoded method does not encode: %v", err)
		}
		enc := AppendMethodPayload(nil, m)
		m2, err := DecodeMethod(enc)
		if err != nil {
			t.Fatalf("DecodeMethod of the re-encoded method: %v\npayload %x\nre-encoded %x", err, payload, enc)
		}
		if diff := cmp.Diff(m, m2, cmpDecoded); diff != "" {
			t.Fatalf("decode(encode(decode(payload))) (-want +got):\n%s", diff)
		}
		if enc2 := AppendMethodPayload(nil, m2); !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable:\n%x\n%x", enc, enc2)
		}
	})
}

func FuzzDecodeContentHeader(f *testing.F) {
	allWire, _ := allPropertiesWire()
	f.Add(allWire)
	f.Add(AppendHeaderPayload(nil, &ContentHeader{ClassID: 60, BodySize: 3, Props: allProperties()}))
	f.Add(cat(u16(60), u16(0), u64(1), u16(0)))
	f.Add(cat(u16(60), u16(0), u64(1), u16(FlagHeaders), ls(string(cat(ss("k"), []byte{'F'}, ls(""))))))
	f.Fuzz(func(t *testing.T, payload []byte) {
		h, err := DecodeContentHeader(payload)
		if err != nil {
			if h != nil {
				t.Fatalf("DecodeContentHeader returned %#v with error %v", h, err)
			}
			checkDecodeError(t, err)
			return
		}
		if size, err := ContentHeaderBodySize(payload); err != nil || size != h.BodySize {
			t.Fatalf("ContentHeaderBodySize = %d, %v; decoded body size %d", size, err, h.BodySize)
		}
		if raw, err := ContentHeaderRawProps(payload); err != nil || !bytes.Equal(raw, h.RawProps) {
			t.Fatalf("ContentHeaderRawProps = %x, %v; decoded RawProps %x", raw, err, h.RawProps)
		}
		if err := h.Props.Validate(); err != nil {
			t.Fatalf("decoded properties do not encode: %v", err)
		}
		enc := AppendHeaderPayload(nil, h)
		h2, err := DecodeContentHeader(enc)
		if err != nil {
			t.Fatalf("DecodeContentHeader of the re-encoded header: %v\npayload %x\nre-encoded %x", err, payload, enc)
		}
		if diff := cmp.Diff(h, h2, cmpDecoded); diff != "" {
			t.Fatalf("decode(encode(decode(payload))) (-want +got):\n%s", diff)
		}
		if !bytes.Equal(h2.RawProps, enc[12:]) {
			t.Fatalf("RawProps of the re-encoded header is not its property bytes")
		}
		if enc2 := AppendHeaderPayload(nil, h2); !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable:\n%x\n%x", enc, enc2)
		}
	})
}
