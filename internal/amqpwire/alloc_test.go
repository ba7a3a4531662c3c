package amqpwire

import "testing"

// The proxy's hot path: cutting frames out of a read buffer and reading a
// content header's body size must not allocate.

func TestParseAllocs(t *testing.T) {
	stream, _ := testStream()
	p := NewParser(FrameMinSize)
	noop := func(Frame) error { return nil }
	allocs := testing.AllocsPerRun(100, func() {
		if err := p.Parse(stream, noop); err != nil {
			t.Fatalf("Parse: %v", err)
		}
	})
	if allocs != 0 {
		t.Errorf("Parse of whole frames: %v allocs per run, want 0", allocs)
	}
}

// TestParseSplitAllocs checks that the assembly buffer is reused once grown.
func TestParseSplitAllocs(t *testing.T) {
	stream, _ := testStream()
	p := NewParser(FrameMinSize)
	noop := func(Frame) error { return nil }
	half := len(stream) / 2
	allocs := testing.AllocsPerRun(100, func() {
		if err := p.Parse(stream[:half], noop); err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if err := p.Parse(stream[half:], noop); err != nil {
			t.Fatalf("Parse: %v", err)
		}
	})
	if allocs != 0 {
		t.Errorf("Parse of a split stream: %v allocs per run, want 0 once the buffer has grown", allocs)
	}
}

func TestContentHeaderBodySizeAllocs(t *testing.T) {
	payload := AppendHeaderPayload(nil, &ContentHeader{ClassID: 60, BodySize: 9, Props: allProperties()})
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ContentHeaderBodySize(payload); err != nil {
			t.Fatalf("ContentHeaderBodySize: %v", err)
		}
		if _, err := ContentHeaderRawProps(payload); err != nil {
			t.Fatalf("ContentHeaderRawProps: %v", err)
		}
		if _, _, err := MethodID(payload); err != nil {
			t.Fatalf("MethodID: %v", err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocs per run, want 0", allocs)
	}
}

func TestAppendAllocs(t *testing.T) {
	dst := make([]byte, 0, 1024)
	ack := &BasicAck{DeliveryTag: 7}
	deliver := &BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 7, Exchange: "ex", RoutingKey: "rk"}
	raw := []byte{0x90, 0, 4, 't', 'e', 'x', 't', 2}
	body := make([]byte, 10000)
	allocs := testing.AllocsPerRun(100, func() {
		b := AppendMethodFrame(dst[:0], 1, ack)
		b = AppendMethodFrame(b, 1, deliver)
		b = AppendRawHeaderFrame(b, 1, 60, 4, raw)
		b = AppendHeartbeat(b)
		_ = b
	})
	if allocs != 0 {
		t.Errorf("append into a large enough dst: %v allocs per run, want 0", allocs)
	}
	big := make([]byte, 0, 20000)
	allocs = testing.AllocsPerRun(100, func() { _ = AppendBodyFrames(big[:0], 1, body, 4096) })
	if allocs != 0 {
		t.Errorf("AppendBodyFrames: %v allocs per run, want 0", allocs)
	}
}

func BenchmarkParse(b *testing.B) {
	stream, _ := testStream()
	p := NewParser(FrameMinSize)
	noop := func(Frame) error { return nil }
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		if err := p.Parse(stream, noop); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseSplit(b *testing.B) {
	stream, _ := testStream()
	p := NewParser(FrameMinSize)
	noop := func(Frame) error { return nil }
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 1500) // one Ethernet MTU per read
			if err := p.Parse(rest[:n], noop); err != nil {
				b.Fatal(err)
			}
			rest = rest[n:]
		}
	}
}

func BenchmarkDecodeMethodBasicDeliver(b *testing.B) {
	payload := AppendMethodPayload(nil, &BasicDeliver{
		ConsumerTag: "amq.ctag-Zx1y2w3v4u5t6s7r8q", DeliveryTag: 123456, Exchange: "orders", RoutingKey: "orders.created",
	})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMethod(payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeContentHeader(b *testing.B) {
	payload := AppendHeaderPayload(nil, &ContentHeader{ClassID: 60, BodySize: 9, Props: allProperties()})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeContentHeader(payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendMethodFrameBasicAck(b *testing.B) {
	dst := make([]byte, 0, 64)
	ack := &BasicAck{DeliveryTag: 7, Multiple: true}
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendMethodFrame(dst[:0], 1, ack)
	}
}
