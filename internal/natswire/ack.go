package natswire

import (
	"bytes"
	"math"
)

// AckPrefix starts every JetStream ack reply subject.
const AckPrefix = "$JS.ACK."

// JSAck is what a JetStream delivery's reply subject says about it. The
// server sends one of two layouts:
//
//	v1 (9 tokens):   $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
//	v2 (12+ tokens): $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>.<token>...
//
// Stream and Consumer alias the subject they were parsed from.
type JSAck struct {
	Stream, Consumer []byte
	Delivered        uint64 // delivery count: above 1 for a redelivery
	StreamSeq        uint64
	ConsumerSeq      uint64
	Timestamp        uint64 // when the server delivered it, Unix nanoseconds
	Pending          uint64
}

// ParseJSAck parses a JetStream ack reply subject. ok is false for any
// subject that is not one (such as a flow-control or heartbeat reply, or a
// plain inbox), so the caller treats the message as core NATS.
func ParseJSAck(subject []byte) (a JSAck, ok bool) {
	if !bytes.HasPrefix(subject, []byte(AckPrefix)) {
		return JSAck{}, false
	}
	var tok [16][]byte
	n := 0
	rest := subject
	for len(rest) > 0 {
		if n == len(tok) {
			return JSAck{}, false
		}
		i := bytes.IndexByte(rest, '.')
		if i < 0 {
			tok[n] = rest
			n++
			break
		}
		tok[n] = rest[:i]
		n++
		rest = rest[i+1:]
	}
	var base int
	switch {
	case n == 9:
		base = 2
	case n >= 12:
		base = 4
	default:
		return JSAck{}, false
	}
	a.Stream, a.Consumer = tok[base], tok[base+1]
	if len(a.Stream) == 0 || len(a.Consumer) == 0 {
		return JSAck{}, false
	}
	nums := [...]*uint64{&a.Delivered, &a.StreamSeq, &a.ConsumerSeq, &a.Timestamp, &a.Pending}
	for i, p := range nums {
		v, ok := parseUint64(tok[base+2+i])
		if !ok {
			return JSAck{}, false
		}
		*p = v
	}
	if a.StreamSeq == 0 || a.Delivered == 0 {
		return JSAck{}, false
	}
	return a, true
}

// parseUint64 parses b as a decimal number: digits only, as
// strconv.ParseUint(b, 10, 64) takes them, failing on overflow. It is
// ParseJSAck's, called five times per delivery, where strconv's general
// parser was a third of the ack subject's parse.
func parseUint64(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		d := uint64(c - '0')
		if d > 9 || v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// The bodies an app publishes to a delivery's ack subject.
var (
	AckAck      = []byte("+ACK")
	AckNak      = []byte("-NAK")
	AckProgress = []byte("+WPI")
	AckTerm     = []byte("+TERM")
	AckNext     = []byte("+NXT")
)

// IsAckBody reports whether body is one of the JetStream acknowledgement
// bodies (+ACK, -NAK, +WPI, +TERM, +NXT), possibly with arguments such as
// "-NAK {"delay":...}" or "+TERM reason". An empty body is an ack, too.
func IsAckBody(body []byte) bool {
	if len(body) == 0 {
		return true
	}
	for _, k := range [...][]byte{AckAck, AckNak, AckProgress, AckTerm, AckNext} {
		if bytes.HasPrefix(body, k) && (len(body) == len(k) || body[len(k)] == ' ') {
			return true
		}
	}
	return false
}
