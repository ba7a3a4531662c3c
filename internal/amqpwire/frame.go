package amqpwire

import "encoding/binary"

// Frame types and sizes (spec section 4.2.3).
const (
	FrameMethod    uint8 = 1
	FrameHeader    uint8 = 2
	FrameBody      uint8 = 3
	FrameHeartbeat uint8 = 8
	FrameEnd       byte  = 0xCE

	// FrameOverhead is the size of a frame around its payload: the 7-byte
	// header and the frame-end octet.
	FrameOverhead = 8
	// FrameMinSize is the spec's frame-min-size: every peer accepts frames
	// of this total size, and no frame-max below it is valid.
	FrameMinSize = 4096
	// FrameHardMax is the frame size limit used when no frame-max was
	// negotiated (a frame-max of 0 means "no limit" in connection.tune): a
	// safety cap, so that a corrupt or hostile length field cannot make the
	// proxy buffer gigabytes.
	FrameHardMax = 1 << 27

	frameHeaderSize = 7
)

// Class ids of the classes the proxy meets.
const (
	ClassConnection uint16 = 10
	ClassChannel    uint16 = 20
	ClassExchange   uint16 = 40
	ClassQueue      uint16 = 50
	ClassBasic      uint16 = 60
	ClassConfirm    uint16 = 85
	ClassTx         uint16 = 90
)

// ProtocolHeader is what a client sends before its first frame.
var ProtocolHeader = []byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}

// Frame is one complete frame.
//
// General frame layout (spec 4.2.3), all integers big-endian:
//
//	+------+---------+---------+ +-------------+ +-----------+
//	| type | channel |  size   | |   payload   | | frame-end |
//	+------+---------+---------+ +-------------+ +-----------+
//	 octet   short      long       size octets     octet 0xCE
//	 0       1-2        3-6        7 .. size+6     size+7
//
// A heartbeat frame has type 8, channel 0 and no payload. A body frame's
// payload is a slice of the message body, opaque to the codec.
//
// Raw is the whole frame as on the wire (header, payload, end octet) and
// Payload is Raw[7:len(Raw)-1]. Both alias a buffer owned by the Parser or
// the caller's input: they are valid only until the Parser's callback
// returns.
type Frame struct {
	Type    uint8
	Channel uint16
	Payload []byte
	Raw     []byte
}

// effectiveMaxFrame applies the frame-max rules shared by the Parser and
// AppendBodyFrames: 0 means FrameHardMax, and values below FrameMinSize are
// raised to it.
func effectiveMaxFrame(n uint32) uint32 {
	switch {
	case n == 0:
		return FrameHardMax
	case n < FrameMinSize:
		return FrameMinSize
	}
	return n
}

// appendFrameHeader appends a frame header with a zero size, to be set by
// finishFrame once the payload is appended.
func appendFrameHeader(dst []byte, typ uint8, channel uint16) []byte {
	return append(dst, typ, byte(channel>>8), byte(channel), 0, 0, 0, 0)
}

// finishFrame sets the size of the frame that starts at dst[start:] and
// appends the frame-end octet.
func finishFrame(dst []byte, start int) []byte {
	binary.BigEndian.PutUint32(dst[start+3:], uint32(len(dst)-start-frameHeaderSize))
	return append(dst, FrameEnd)
}

// AppendFrame appends a frame of type typ carrying payload.
func AppendFrame(dst []byte, typ uint8, channel uint16, payload []byte) []byte {
	dst = append(dst, typ, byte(channel>>8), byte(channel))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	dst = append(dst, payload...)
	return append(dst, FrameEnd)
}

// AppendHeartbeat appends a heartbeat frame: type 8, channel 0, no payload.
func AppendHeartbeat(dst []byte) []byte {
	return append(dst, FrameHeartbeat, 0, 0, 0, 0, 0, 0, FrameEnd)
}

// AppendMethodFrame appends a method frame carrying m on channel. It panics
// with an error wrapping ErrInvalidValue if m holds a value that cannot be
// encoded (see ValidateMethod).
func AppendMethodFrame(dst []byte, channel uint16, m Method) []byte {
	start := len(dst)
	dst = appendFrameHeader(dst, FrameMethod, channel)
	dst = AppendMethodPayload(dst, m)
	return finishFrame(dst, start)
}

// AppendHeaderFrame appends a content header frame on channel, encoding
// h.ClassID, h.Weight, h.BodySize and h.Props (the properties present in
// h.Props.Flags). h.RawProps is ignored: use AppendRawHeaderFrame to forward
// properties as received. It panics with an error wrapping ErrInvalidValue
// if a property cannot be encoded (see Properties.Validate).
func AppendHeaderFrame(dst []byte, channel uint16, h *ContentHeader) []byte {
	start := len(dst)
	dst = appendFrameHeader(dst, FrameHeader, channel)
	dst = AppendHeaderPayload(dst, h)
	return finishFrame(dst, start)
}

// AppendRawHeaderFrame appends a content header frame on channel with weight
// 0 and rawProps (property flags and values, as returned by
// ContentHeaderRawProps or AppendProperties) copied verbatim.
func AppendRawHeaderFrame(dst []byte, channel uint16, classID uint16, bodySize uint64, rawProps []byte) []byte {
	start := len(dst)
	dst = appendFrameHeader(dst, FrameHeader, channel)
	dst = binary.BigEndian.AppendUint16(dst, classID)
	dst = append(dst, 0, 0) // weight
	dst = binary.BigEndian.AppendUint64(dst, bodySize)
	dst = append(dst, rawProps...)
	return finishFrame(dst, start)
}

// AppendBodyFrames appends body as content body frames on channel, each at
// most maxFrame bytes in total (payload plus FrameOverhead). maxFrame follows
// the Parser's rules: 0 means FrameHardMax and values below FrameMinSize are
// raised to FrameMinSize. An empty body appends no frames.
func AppendBodyFrames(dst []byte, channel uint16, body []byte, maxFrame uint32) []byte {
	chunk := int(effectiveMaxFrame(maxFrame)) - FrameOverhead
	for len(body) > 0 {
		n := min(chunk, len(body))
		dst = AppendFrame(dst, FrameBody, channel, body[:n])
		body = body[n:]
	}
	return dst
}
