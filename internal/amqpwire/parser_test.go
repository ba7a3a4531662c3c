package amqpwire

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testStream is a realistic run of frames: tuning, a delivery with a
// header and a body split over frames, an ack, heartbeats, and an empty body
// frame. It returns the stream and each frame as on the wire.
func testStream() ([]byte, [][]byte) {
	var frames [][]byte
	add := func(b []byte) { frames = append(frames, b) }
	add(AppendMethodFrame(nil, 0, &ConnectionTune{ChannelMax: 2047, FrameMax: 4096, Heartbeat: 60}))
	add(AppendHeartbeat(nil))
	add(AppendMethodFrame(nil, 1, &BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 1, Exchange: "ex", RoutingKey: "rk"}))
	body := make([]byte, 9000)
	for i := range body {
		body[i] = byte(i)
	}
	add(AppendHeaderFrame(nil, 1, &ContentHeader{ClassID: 60, BodySize: uint64(len(body)), Props: allProperties()}))
	for chunk := body; len(chunk) > 0; {
		n := min(len(chunk), FrameMinSize-FrameOverhead)
		add(AppendFrame(nil, FrameBody, 1, chunk[:n]))
		chunk = chunk[n:]
	}
	add(AppendFrame(nil, FrameBody, 1, nil))
	add(AppendMethodFrame(nil, 1, &BasicAck{DeliveryTag: 1}))
	add(AppendHeartbeat(nil))

	var stream []byte
	for _, f := range frames {
		stream = append(stream, f...)
	}
	return stream, frames
}

func wantFrames(raws [][]byte) []gotFrame {
	var want []gotFrame
	for _, raw := range raws {
		want = append(want, gotFrame{
			Type:    raw[0],
			Channel: uint16(raw[1])<<8 | uint16(raw[2]),
			Payload: raw[7 : len(raw)-1],
			Raw:     raw,
		})
	}
	return want
}

// sameFrames is a fast equality check; failures are then shown by cmp.Diff.
func sameFrames(a, b []gotFrame) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || a[i].Channel != b[i].Channel ||
			!bytes.Equal(a[i].Payload, b[i].Payload) || !bytes.Equal(a[i].Raw, b[i].Raw) {
			return false
		}
	}
	return true
}

// parseChunks feeds chunks to a fresh Parser and returns the frames.
func parseChunks(t *testing.T, maxFrame uint32, chunks ...[]byte) []gotFrame {
	t.Helper()
	p := NewParser(maxFrame)
	var got []gotFrame
	for i, c := range chunks {
		if err := p.Parse(c, collect(&got)); err != nil {
			t.Fatalf("Parse of chunk %d: %v", i, err)
		}
	}
	if n := p.Buffered(); n != 0 {
		t.Fatalf("Buffered() = %d after the whole stream, want 0", n)
	}
	return got
}

func TestParseOneCall(t *testing.T) {
	stream, raws := testStream()
	got := parseChunks(t, FrameMinSize, stream)
	if diff := cmp.Diff(wantFrames(raws), got); diff != "" {
		t.Errorf("frames (-want +got):\n%s", diff)
	}
}

// TestParseZeroCopy checks that frames lying in one chunk alias it.
func TestParseZeroCopy(t *testing.T) {
	stream, raws := testStream()
	off := 0
	i := 0
	err := NewParser(FrameMinSize).Parse(stream, func(f Frame) error {
		if &f.Raw[0] != &stream[off] || len(f.Raw) != len(raws[i]) {
			t.Errorf("frame %d does not alias the input at offset %d", i, off)
		}
		if len(f.Payload) > 0 && &f.Payload[0] != &stream[off+7] {
			t.Errorf("frame %d payload does not alias the input", i)
		}
		off += len(f.Raw)
		i++
		return nil
	})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
}

// TestParseEverySplit splits the stream at every offset into two Parse calls.
func TestParseEverySplit(t *testing.T) {
	stream, raws := testStream()
	want := wantFrames(raws)
	for i := 0; i <= len(stream); i++ {
		got := parseChunks(t, FrameMinSize, stream[:i], stream[i:])
		if sameFrames(want, got) {
			continue // cmp.Diff is too slow to run on every split
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("split at %d: frames (-want +got):\n%s", i, diff)
		}
	}
}

