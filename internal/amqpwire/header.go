package amqpwire

import (
	"encoding/binary"
	"strconv"
	"time"
)

// Property flags of class basic (spec 4.2.6.1 and the basic class): bit 15
// is the first property. A property is on the wire only if its flag is set.
const (
	FlagContentType     uint16 = 0x8000 // content-type shortstr
	FlagContentEncoding uint16 = 0x4000 // content-encoding shortstr
	FlagHeaders         uint16 = 0x2000 // headers table
	FlagDeliveryMode    uint16 = 0x1000 // delivery-mode octet
	FlagPriority        uint16 = 0x0800 // priority octet
	FlagCorrelationID   uint16 = 0x0400 // correlation-id shortstr
	FlagReplyTo         uint16 = 0x0200 // reply-to shortstr
	FlagExpiration      uint16 = 0x0100 // expiration shortstr
	FlagMessageID       uint16 = 0x0080 // message-id shortstr
	FlagTimestamp       uint16 = 0x0040 // timestamp (64-bit seconds)
	FlagType            uint16 = 0x0020 // type shortstr
	FlagUserID          uint16 = 0x0010 // user-id shortstr
	FlagAppID           uint16 = 0x0008 // app-id shortstr
	FlagClusterID       uint16 = 0x0004 // cluster-id shortstr (reserved)

	// flagContinuation announces a further flags word.
	flagContinuation uint16 = 0x0001
	// basicFlags is every flag that class basic defines.
	basicFlags uint16 = 0xFFFC
)

// contentHeaderMin is the size of a content header payload without
// properties: class-id, weight, body-size and one flags word.
const contentHeaderMin = 14

// ContentHeader is a decoded content header frame payload.
//
// Content header payload layout (spec 4.2.6):
//
//	0          2        4           12               14
//	+----------+--------+-----------+----------------+------------- - -
//	| class-id | weight | body-size | property-flags | property-list...
//	+----------+--------+-----------+----------------+------------- - -
//	   short     short    longlong        short         rest of payload
//
// The property flags say which properties follow, in flag order from bit 15
// down; bit 0 set would announce another flags word, which class basic, with
// its 14 properties, never needs. RawProps is the flags word and the
// property list exactly as received.
type ContentHeader struct {
	ClassID  uint16
	Weight   uint16 // always 0 in practice
	BodySize uint64
	Props    Properties
	// RawProps is the property flags and values exactly as received. On
	// decode it aliases the payload; encoders ignore it (see
	// AppendRawHeaderFrame).
	RawProps []byte
}

// Properties are the properties of class basic. Flags says which are
// present (FlagContentType and so on): encoding writes exactly those, and
// decoding sets only those, leaving the others zero. Flag bits other than
// the 14 defined ones are ignored on encode. For decode(encode(p)) == p, the
// fields whose flag is clear must be zero.
type Properties struct {
	ContentType     string    // content-type
	ContentEncoding string    // content-encoding
	Headers         Table     // headers
	DeliveryMode    uint8     // delivery-mode: 1 transient, 2 persistent
	Priority        uint8     // priority
	CorrelationID   string    // correlation-id
	ReplyTo         string    // reply-to
	Expiration      string    // expiration
	MessageID       string    // message-id
	Timestamp       time.Time // timestamp: whole seconds, UTC on decode
	Type            string    // type
	UserID          string    // user-id
	AppID           string    // app-id
	ClusterID       string    // cluster-id (reserved; RabbitMQ ignores it)
	Flags           uint16    // which properties are present
}

// Validate reports whether p can be encoded, as an error wrapping
// ErrInvalidValue: a present shortstr over 255 bytes, or a headers table
// holding a value that cannot be encoded.
func (p *Properties) Validate() (err error) {
	defer catchEncode(&err)
	AppendProperties(nil, p)
	return nil
}

// AppendHeaderPayload appends the payload of a content header frame:
// h.ClassID, h.Weight, h.BodySize and h.Props (see AppendHeaderFrame).
func AppendHeaderPayload(dst []byte, h *ContentHeader) []byte {
	dst = appendU16(dst, h.ClassID)
	dst = appendU16(dst, h.Weight)
	dst = appendU64(dst, h.BodySize)
	return AppendProperties(dst, &h.Props)
}

// ContentHeaderBodySize returns the body size of a content header frame
// payload without decoding its properties. It does not allocate.
func ContentHeaderBodySize(payload []byte) (uint64, error) {
	if len(payload) < contentHeaderMin {
		return 0, frameErrorf("content header: payload of %d bytes is shorter than the %d-byte minimum", len(payload), contentHeaderMin)
	}
	return binary.BigEndian.Uint64(payload[4:12]), nil
}

// ContentHeaderRawProps returns the property flags and values of a content
// header frame payload, aliasing payload. It checks only that the payload
// holds a flags word, not the properties.
func ContentHeaderRawProps(payload []byte) ([]byte, error) {
	if len(payload) < contentHeaderMin {
		return nil, frameErrorf("content header: payload of %d bytes is shorter than the %d-byte minimum", len(payload), contentHeaderMin)
	}
	return payload[12:], nil
}

