package amqpwire

import (
	"encoding/binary"
	"errors"
	"testing"
)

// Wire builders for hand-made test bytes, written straight from the spec
// layout and independent of the package's encoders.

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func u8(v uint8) []byte   { return []byte{v} }
func u16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// ss is a shortstr.
func ss(s string) []byte { return append([]byte{byte(len(s))}, s...) }

// ls is a longstr, also the layout of a table or array with content s.
func ls(s string) []byte { return append(u32(uint32(len(s))), s...) }

// frame is a whole frame around payload.
func frame(typ uint8, channel uint16, payload []byte) []byte {
	return cat(u8(typ), u16(channel), u32(uint32(len(payload))), payload, u8(0xCE))
}

// errCode returns the Code of err if it is an *Error, or 0.
func errCode(t *testing.T, err error) uint16 {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		return 0
	}
	return e.Code
}

// gotFrame is a copy of a Frame that outlives the Parser callback.
type gotFrame struct {
	Type    uint8
	Channel uint16
	Payload []byte
	Raw     []byte
}

func copyFrame(f Frame) gotFrame {
	return gotFrame{
		Type:    f.Type,
		Channel: f.Channel,
		Payload: append([]byte{}, f.Payload...),
		Raw:     append([]byte{}, f.Raw...),
	}
}

// collect returns a Parse callback appending copies of frames to *dst.
func collect(dst *[]gotFrame) func(Frame) error {
	return func(f Frame) error {
		*dst = append(*dst, copyFrame(f))
		return nil
	}
}
