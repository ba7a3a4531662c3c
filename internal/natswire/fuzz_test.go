package natswire

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	fuzzMaxPayload = 64
	fuzzMaxLine    = 96
)

type parseResult struct {
	Msgs     []gotMsg
	Err      string
	Buffered int
}

func parseAll(chunks [][]byte) parseResult {
	p := NewParser(fuzzMaxPayload)
	p.SetMaxControlLine(fuzzMaxLine)
	var r parseResult
	for _, c := range chunks {
		if err := p.Parse(c, collect(&r.Msgs)); err != nil {
			r.Err = err.Error()
			break
		}
	}
	r.Buffered = p.Buffered()
	return r
}

// FuzzParser checks that splitting the input at fuzz-chosen points gives
// the same messages and the same error as parsing it in one call, that
// every accepted message is within the limits, and that the messages and
// the buffered rest add up to the input. Each byte of cuts is the length of
// the next chunk; the rest of data is the last chunk.
func FuzzParser(f *testing.F) {
	f.Add([]byte("INFO {}\r\nMSG a 1 r 3\r\nabc\r\nPING\r\n"), []byte{3, 9, 1})
	f.Add([]byte("HMSG s 1 $JS.ACK.S.C.1.2.3.4.0 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"), []byte{20, 20})
	f.Add([]byte("HPUB s 12 12\r\nNATS/1.0\r\n\r\n\r\nSUB a q 1\r\nUNSUB 1 2\r\n"), []byte{0, 1})
	f.Add([]byte("PUB a 65\r\n"), []byte{4})
	f.Add([]byte("-ERR 'x'\r\n+OK\r\nPONG\n"), []byte{2})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		want := parseAll([][]byte{data})
		var chunks [][]byte
		rest := data
		for _, c := range cuts {
			n := min(int(c), len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		chunks = append(chunks, rest)
		got := parseAll(chunks)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("split parse differs from one-call parse (-want +got):\n%s", diff)
		}
		total := 0
		for _, m := range want.Msgs {
			total += len(m.Raw)
			if len(m.Header)+len(m.Body) > fuzzMaxPayload {
				t.Errorf("accepted a payload of %d bytes", len(m.Header)+len(m.Body))
			}
			if m.Op.HasPayload() && !bytes.HasSuffix([]byte(m.Raw), []byte("\r\n")) {
				t.Errorf("accepted a message without its CRLF: %q", m.Raw)
			}
		}
		if want.Err == "" && total+want.Buffered != len(data) {
			t.Errorf("messages (%d bytes) and Buffered (%d) do not add up to the input (%d)", total, want.Buffered, len(data))
		}
		if want.Buffered > fuzzMaxLine+fuzzMaxPayload+2 {
			t.Errorf("buffered %d bytes, more than a line and a payload", want.Buffered)
		}
		// What parsed re-encodes to bytes that parse the same.
		if want.Err == "" {
			for _, m := range want.Msgs {
				var enc []byte
				switch m.Op {
				case OpMsg, OpHMsg:
					enc = AppendMsg(nil, []byte(m.Subject), []byte(m.SID), []byte(m.Reply), []byte(m.Header), []byte(m.Body))
				case OpPub, OpHPub:
					enc = AppendPub(nil, []byte(m.Subject), []byte(m.Reply), []byte(m.Header), []byte(m.Body))
				default:
					continue
				}
				if m.Header == "" && (m.Op == OpHMsg || m.Op == OpHPub) {
					continue // an HMSG with a zero-length header block re-encodes as MSG
				}
				var again []gotMsg
				if err := NewParser(fuzzMaxPayload).Parse(enc, collect(&again)); err != nil || len(again) != 1 {
					t.Fatalf("re-encoded %q: %v, %d messages", enc, err, len(again))
				}
				again[0].Raw, m.Raw = "", ""
				if diff := cmp.Diff(m, again[0]); diff != "" {
					t.Errorf("re-encoded message differs (-want +got):\n%s", diff)
				}
			}
		}
	})
}

// FuzzParseJSAck checks that any subject either is refused or yields a
// stream and consumer that are tokens of it, with a stream sequence and a
// delivery count of at least 1.
func FuzzParseJSAck(f *testing.F) {
	f.Add([]byte("$JS.ACK.ORDERS.proc.2.17.5.1700000000000000000.3"))
	f.Add([]byte("$JS.ACK.hub.ACC.ORDERS.proc.1.9.9.1700000000000000000.0.r"))
	f.Add([]byte("$JS.ACK.S.C.1.0.3.4.5"))
	f.Add([]byte("$JS.ACK..........."))
	f.Fuzz(func(t *testing.T, subject []byte) {
		a, ok := ParseJSAck(subject)
		if !ok {
			return
		}
		if a.StreamSeq == 0 || a.Delivered == 0 || len(a.Stream) == 0 || len(a.Consumer) == 0 {
			t.Fatalf("accepted %q as %+v", subject, a)
		}
		for _, tok := range [][]byte{a.Stream, a.Consumer} {
			if bytes.IndexByte(tok, '.') >= 0 || !bytes.Contains(subject, tok) {
				t.Fatalf("token %q is not a token of %q", tok, subject)
			}
		}
	})
}

// FuzzParseUint64 checks ParseJSAck's number parser against
// strconv.ParseUint in base 10: the same numbers accepted, the same values.
func FuzzParseUint64(f *testing.F) {
	for _, s := range []string{"0", "1", "007", "18446744073709551615", "18446744073709551616", "99999999999999999999", "", "+1", "-1", "1_0", "12a", " 1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := parseUint64(b)
		want, err := strconv.ParseUint(string(b), 10, 64)
		if ok != (err == nil) || (ok && got != want) {
			t.Fatalf("parseUint64(%q) = %d, %v; strconv: %d, %v", b, got, ok, want, err)
		}
	})
}
