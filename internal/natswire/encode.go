package natswire

import "strconv"

// The encoders below append one protocol message to dst and return the
// extended slice. They write what they are given: the caller makes sure
// subjects, reply subjects and sids hold no whitespace (they come from
// messages that were parsed, or from the proxy's own names). Header, when
// not empty, is a complete NATS header block ("NATS/1.0\r\n...\r\n\r\n").

// AppendMsg appends a MSG, or an HMSG when header is not empty.
func AppendMsg(dst, subject, sid, reply, header, body []byte) []byte {
	if len(header) > 0 {
		dst = append(dst, "HMSG "...)
	} else {
		dst = append(dst, "MSG "...)
	}
	dst = append(dst, subject...)
	dst = append(dst, ' ')
	dst = append(dst, sid...)
	dst = append(dst, ' ')
	if len(reply) > 0 {
		dst = append(dst, reply...)
		dst = append(dst, ' ')
	}
	return appendPayload(dst, header, body)
}

// AppendPub appends a PUB, or an HPUB when header is not empty.
func AppendPub(dst, subject, reply, header, body []byte) []byte {
	if len(header) > 0 {
		dst = append(dst, "HPUB "...)
	} else {
		dst = append(dst, "PUB "...)
	}
	dst = append(dst, subject...)
	dst = append(dst, ' ')
	if len(reply) > 0 {
		dst = append(dst, reply...)
		dst = append(dst, ' ')
	}
	return appendPayload(dst, header, body)
}

func appendPayload(dst, header, body []byte) []byte {
	if len(header) > 0 {
		dst = strconv.AppendInt(dst, int64(len(header)), 10)
		dst = append(dst, ' ')
	}
	dst = strconv.AppendInt(dst, int64(len(header)+len(body)), 10)
	dst = append(dst, "\r\n"...)
	dst = append(dst, header...)
	dst = append(dst, body...)
	return append(dst, "\r\n"...)
}

// AppendSub appends a SUB; queue may be empty.
func AppendSub(dst, subject, queue, sid []byte) []byte {
	dst = append(dst, "SUB "...)
	dst = append(dst, subject...)
	dst = append(dst, ' ')
	if len(queue) > 0 {
		dst = append(dst, queue...)
		dst = append(dst, ' ')
	}
	dst = append(dst, sid...)
	return append(dst, "\r\n"...)
}

// AppendUnsub appends an UNSUB; max < 0 leaves the limit out.
func AppendUnsub(dst, sid []byte, max int) []byte {
	dst = append(dst, "UNSUB "...)
	dst = append(dst, sid...)
	if max >= 0 {
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, int64(max), 10)
	}
	return append(dst, "\r\n"...)
}

// AppendPing appends a PING.
func AppendPing(dst []byte) []byte { return append(dst, "PING\r\n"...) }

// AppendPong appends a PONG.
func AppendPong(dst []byte) []byte { return append(dst, "PONG\r\n"...) }

// AppendOK appends a +OK.
func AppendOK(dst []byte) []byte { return append(dst, "+OK\r\n"...) }

// AppendErr appends a -ERR with text in single quotes; quotes and line
// breaks in text are replaced so that the line stays one line.
func AppendErr(dst []byte, text string) []byte {
	dst = append(dst, "-ERR '"...)
	for i := range len(text) {
		c := text[i]
		if c == '\'' || c == '\r' || c == '\n' {
			c = ' '
		}
		dst = append(dst, c)
	}
	return append(dst, "'\r\n"...)
}

// AppendInfo appends an INFO line carrying the JSON object info.
func AppendInfo(dst, info []byte) []byte {
	dst = append(dst, "INFO "...)
	dst = append(dst, info...)
	return append(dst, "\r\n"...)
}