// DecodeContentHeader decodes a content header frame payload, with all the
// properties of class basic. RawProps aliases payload; the properties do
// not. Only class basic is decoded: another class id is a *Error with Code
// SyntaxError. See the package documentation for the other errors.
func DecodeContentHeader(payload []byte) (*ContentHeader, error) {
	raw, err := ContentHeaderRawProps(payload)
	if err != nil {
		return nil, err
	}
	h := &ContentHeader{
		ClassID:  binary.BigEndian.Uint16(payload[0:2]),
		Weight:   binary.BigEndian.Uint16(payload[2:4]),
		BodySize: binary.BigEndian.Uint64(payload[4:12]),
		RawProps: raw,
	}
	if h.ClassID != ClassBasic {
		return nil, &Error{Code: SyntaxError, Text: "content header: class " + strconv.Itoa(int(h.ClassID)) + " is not decoded; only class basic (60) carries content"}
	}
	if err := decodeProperties(raw, &h.Props); err != nil {
		return nil, err
	}
	return h, nil
}

// DecodeProperties decodes the property flags and values of class basic, as
// returned by ContentHeaderRawProps, filling all of raw. The result does not
// alias raw.
func DecodeProperties(raw []byte) (Properties, error) {
	var p Properties
	err := decodeProperties(raw, &p)
	return p, err
}

func decodeProperties(raw []byte, p *Properties) error {
	d := decoder{b: raw, obj: "basic properties"}
	flags := d.u16("property-flags")
	if d.err == nil {
		if flags&flagContinuation != 0 {
			d.fail(FrameError, "property-flags", "0x%04X has the continuation bit set, but class basic has a single flags word", flags)
		} else if flags&^basicFlags != 0 {
			d.fail(FrameError, "property-flags", "0x%04X sets bit 0x0002, which announces no property of class basic", flags)
		}
	}
	p.Flags = flags
	if flags&FlagContentType != 0 {
		p.ContentType = d.shortstr("content-type")
	}
	if flags&FlagContentEncoding != 0 {
		p.ContentEncoding = d.shortstr("content-encoding")
	}
	if flags&FlagHeaders != 0 {
		p.Headers = d.table("headers")
	}
	if flags&FlagDeliveryMode != 0 {
		p.DeliveryMode = d.u8("delivery-mode")
	}
	if flags&FlagPriority != 0 {
		p.Priority = d.u8("priority")
	}
	if flags&FlagCorrelationID != 0 {
		p.CorrelationID = d.shortstr("correlation-id")
	}
	if flags&FlagReplyTo != 0 {
		p.ReplyTo = d.shortstr("reply-to")
	}
	if flags&FlagExpiration != 0 {
		p.Expiration = d.shortstr("expiration")
	}
	if flags&FlagMessageID != 0 {
		p.MessageID = d.shortstr("message-id")
	}
	if flags&FlagTimestamp != 0 {
		ts := d.u64("timestamp")
		if d.err == nil {
			p.Timestamp = time.Unix(int64(ts), 0).UTC()
		}
	}
	if flags&FlagType != 0 {
		p.Type = d.shortstr("type")
	}
	if flags&FlagUserID != 0 {
		p.UserID = d.shortstr("user-id")
	}
	if flags&FlagAppID != 0 {
		p.AppID = d.shortstr("app-id")
	}
	if flags&FlagClusterID != 0 {
		p.ClusterID = d.shortstr("cluster-id")
	}
	if err := d.finish(); err != nil {
		*p = Properties{}
		return err
	}
	return nil
}

// AppendProperties appends p's property flags and the present properties, in
// the layout of ContentHeader.RawProps. It panics with an error wrapping
// ErrInvalidValue if a property cannot be encoded (see Properties.Validate).
func AppendProperties(dst []byte, p *Properties) []byte {
	flags := p.Flags & basicFlags
	dst = appendU16(dst, flags)
	if flags&FlagContentType != 0 {
		dst = appendShortstr(dst, p.ContentType)
	}
	if flags&FlagContentEncoding != 0 {
		dst = appendShortstr(dst, p.ContentEncoding)
	}
	if flags&FlagHeaders != 0 {
		dst = appendTable(dst, p.Headers, 1)
	}
	if flags&FlagDeliveryMode != 0 {
		dst = append(dst, p.DeliveryMode)
	}
	if flags&FlagPriority != 0 {
		dst = append(dst, p.Priority)
	}
	if flags&FlagCorrelationID != 0 {
		dst = appendShortstr(dst, p.CorrelationID)
	}
	if flags&FlagReplyTo != 0 {
		dst = appendShortstr(dst, p.ReplyTo)
	}
	if flags&FlagExpiration != 0 {
		dst = appendShortstr(dst, p.Expiration)
	}
	if flags&FlagMessageID != 0 {
		dst = appendShortstr(dst, p.MessageID)
	}
	if flags&FlagTimestamp != 0 {
		dst = appendU64(dst, uint64(p.Timestamp.Unix()))
	}
	if flags&FlagType != 0 {
		dst = appendShortstr(dst, p.Type)
	}
	if flags&FlagUserID != 0 {
		dst = appendShortstr(dst, p.UserID)
	}
	if flags&FlagAppID != 0 {
		dst = appendShortstr(dst, p.AppID)
	}
	if flags&FlagClusterID != 0 {
		dst = appendShortstr(dst, p.ClusterID)
	}
	return dst
}
