package natswire

import "testing"

// The proxy's hot path: cutting messages out of a read buffer and reading a
// JetStream ack subject must not allocate.

func testStream() []byte {
	var b []byte
	hdr := []byte("NATS/1.0\r\nNats-Msg-Id: 1\r\n\r\n")
	for range 20 {
		b = AppendMsg(b, []byte("orders.new"), []byte("1"), []byte("$JS.ACK.ORDERS.proc.1.17.5.1700000000000000000.3"), nil, make([]byte, 100))
		b = AppendMsg(b, []byte("orders.new"), []byte("1"), []byte("$JS.ACK.ORDERS.proc.1.18.6.1700000000000000000.2"), hdr, make([]byte, 100))
		b = AppendPub(b, []byte("$JS.ACK.ORDERS.proc.1.18.6.1700000000000000000.2"), nil, nil, []byte("+ACK"))
		b = AppendPing(b)
	}
	return b
}

func TestParseAllocs(t *testing.T) {
	stream := testStream()
	p := NewParser(0)
	noop := func(*Msg) error { return nil }
	if a := testing.AllocsPerRun(100, func() {
		if err := p.Parse(stream, noop); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("Parse of whole messages: %v allocs per run, want 0", a)
	}
	half := len(stream)/2 + 3
	if a := testing.AllocsPerRun(100, func() {
		if err := p.Parse(stream[:half], noop); err != nil {
			t.Fatal(err)
		}
		if err := p.Parse(stream[half:], noop); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("Parse of a split stream: %v allocs per run, want 0 once the buffer has grown", a)
	}
}

func TestJSAckAllocs(t *testing.T) {
	subj := []byte("$JS.ACK.ORDERS.proc.1.17.5.1700000000000000000.3")
	dst := make([]byte, 0, 512)
	body := make([]byte, 100)
	if a := testing.AllocsPerRun(100, func() {
		if _, ok := ParseJSAck(subj); !ok {
			t.Fatal("not an ack subject")
		}
		_ = IsAckBody([]byte("+ACK"))
		_ = AppendMsg(dst[:0], []byte("orders.new"), []byte("1"), subj, nil, body)
	}); a != 0 {
		t.Errorf("%v allocs per run, want 0", a)
	}
}

func BenchmarkParse(b *testing.B) {
	stream := testStream()
	p := NewParser(0)
	noop := func(*Msg) error { return nil }
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		if err := p.Parse(stream, noop); err != nil {
			b.Fatal(err)
		}
	}
}