// TestParseRandomChunks feeds the stream in many chunks of random sizes,
// including empty ones and single bytes.
func TestParseRandomChunks(t *testing.T) {
	stream, raws := testStream()
	want := wantFrames(raws)
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 500 {
		var chunks [][]byte
		maxChunk := []int{1, 8, 64, 5000}[iter%4]
		for rest := stream; len(rest) > 0; {
			n := min(rng.IntN(maxChunk+1), len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		got := parseChunks(t, FrameMinSize, chunks...)
		if sameFrames(want, got) {
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("iteration %d: frames (-want +got):\n%s", iter, diff)
		}
	}
}

func TestParseBuffered(t *testing.T) {
	stream, _ := testStream()
	p := NewParser(FrameMinSize)
	var got []gotFrame
	// The first frame is connection.tune, 20 bytes.
	for i, want := range []int{3, 6, 0} {
		chunk := stream[3*i : 3*i+3]
		if i == 2 {
			chunk = stream[6:20]
		}
		if err := p.Parse(chunk, collect(&got)); err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if p.Buffered() != want {
			t.Errorf("after chunk %d: Buffered() = %d, want %d", i, p.Buffered(), want)
		}
	}
	if len(got) != 1 {
		t.Errorf("got %d frames, want 1", len(got))
	}
}

func TestParseErrors(t *testing.T) {
	good := AppendHeartbeat(nil)
	badEnd := AppendMethodFrame(nil, 1, &BasicAck{DeliveryTag: 1})
	badEnd[len(badEnd)-1] = 0xCD
	tests := map[string]struct {
		maxFrame   uint32
		stream     []byte
		wantFrames int // frames delivered before the error
	}{
		"size field 4 GiB": {
			maxFrame: 0, stream: cat(good, []byte{1, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF}, make([]byte, 100)), wantFrames: 1,
		},
		"one byte over frame-max": {
			maxFrame: 4096, stream: cat([]byte{3, 0, 1}, u32(4096-8+1)), wantFrames: 0,
		},
		"over the hard cap with no frame-max": {
			maxFrame: 0, stream: cat([]byte{3, 0, 1}, u32(FrameHardMax-8+1)), wantFrames: 0,
		},
		"bad frame-end":       {maxFrame: 4096, stream: cat(good, badEnd, good), wantFrames: 1},
		"unknown frame type":  {maxFrame: 4096, stream: frame(4, 0, nil), wantFrames: 0},
		"protocol header":     {maxFrame: 4096, stream: ProtocolHeader, wantFrames: 0},
		"type 0 (zero bytes)": {maxFrame: 4096, stream: make([]byte, 8), wantFrames: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, split := range []string{"one chunk", "bytewise"} {
				p := NewParser(tc.maxFrame)
				var got []gotFrame
				var err error
				if split == "one chunk" {
					err = p.Parse(tc.stream, collect(&got))
				} else {
					for i := range tc.stream {
						if err = p.Parse(tc.stream[i:i+1], collect(&got)); err != nil {
							break
						}
					}
				}
				if code := errCode(t, err); code != FrameError {
					t.Errorf("%s: Parse error = %v, want a FrameError", split, err)
				}
				if len(got) != tc.wantFrames {
					t.Errorf("%s: %d frames before the error, want %d", split, len(got), tc.wantFrames)
				}
				if cap(p.buf) > 64 {
					t.Errorf("%s: parser holds a %d-byte buffer after rejecting the frame", split, cap(p.buf))
				}
				if again := p.Parse(good, collect(&got)); again != err {
					t.Errorf("%s: Parse after the error = %v, want the same error %v", split, again, err)
				}
			}
		})
	}
}

// TestParseDoesNotTrustSize feeds the header of a frame of the largest
// size allowed, and a little payload: the Parser must hold about what it
// received, not what the header claims.
func TestParseDoesNotTrustSize(t *testing.T) {
	p := NewParser(0)
	chunk := cat([]byte{FrameBody, 0, 1}, u32(FrameHardMax-FrameOverhead), make([]byte, 1000))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := p.Parse(chunk, func(Frame) error { return nil }); err != nil {
		t.Fatalf("Parse: %v", err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("Parse allocated %d bytes for a 1007-byte partial frame", got)
	}
	if p.Buffered() != len(chunk) {
		t.Errorf("Buffered() = %d, want %d", p.Buffered(), len(chunk))
	}
}

func TestParseCallbackError(t *testing.T) {
	stream, _ := testStream()
	stop := errors.New("stop here")
	p := NewParser(FrameMinSize)
	n := 0
	err := p.Parse(stream, func(Frame) error {
		n++
		if n == 2 {
			return stop
		}
		return nil
	})
	if err != stop {
		t.Fatalf("Parse = %v, want the callback's error as is", err)
	}
	if n != 2 {
		t.Errorf("callback ran %d times, want 2", n)
	}
	if again := p.Parse(stream, func(Frame) error { t.Error("callback after an error"); return nil }); again != stop {
		t.Errorf("Parse after the error = %v, want %v", again, stop)
	}
}

func TestParserMaxFrame(t *testing.T) {
	tests := map[string]struct {
		set  uint32
		want uint32
	}{
		"no limit":           {set: 0, want: FrameHardMax},
		"below the minimum":  {set: 512, want: FrameMinSize},
		"the minimum":        {set: FrameMinSize, want: FrameMinSize},
		"RabbitMQ default":   {set: 131072, want: 131072},
		"above the hard cap": {set: 1 << 30, want: 1 << 30},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := NewParser(tc.set).MaxFrame(); got != tc.want {
				t.Errorf("NewParser(%d).MaxFrame() = %d, want %d", tc.set, got, tc.want)
			}
			p := NewParser(FrameMinSize)
			p.SetMaxFrame(tc.set)
			if got := p.MaxFrame(); got != tc.want {
				t.Errorf("SetMaxFrame(%d): MaxFrame() = %d, want %d", tc.set, got, tc.want)
			}
		})
	}
}

// TestParserSetMaxFrame lowers the limit between frames, as after tune-ok.
func TestParserSetMaxFrame(t *testing.T) {
	big := AppendFrame(nil, FrameBody, 1, make([]byte, 10000))
	p := NewParser(0)
	if err := p.Parse(big, func(Frame) error { return nil }); err != nil {
		t.Fatalf("Parse before SetMaxFrame: %v", err)
	}
	p.SetMaxFrame(FrameMinSize)
	if err := p.Parse(big, func(Frame) error { return nil }); errCode(t, err) != FrameError {
		t.Errorf("Parse after SetMaxFrame(%d) = %v, want a FrameError", FrameMinSize, err)
	}
}
