package natswire

import (
	"bytes"
	"errors"
	"fmt"
)

// Op is a protocol message's operation.
type Op uint8

// The operations of the NATS client protocol.
const (
	OpInfo    Op = iota + 1 // INFO {json}              server to client
	OpConnect               // CONNECT {json}           client to server
	OpPub                   // PUB subj [reply] n       client to server
	OpHPub                  // HPUB subj [reply] h n    client to server
	OpSub                   // SUB subj [queue] sid     client to server
	OpUnsub                 // UNSUB sid [max]          client to server
	OpMsg                   // MSG subj sid [reply] n   server to client
	OpHMsg                  // HMSG subj sid [reply] h n server to client
	OpPing                  // PING                     both ways
	OpPong                  // PONG                     both ways
	OpOK                    // +OK                      server to client
	OpErr                   // -ERR 'text'              server to client
)

var opNames = [...]string{"", "INFO", "CONNECT", "PUB", "HPUB", "SUB", "UNSUB", "MSG", "HMSG", "PING", "PONG", "+OK", "-ERR"}

func (o Op) String() string {
	if int(o) < len(opNames) && o != 0 {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// HasPayload reports whether messages of op carry a payload after their
// control line.
func (o Op) HasPayload() bool { return o == OpPub || o == OpHPub || o == OpMsg || o == OpHMsg }

// Msg is one protocol message. Which fields are set depends on Op:
//
//	INFO, CONNECT, -ERR   Args (the rest of the line: JSON, or the quoted error)
//	PUB, HPUB             Subject, Reply, Header (HPUB), Body
//	MSG, HMSG             Subject, SID, Reply, Header (HMSG), Body
//	SUB                   Subject, Queue, SID
//	UNSUB                 SID, Max (-1 when absent)
//
// Wire layout of a message with a payload (HMSG shown; HPUB has no sid, MSG
// and PUB no header size and no header block):
//
//	HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>\r\n
//	NATS/1.0\r\n<key>: <value>\r\n...\r\n   (#header bytes)
//	<body>                                  (#total - #header bytes)
//	\r\n
//
// Raw is the whole message as it was on the wire, control line, payload and
// the final CRLF included. See the package doc for how long it is valid.
type Msg struct {
	Op      Op
	Raw     []byte
	Args    []byte
	Subject []byte
	Reply   []byte
	SID     []byte
	Queue   []byte
	Header  []byte
	Body    []byte
	Max     int
}

// Error is a protocol violation. The proxy closes the connection on one.
type Error struct{ Msg string }

func (e *Error) Error() string { return "nats protocol: " + e.Msg }

// ErrProtocol is matched by every *Error with errors.Is.
var ErrProtocol = errors.New("nats protocol error")

// Is makes errors.Is(err, ErrProtocol) true for every *Error.
func (e *Error) Is(target error) bool { return target == ErrProtocol }

func protoErrorf(format string, args ...any) error {
	return &Error{Msg: fmt.Sprintf(format, args...)}
}

// Default limits. DefaultMaxPayload is a NATS server's default max_payload;
// DefaultMaxControlLine is larger than the server's own 4 KiB default for
// client lines, because INFO and CONNECT (with a JWT) may be longer.
const (
	DefaultMaxPayload     = 1 << 20
	DefaultMaxControlLine = 64 << 10
	// HardMaxPayload is the largest max_payload a NATS server accepts (64 MiB).
	HardMaxPayload = 64 << 20
)

// parserState says what the Parser expects next from the stream.
type parserState uint8

const (
	// stateOpStart: at a message boundary, nothing buffered. A message that
	// lies wholly in the input is delivered without copying.
	stateOpStart parserState = iota
	// stateLine: buf holds part of a control line, no '\n' yet.
	stateLine
	// statePayload: buf holds a complete, checked control line and part of
	// the payload; the message is need bytes long in total.
	statePayload
	// stateFailed: the stream was invalid or the callback failed.
	stateFailed
)

// keepBufCap is the largest assembly buffer kept between messages.
const keepBufCap = 256 << 10

// Parser cuts a NATS protocol byte stream (either direction) into messages.
// Messages lying wholly inside one chunk alias that chunk; only a message
// split across chunks is assembled in an internal buffer, which grows with
// the bytes received, never ahead of them.
//
// A Parser is not safe for concurrent use. After Parse returns an error the
// Parser is unusable: every later call returns the same error.
type Parser struct {
	state      parserState
	maxPayload int
	maxLine    int
	need       int // statePayload: total message size
	hlen       int // header size of the message whose line was parsed last
	buf        []byte
	msg        Msg // the message being delivered (reused: no allocation per message)
	err        error
}

// NewParser returns a Parser that accepts payloads of at most maxPayload
// bytes (headers and body; 0 means DefaultMaxPayload, and values above
// HardMaxPayload are lowered to it) and control lines of at most
// DefaultMaxControlLine bytes.
func NewParser(maxPayload int) *Parser {
	p := &Parser{maxLine: DefaultMaxControlLine}
	p.SetMaxPayload(maxPayload)
	return p
}

// SetMaxPayload changes the payload limit, as after the server's INFO
// announced its max_payload, with NewParser's rules. It applies to messages
// whose control line is not yet complete.
func (p *Parser) SetMaxPayload(n int) {
	switch {
	case n <= 0:
		n = DefaultMaxPayload
	case n > HardMaxPayload:
		n = HardMaxPayload
	}
	p.maxPayload = n
}

// SetMaxControlLine changes the control line limit (n > 0).
func (p *Parser) SetMaxControlLine(n int) {
	if n > 0 {
		p.maxLine = n
	}
}

// MaxPayload returns the payload limit in force.
func (p *Parser) MaxPayload() int { return p.maxPayload }

// Buffered reports how many bytes of an incomplete message the Parser holds.
func (p *Parser) Buffered() int { return len(p.buf) }

// Parse consumes all of data, calling fn for each complete message in
// order. The *Msg passed to fn, and everything it points to, is valid only
// until fn returns. An error returned by fn stops parsing and is returned as
// is; after any error the Parser is unusable.
//
// At a message boundary (stateOpStart), a message that lies wholly in data
// is delivered in place; the rest of data is buffered. A message split
// across calls is completed by continueLine and continuePayload.
func (p *Parser) Parse(data []byte, fn func(*Msg) error) error {
	if p.state == stateFailed {
		return p.err
	}
	for len(data) > 0 {
		switch p.state {
		case stateOpStart:
			nl := bytes.IndexByte(data, '\n')
			if nl < 0 {
				if len(data) > p.maxLine {
					return p.fail(protoErrorf("control line longer than %d bytes", p.maxLine))
				}
				p.buf = append(p.buf[:0], data...)
				p.state = stateLine
				return nil
			}
			if nl+1 > p.maxLine {
				return p.fail(protoErrorf("control line longer than %d bytes", p.maxLine))
			}
			size, err := p.parseLine(data[:nl+1])
			if err != nil {
				return p.fail(err)
			}
			if len(data) < size {
				p.buf = append(p.buf[:0], data...)
				p.need = size
				p.state = statePayload
				return nil
			}
			if err := p.deliver(data[:size], nl+1, fn); err != nil {
				return err
			}
			data = data[size:]
		case stateLine:
			var err error
			if data, err = p.continueLine(data, fn); err != nil {
				return err
			}
		case statePayload:
			var err error
			if data, err = p.continuePayload(data, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// continueLine adds data, up to the end of the control line, to the part
// of the line in buf. Once the line is complete it delivers a message
// without payload, or moves on to statePayload. It returns what is left of
// data; an error has failed the Parser.
func (p *Parser) continueLine(data []byte, fn func(*Msg) error) ([]byte, error) {
	nl := bytes.IndexByte(data, '\n')
	take := len(data)
	if nl >= 0 {
		take = nl + 1
	}
	if len(p.buf)+take > p.maxLine {
		return nil, p.fail(protoErrorf("control line longer than %d bytes", p.maxLine))
	}
	p.buf = append(p.buf, data[:take]...)
	data = data[take:]
	if nl < 0 {
		return data, nil
	}
	lineLen := len(p.buf)
	size, err := p.parseLine(p.buf)
	if err != nil {
		return nil, p.fail(err)
	}
	if size == lineLen {
		if err := p.deliver(p.buf, lineLen, fn); err != nil {
			return nil, err
		}
		p.reset()
		return data, nil
	}
	p.need = size
	p.state = statePayload
	return data, nil
}

// continuePayload adds data, up to the end of the message, to the message
// in buf, and delivers it once it is complete. It returns what is left of
// data; an error has failed the Parser.
func (p *Parser) continuePayload(data []byte, fn func(*Msg) error) ([]byte, error) {
	n := min(p.need-len(p.buf), len(data))
	p.buf = append(p.buf, data[:n]...)
	data = data[n:]
	if len(p.buf) < p.need {
		return data, nil
	}
	lineLen := bytes.IndexByte(p.buf, '\n') + 1
	// The line was checked when it completed; parse it again to point
	// msg's fields into buf (its address may have changed).
	if _, err := p.parseLine(p.buf[:lineLen]); err != nil {
		return nil, p.fail(err)
	}
	if err := p.deliver(p.buf, lineLen, fn); err != nil {
		return nil, err
	}
	p.reset()
	return data, nil
}

// reset readies the Parser for the next message, keeping a buffer that
// is not too large.
func (p *Parser) reset() {
	p.state = stateOpStart
	if cap(p.buf) > keepBufCap {
		p.buf = nil
	} else {
		p.buf = p.buf[:0]
	}
}

// parseLine parses the control line (ending in '\n') into p.msg and returns
// the message's total size on the wire: the line alone, or the line plus
// the payload and its CRLF. It checks payload sizes against the limit
// before anything of the payload is looked at.
func (p *Parser) parseLine(line []byte) (int, error) {
	p.msg = Msg{Max: -1}
	m := &p.msg
	body := line[:len(line)-1]
	if n := len(body); n > 0 && body[n-1] == '\r' {
		body = body[:n-1]
	}
	opEnd := 0
	for opEnd < len(body) && body[opEnd] != ' ' && body[opEnd] != '\t' {
		opEnd++
	}
	op := body[:opEnd]
	rest := trimLeft(body[opEnd:])
	var err error
	switch {
	case eqFold(op, "MSG"):
		m.Op = OpMsg
	case eqFold(op, "HMSG"):
		m.Op = OpHMsg
	case eqFold(op, "PUB"):
		m.Op = OpPub
	case eqFold(op, "HPUB"):
		m.Op = OpHPub
	case eqFold(op, "SUB"):
		m.Op = OpSub
		err = parseSubArgs(m, rest)
	case eqFold(op, "UNSUB"):
		m.Op = OpUnsub
		err = parseUnsubArgs(m, rest)
	case eqFold(op, "PING"):
		m.Op = OpPing
	case eqFold(op, "PONG"):
		m.Op = OpPong
	case eqFold(op, "+OK"):
		m.Op = OpOK
	case eqFold(op, "-ERR"):
		m.Op, m.Args = OpErr, rest
	case eqFold(op, "INFO"):
		m.Op, m.Args = OpInfo, rest
	case eqFold(op, "CONNECT"):
		m.Op, m.Args = OpConnect, rest
	default:
		return 0, protoErrorf("unknown operation %q", truncate(op, 16))
	}
	if err != nil {
		return 0, err
	}
	if !m.Op.HasPayload() {
		return len(line), nil
	}
	total, err := p.parsePayloadArgs(rest)
	if err != nil {
		return 0, err
	}
	return len(line) + total + 2, nil
}

// parsePayloadArgs parses the arguments of a MSG, HMSG, PUB or HPUB line
// (p.msg.Op set) into p.msg and p.hlen, and returns the payload's size,
// checked against the limit and against the header's size:
//
//	MSG  <subject> <sid> [reply] <#total>
//	HMSG <subject> <sid> [reply] <#header> <#total>
//	PUB  <subject> [reply] <#total>
//	HPUB <subject> [reply] <#header> <#total>
func (p *Parser) parsePayloadArgs(rest []byte) (int, error) {
	m := &p.msg
	var args [6][]byte
	n := splitArgs(rest, args[:])
	hdr := m.Op == OpHMsg || m.Op == OpHPub
	hasSID := m.Op == OpMsg || m.Op == OpHMsg
	fixed := 2 // subject and total size
	if hdr {
		fixed++ // header size
	}
	if hasSID {
		fixed++
	}
	if n != fixed && n != fixed+1 {
		return 0, protoErrorf("%s: %d arguments, want %d or %d", m.Op, n, fixed, fixed+1)
	}
	i := 0
	m.Subject = args[i]
	i++
	if hasSID {
		m.SID = args[i]
		i++
	}
	if n == fixed+1 {
		m.Reply = args[i]
		i++
	}
	hlen := 0
	if hdr {
		h, ok := parseSize(args[i])
		if !ok {
			return 0, protoErrorf("%s: bad header size %q", m.Op, args[i])
		}
		hlen = h
		i++
	}
	total, ok := parseSize(args[i])
	if !ok {
		return 0, protoErrorf("%s: bad size %q", m.Op, args[i])
	}
	if total > p.maxPayload {
		return 0, protoErrorf("%s %s: payload of %d bytes exceeds max_payload %d", m.Op, m.Subject, total, p.maxPayload)
	}
	if hlen > total {
		return 0, protoErrorf("%s %s: header size %d exceeds total size %d", m.Op, m.Subject, hlen, total)
	}
	p.hlen = hlen
	return total, nil
}

// parseSubArgs parses SUB's arguments into m: <subject> [queue] <sid>.
func parseSubArgs(m *Msg, rest []byte) error {
	var args [6][]byte
	switch n := splitArgs(rest, args[:]); n {
	case 2:
		m.Subject, m.SID = args[0], args[1]
	case 3:
		m.Subject, m.Queue, m.SID = args[0], args[1], args[2]
	default:
		return protoErrorf("SUB: %d arguments, want 2 or 3", n)
	}
	return nil
}

// parseUnsubArgs parses UNSUB's arguments into m: <sid> [max].
func parseUnsubArgs(m *Msg, rest []byte) error {
	var args [6][]byte
	switch n := splitArgs(rest, args[:]); n {
	case 1:
		m.SID = args[0]
	case 2:
		m.SID = args[0]
		v, ok := parseSize(args[1])
		if !ok {
			return protoErrorf("UNSUB: bad max %q", args[1])
		}
		m.Max = v
	default:
		return protoErrorf("UNSUB: %d arguments, want 1 or 2", n)
	}
	return nil
}

// deliver fills in the payload fields of p.msg from raw (the whole message,
// lineLen bytes of control line), checks the trailing CRLF and calls fn.
func (p *Parser) deliver(raw []byte, lineLen int, fn func(*Msg) error) error {
	m := &p.msg
	m.Raw = raw
	if m.Op.HasPayload() {
		payload := raw[lineLen : len(raw)-2]
		if raw[len(raw)-2] != '\r' || raw[len(raw)-1] != '\n' {
			return p.fail(protoErrorf("%s %s: payload of %d bytes not followed by CRLF", m.Op, m.Subject, len(payload)))
		}
		hlen := p.hlen
		m.Header, m.Body = payload[:hlen:hlen], payload[hlen:]
		if hlen == 0 {
			m.Header = nil
		}
	}
	if err := fn(m); err != nil {
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

func trimLeft(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// splitArgs splits b at runs of spaces and tabs into args and returns how
// many there were; more than len(args) reports len(args)+1.
func splitArgs(b []byte, args [][]byte) int {
	n := 0
	for {
		b = trimLeft(b)
		if len(b) == 0 {
			return n
		}
		end := 0
		for end < len(b) && b[end] != ' ' && b[end] != '\t' {
			end++
		}
		if n == len(args) {
			return n + 1
		}
		args[n] = b[:end:end]
		n++
		b = b[end:]
	}
}

// parseSize parses a non-negative decimal of at most 9 digits (so below 1
// GB, above HardMaxPayload: the caller's limit check decides).
func parseSize(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// eqFold reports whether b equals the upper-case ASCII word s, ignoring case.
func eqFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
