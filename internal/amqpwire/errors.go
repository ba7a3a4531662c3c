package amqpwire

import (
	"errors"
	"fmt"
	"strconv"
)

// AMQP 0-9-1 reply codes (spec section 1.9, "constants").
const (
	ReplySuccess       uint16 = 200
	ContentTooLarge    uint16 = 311
	NoRoute            uint16 = 312
	NoConsumers        uint16 = 313
	ConnectionForced   uint16 = 320
	InvalidPath        uint16 = 402
	AccessRefused      uint16 = 403
	NotFound           uint16 = 404
	ResourceLocked     uint16 = 405
	PreconditionFailed uint16 = 406
	FrameError         uint16 = 501
	SyntaxError        uint16 = 502
	CommandInvalid     uint16 = 503
	ChannelError       uint16 = 504
	UnexpectedFrame    uint16 = 505
	ResourceError      uint16 = 506
	NotAllowed         uint16 = 530
	NotImplemented     uint16 = 540
	InternalError      uint16 = 541
)

// ReplyName returns the spec's name of a reply code, such as "FRAME_ERROR",
// or the number for codes the spec does not define.
func ReplyName(code uint16) string {
	switch code {
	case ReplySuccess:
		return "REPLY_SUCCESS"
	case ContentTooLarge:
		return "CONTENT_TOO_LARGE"
	case NoRoute:
		return "NO_ROUTE"
	case NoConsumers:
		return "NO_CONSUMERS"
	case ConnectionForced:
		return "CONNECTION_FORCED"
	case InvalidPath:
		return "INVALID_PATH"
	case AccessRefused:
		return "ACCESS_REFUSED"
	case NotFound:
		return "NOT_FOUND"
	case ResourceLocked:
		return "RESOURCE_LOCKED"
	case PreconditionFailed:
		return "PRECONDITION_FAILED"
	case FrameError:
		return "FRAME_ERROR"
	case SyntaxError:
		return "SYNTAX_ERROR"
	case CommandInvalid:
		return "COMMAND_INVALID"
	case ChannelError:
		return "CHANNEL_ERROR"
	case UnexpectedFrame:
		return "UNEXPECTED_FRAME"
	case ResourceError:
		return "RESOURCE_ERROR"
	case NotAllowed:
		return "NOT_ALLOWED"
	case NotImplemented:
		return "NOT_IMPLEMENTED"
	case InternalError:
		return "INTERNAL_ERROR"
	}
	return strconv.Itoa(int(code))
}

// Error is a protocol error: Code is the AMQP reply code the connection (or
// channel) is to be closed with, Text says what failed. Text fits a
// connection.close reply-text (a shortstr) only if the caller truncates it to
// 255 bytes.
type Error struct {
	Code uint16
	Text string
}

func (e *Error) Error() string {
	return "amqpwire: " + ReplyName(e.Code) + " (" + strconv.Itoa(int(e.Code)) + "): " + e.Text
}

// ErrUnsupportedMethod is wrapped by DecodeMethod's error for a (class,
// method) pair it does not decode. It is not a protocol error: the proxy
// passes such methods through raw.
var ErrUnsupportedMethod = errors.New("amqpwire: method not supported by the decoder")

// ErrInvalidValue is wrapped by encoding errors: a value that cannot be put
// on the wire, such as a shortstr longer than 255 bytes, a field-table value
// of a Go type without a field-value type, or tables nested deeper than
// MaxNesting. Fix the value; no frame was written.
var ErrInvalidValue = errors.New("amqpwire: value cannot be encoded")

func frameErrorf(format string, args ...any) *Error {
	return &Error{Code: FrameError, Text: fmt.Sprintf(format, args...)}
}

// encodePanic carries an encoding error out of the append functions, which
// have no error result. Validate, ValidateMethod and AppendTable recover it.
type encodePanic struct{ err error }

func (p encodePanic) Error() string { return p.err.Error() }

func invalidValue(format string, args ...any) {
	panic(encodePanic{fmt.Errorf("%w: "+format, append([]any{ErrInvalidValue}, args...)...)})
}

// catchEncode turns an encodePanic into *err and re-panics anything else.
func catchEncode(err *error) {
	if r := recover(); r != nil {
		ep, ok := r.(encodePanic)
		if !ok {
			panic(r)
		}
		*err = ep.err
	}
}
