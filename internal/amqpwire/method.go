package amqpwire

import (
	"encoding/binary"
	"fmt"
)

// Method is an AMQP method: a class id, a method id and an argument list.
//
// Method frame payload layout (spec 4.2.4):
//
//	0          2           4
//	+----------+-----------+-------------- - -
//	| class-id | method-id | arguments...
//	+----------+-----------+-------------- - -
//	   short       short
//
// Arguments are laid out in the spec's order, big-endian, with no padding:
// octet, short (16 bits), long (32), longlong (64), shortstr (an octet
// length and up to 255 bytes), longstr and table (a 32-bit length and the
// bytes). Consecutive bit arguments share one octet, the first bit in the
// lowest bit; any other argument ends the run.
//
// The method types of this package implement Method with pointer receivers:
// DecodeMethod returns pointers, such as *BasicDeliver.
type Method interface {
	// ID returns the method's class id and method id.
	ID() (class, method uint16)
	// AppendArgs appends the method's argument list (not the class and
	// method ids). It panics with an error wrapping ErrInvalidValue if a
	// value cannot be encoded; ValidateMethod reports that as an error.
	AppendArgs(dst []byte) []byte
}

// methodCodec is a Method that this package decodes.
type methodCodec interface {
	Method
	decodeArgs(d *decoder)
}

// MethodID reads the class id and method id from a method frame's payload.
// A payload shorter than 4 bytes is a *Error with Code FrameError.
func MethodID(payload []byte) (class, method uint16, err error) {
	if len(payload) < 4 {
		return 0, 0, frameErrorf("method frame payload of %d bytes is too short for class and method ids (4 bytes)", len(payload))
	}
	return binary.BigEndian.Uint16(payload), binary.BigEndian.Uint16(payload[2:]), nil
}

// DecodeMethod decodes a method frame payload. It returns a pointer to one
// of this package's method types, such as *BasicDeliver.
//
// For a (class, method) pair it does not decode, it returns nil and an error
// wrapping ErrUnsupportedMethod: pass such a frame through raw. Arguments
// that do not fit the method's layout (too short, or bytes left over) are a
// *Error with Code FrameError; an invalid value inside them, such as an
// unknown field-value type in a table, is a *Error with Code SyntaxError.
// The result does not alias payload.
func DecodeMethod(payload []byte) (Method, error) {
	class, method, err := MethodID(payload)
	if err != nil {
		return nil, err
	}
	m, name := newMethod(class, method)
	if m == nil {
		return nil, fmt.Errorf("%w: class %d method %d; pass the frame through raw", ErrUnsupportedMethod, class, method)
	}
	d := decoder{b: payload[4:], obj: name}
	m.decodeArgs(&d)
	if err := d.finish(); err != nil {
		return nil, err
	}
	return m, nil
}

// AppendMethodPayload appends m's class id, method id and arguments. It
// panics with an error wrapping ErrInvalidValue if m holds a value that
// cannot be encoded (see ValidateMethod).
func AppendMethodPayload(dst []byte, m Method) []byte {
	class, method := m.ID()
	dst = appendU16(dst, class)
	dst = appendU16(dst, method)
	return m.AppendArgs(dst)
}

// ValidateMethod reports whether m can be encoded, as an error wrapping
// ErrInvalidValue: a shortstr over 255 bytes, or an argument table holding
// a value that cannot be encoded. Methods returned by DecodeMethod are always
// valid.
func ValidateMethod(m Method) (err error) {
	defer catchEncode(&err)
	m.AppendArgs(nil)
	return nil
}

// MethodName returns the spec's name of a method this package decodes, such
// as "basic.deliver", or "class C method M" for any other.
func MethodName(class, method uint16) string {
	if _, name := newMethod(class, method); name != "" {
		return name
	}
	return fmt.Sprintf("class %d method %d", class, method)
}

func newMethod(class, method uint16) (methodCodec, string) {
	switch Key(class, method) {
	case KeyConnectionStartOk:
		return new(ConnectionStartOk), "connection.start-ok"
	case KeyConnectionOpen:
		return new(ConnectionOpen), "connection.open"
	case KeyConnectionTune:
		return new(ConnectionTune), "connection.tune"
	case KeyConnectionTuneOk:
		return new(ConnectionTuneOk), "connection.tune-ok"
	case KeyConnectionClose:
		return new(ConnectionClose), "connection.close"
	case KeyConnectionCloseOk:
		return new(ConnectionCloseOk), "connection.close-ok"
	case KeyConnectionBlocked:
		return new(ConnectionBlocked), "connection.blocked"
	case KeyConnectionUnblocked:
		return new(ConnectionUnblocked), "connection.unblocked"

	case KeyChannelOpen:
		return new(ChannelOpen), "channel.open"
	case KeyChannelOpenOk:
		return new(ChannelOpenOk), "channel.open-ok"
	case KeyChannelFlow:
		return new(ChannelFlow), "channel.flow"
	case KeyChannelFlowOk:
		return new(ChannelFlowOk), "channel.flow-ok"
	case KeyChannelClose:
		return new(ChannelClose), "channel.close"
	case KeyChannelCloseOk:
		return new(ChannelCloseOk), "channel.close-ok"

	case KeyQueueDeclare:
		return new(QueueDeclare), "queue.declare"
	case KeyQueueDeclareOk:
		return new(QueueDeclareOk), "queue.declare-ok"
	case KeyBasicQos:
		return new(BasicQos), "basic.qos"
	case KeyBasicQosOk:
		return new(BasicQosOk), "basic.qos-ok"
	case KeyBasicConsume:
		return new(BasicConsume), "basic.consume"
	case KeyBasicConsumeOk:
		return new(BasicConsumeOk), "basic.consume-ok"
	case KeyBasicCancel:
		return new(BasicCancel), "basic.cancel"
	case KeyBasicCancelOk:
		return new(BasicCancelOk), "basic.cancel-ok"
	case KeyBasicPublish:
		return new(BasicPublish), "basic.publish"
	case KeyBasicReturn:
		return new(BasicReturn), "basic.return"
	case KeyBasicDeliver:
		return new(BasicDeliver), "basic.deliver"
	case KeyBasicGet:
		return new(BasicGet), "basic.get"
	case KeyBasicGetOk:
		return new(BasicGetOk), "basic.get-ok"
	case KeyBasicGetEmpty:
		return new(BasicGetEmpty), "basic.get-empty"
	case KeyBasicAck:
		return new(BasicAck), "basic.ack"
	case KeyBasicReject:
		return new(BasicReject), "basic.reject"
	case KeyBasicRecoverAsync:
		return new(BasicRecoverAsync), "basic.recover-async"
	case KeyBasicRecover:
		return new(BasicRecover), "basic.recover"
	case KeyBasicRecoverOk:
		return new(BasicRecoverOk), "basic.recover-ok"
	case KeyBasicNack:
		return new(BasicNack), "basic.nack"

	case KeyConfirmSelect:
		return new(ConfirmSelect), "confirm.select"
	case KeyConfirmSelectOk:
		return new(ConfirmSelectOk), "confirm.select-ok"
	}
	return nil, ""
}
