package amqpwire

import "encoding/binary"

// parserState says what the Parser expects next from the stream.
type parserState uint8

const (
	// stateFrameStart: at a frame boundary, nothing buffered. A frame that
	// lies wholly in the input is delivered without copying.
	stateFrameStart parserState = iota
	// stateHeader: buf holds 1 to 6 bytes of a frame header.
	stateHeader
	// stateFrame: buf holds a checked header and part of the payload; the
	// frame is need bytes long in total.
	stateFrame
	// stateFailed: a frame was invalid or the callback failed; err says why.
	stateFailed
)

// keepBufCap is the largest assembly buffer kept between frames. A larger
// one, grown for one big split frame, is dropped once that frame is done.
const keepBufCap = 256 << 10

// Parser cuts a byte stream into frames. It is fed arbitrary chunks of the
// stream with Parse. Frames lying wholly inside one chunk alias that chunk;
// only a frame split across chunks is assembled in an internal buffer, which
// grows with the bytes actually received, never ahead of them.
//
// A Parser is not safe for concurrent use. After Parse returns an error the
// Parser is unusable: every later call returns the same error, and the
// connection is to be closed.
type Parser struct {
	state    parserState
	maxFrame uint32
	need     int    // total size of the frame being assembled (stateFrame)
	buf      []byte // assembly buffer for a split frame
	err      error
}

// NewParser returns a Parser that accepts frames of at most maxFrame bytes
// in total, FrameOverhead included. A maxFrame of 0 means no negotiated
// limit, and the Parser then uses FrameHardMax; a maxFrame below
// FrameMinSize is raised to FrameMinSize, which every peer must accept.
func NewParser(maxFrame uint32) *Parser {
	return &Parser{maxFrame: effectiveMaxFrame(maxFrame)}
}

// SetMaxFrame changes the frame size limit, as after connection.tune-ok,
// with the same rules as NewParser. It applies to frames whose header is not
// yet complete.
func (p *Parser) SetMaxFrame(n uint32) { p.maxFrame = effectiveMaxFrame(n) }

// MaxFrame returns the frame size limit in force, after NewParser's rules.
func (p *Parser) MaxFrame() uint32 { return p.maxFrame }

// Buffered reports how many bytes of an incomplete frame the Parser holds.
func (p *Parser) Buffered() int { return len(p.buf) }

// Parse consumes all of data, calling fn for each complete frame in order.
// The Frame passed to fn is valid only until fn returns.
//
// Each frame's header is checked before any of its payload is buffered: a
// size above MaxFrame or an unknown frame type is a *Error with Code
// FrameError, and so is a frame-end octet other than FrameEnd. An error
// returned by fn stops parsing and is returned as is. After any error the
// Parser is unusable.
func (p *Parser) Parse(data []byte, fn func(Frame) error) error {
	if p.state == stateFailed {
		return p.err
	}
	for len(data) > 0 {
		switch p.state {
		case stateFrameStart:
			if len(data) < frameHeaderSize {
				p.buf = append(p.buf[:0], data...)
				p.state = stateHeader
				return nil
			}
			size, err := p.checkHeader(data)
			if err != nil {
				return p.fail(err)
			}
			if len(data) < size {
				p.buf = append(p.buf[:0], data...)
				p.need = size
				p.state = stateFrame
				return nil
			}
			if err := p.deliver(data[:size], fn); err != nil {
				return err
			}
			data = data[size:]

		case stateHeader:
			n := min(frameHeaderSize-len(p.buf), len(data))
			p.buf = append(p.buf, data[:n]...)
			data = data[n:]
			if len(p.buf) < frameHeaderSize {
				return nil
			}
			size, err := p.checkHeader(p.buf)
			if err != nil {
				return p.fail(err)
			}
			p.need = size
			p.state = stateFrame // a frame is at least 8 bytes: more to come

		case stateFrame:
			n := min(p.need-len(p.buf), len(data))
			p.buf = append(p.buf, data[:n]...)
			data = data[n:]
			if len(p.buf) < p.need {
				return nil
			}
			if err := p.deliver(p.buf, fn); err != nil {
				return err
			}
			p.state = stateFrameStart
			if cap(p.buf) > keepBufCap {
				p.buf = nil
			} else {
				p.buf = p.buf[:0]
			}
		}
	}
	return nil
}

// checkHeader checks the 7-byte frame header at the start of h and returns
// the frame's total size.
func (p *Parser) checkHeader(h []byte) (int, error) {
	typ := h[0]
	switch typ {
	case FrameMethod, FrameHeader, FrameBody, FrameHeartbeat:
	default:
		return 0, frameErrorf("frame on channel %d: unknown frame type %d (the stream is out of step, or it is not AMQP 0-9-1)",
			binary.BigEndian.Uint16(h[1:3]), typ)
	}
	total := uint64(binary.BigEndian.Uint32(h[3:7])) + FrameOverhead
	if total > uint64(p.maxFrame) {
		return 0, frameErrorf("frame type %d on channel %d: size %d exceeds frame-max %d",
			typ, binary.BigEndian.Uint16(h[1:3]), total, p.maxFrame)
	}
	return int(total), nil
}

// deliver checks the frame-end octet of the complete frame raw and passes
// the frame to fn.
func (p *Parser) deliver(raw []byte, fn func(Frame) error) error {
	f := Frame{
		Type:    raw[0],
		Channel: binary.BigEndian.Uint16(raw[1:3]),
		Payload: raw[frameHeaderSize : len(raw)-1],
		Raw:     raw,
	}
	if end := raw[len(raw)-1]; end != FrameEnd {
		return p.fail(frameErrorf("frame type %d on channel %d, size %d: frame-end octet is 0x%02X, want 0xCE",
			f.Type, f.Channel, len(raw), end))
	}
	if err := fn(f); err != nil {
		return p.fail(err)
	}
	return nil
}

func (p *Parser) fail(err error) error {
	p.state = stateFailed
	p.err = err
	p.buf = nil
	return err
}
