package natswire

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// gotMsg is a Msg with its slices copied to strings, for comparing.
type gotMsg struct {
	Op                                    Op
	Raw, Args, Subject, Reply, SID, Queue string
	Header, Body                          string
	Max                                   int
}

func collect(out *[]gotMsg) func(*Msg) error {
	return func(m *Msg) error {
		*out = append(*out, gotMsg{m.Op, string(m.Raw), string(m.Args), string(m.Subject), string(m.Reply),
			string(m.SID), string(m.Queue), string(m.Header), string(m.Body), m.Max})
		return nil
	}
}

func TestParse(t *testing.T) {
	hdr := "NATS/1.0\r\nA: b\r\n\r\n"
	tests := map[string]struct {
		in      string
		want    []gotMsg
		wantErr string
	}{
		"info": {
			in:   "INFO {\"max_payload\":1024}\r\n",
			want: []gotMsg{{Op: OpInfo, Raw: "INFO {\"max_payload\":1024}\r\n", Args: "{\"max_payload\":1024}", Max: -1}},
		},
		"ping pong ok err": {
			in: "PING\r\nPONG\r\n+OK\r\n-ERR 'Unknown Protocol Operation'\r\n",
			want: []gotMsg{
				{Op: OpPing, Raw: "PING\r\n", Max: -1},
				{Op: OpPong, Raw: "PONG\r\n", Max: -1},
				{Op: OpOK, Raw: "+OK\r\n", Max: -1},
				{Op: OpErr, Raw: "-ERR 'Unknown Protocol Operation'\r\n", Args: "'Unknown Protocol Operation'", Max: -1},
			},
		},
		"lower case and tabs": {
			in:   "pub\tfoo  5\r\nhello\r\n",
			want: []gotMsg{{Op: OpPub, Raw: "pub\tfoo  5\r\nhello\r\n", Subject: "foo", Body: "hello", Max: -1}},
		},
		"msg with reply": {
			in:   "MSG foo.bar 9 _INBOX.x 3\r\nabc\r\n",
			want: []gotMsg{{Op: OpMsg, Raw: "MSG foo.bar 9 _INBOX.x 3\r\nabc\r\n", Subject: "foo.bar", SID: "9", Reply: "_INBOX.x", Body: "abc", Max: -1}},
		},
		"hmsg": {
			in: "HMSG s 1 r 18 21\r\n" + hdr + "xyz\r\n",
			want: []gotMsg{{Op: OpHMsg, Raw: "HMSG s 1 r 18 21\r\n" + hdr + "xyz\r\n", Subject: "s", SID: "1", Reply: "r",
				Header: hdr, Body: "xyz", Max: -1}},
		},
		"hpub without reply, empty body": {
			in:   "HPUB s 18 18\r\n" + hdr + "\r\n",
			want: []gotMsg{{Op: OpHPub, Raw: "HPUB s 18 18\r\n" + hdr + "\r\n", Subject: "s", Header: hdr, Max: -1}},
		},
		"sub unsub": {
			in: "SUB foo 1\r\nSUB foo q 2\r\nUNSUB 1\r\nUNSUB 2 10\r\n",
			want: []gotMsg{
				{Op: OpSub, Raw: "SUB foo 1\r\n", Subject: "foo", SID: "1", Max: -1},
				{Op: OpSub, Raw: "SUB foo q 2\r\n", Subject: "foo", Queue: "q", SID: "2", Max: -1},
				{Op: OpUnsub, Raw: "UNSUB 1\r\n", SID: "1", Max: -1},
				{Op: OpUnsub, Raw: "UNSUB 2 10\r\n", SID: "2", Max: 10},
			},
		},
		"connect": {
			in:   "CONNECT {\"verbose\":false}\r\n",
			want: []gotMsg{{Op: OpConnect, Raw: "CONNECT {\"verbose\":false}\r\n", Args: "{\"verbose\":false}", Max: -1}},
		},
		"bare newline": {
			in:   "PING\n",
			want: []gotMsg{{Op: OpPing, Raw: "PING\n", Max: -1}},
		},
		"unknown op":           {in: "FOO bar\r\n", wantErr: "unknown operation"},
		"payload over limit":   {in: "PUB foo 1025\r\n", wantErr: "exceeds max_payload 1024"},
		"header over total":    {in: "HPUB foo 10 5\r\n", wantErr: "header size 10 exceeds total size 5"},
		"bad size":             {in: "PUB foo -1\r\n", wantErr: "bad size"},
		"no crlf after body":   {in: "PUB foo 2\r\nabcd", wantErr: "not followed by CRLF"},
		"too many pub args":    {in: "PUB a b c 1\r\nx\r\n", wantErr: "4 arguments"},
		"sub missing sid":      {in: "SUB foo\r\n", wantErr: "1 arguments"},
		"huge size digits":     {in: "PUB foo 99999999999\r\n", wantErr: "bad size"},
		"overlong line":        {in: "INFO " + strings.Repeat("x", 200) + "\r\n", wantErr: "control line"},
		"overlong, no newline": {in: "INFO " + strings.Repeat("x", 200), wantErr: "control line"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, split := range []int{0, 1, 3, 7} {
				p := NewParser(1024)
				p.SetMaxControlLine(128)
				var got []gotMsg
				var err error
				in := []byte(tc.in)
				if split > 0 {
					for len(in) > 0 && err == nil {
						n := min(split, len(in))
						err = p.Parse(in[:n], collect(&got))
						in = in[n:]
					}
				} else {
					err = p.Parse(in, collect(&got))
				}
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrProtocol) {
						t.Fatalf("split %d: error %v, want one containing %q", split, err, tc.wantErr)
					}
					if err2 := p.Parse([]byte("PING\r\n"), collect(&got)); err2 != err {
						t.Fatalf("split %d: parse after error = %v, want the same error", split, err2)
					}
					continue
				}
				if err != nil {
					t.Fatalf("split %d: %v", split, err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("split %d (-want +got):\n%s", split, diff)
				}
				if p.Buffered() != 0 {
					t.Errorf("split %d: %d bytes left buffered", split, p.Buffered())
				}
			}
		})
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	hdr := []byte("NATS/1.0\r\nNats-Msg-Id: 1\r\n\r\n")
	var b []byte
	b = AppendMsg(b, []byte("s.1"), []byte("7"), []byte("$JS.ACK.S.C.1.2.3.4.0"), nil, []byte("body"))
	b = AppendMsg(b, []byte("s.2"), []byte("8"), nil, hdr, []byte("b2"))
	b = AppendPub(b, []byte("p"), []byte("_INBOX.1"), nil, nil)
	b = AppendPub(b, []byte("p"), nil, hdr, []byte("x"))
	b = AppendSub(b, []byte("s.>"), []byte("q"), []byte("3"))
	b = AppendUnsub(b, []byte("3"), 5)
	b = AppendUnsub(b, []byte("3"), -1)
	b = AppendPing(b)
	b = AppendPong(b)
	b = AppendOK(b)
	b = AppendErr(b, "it's\r\nbad")
	b = AppendInfo(b, []byte(`{"a":1}`))
	var got []gotMsg
	if err := NewParser(0).Parse(b, collect(&got)); err != nil {
		t.Fatal(err)
	}
	var ops []Op
	for _, m := range got {
		ops = append(ops, m.Op)
	}
	want := []Op{OpMsg, OpHMsg, OpPub, OpHPub, OpSub, OpUnsub, OpUnsub, OpPing, OpPong, OpOK, OpErr, OpInfo}
	if diff := cmp.Diff(want, ops); diff != "" {
		t.Fatalf("ops (-want +got):\n%s", diff)
	}
	if got[0].Reply != "$JS.ACK.S.C.1.2.3.4.0" || got[0].Body != "body" || got[1].Header != string(hdr) || got[1].Body != "b2" {
		t.Errorf("messages did not round-trip: %+v", got[:2])
	}
	if got[5].Max != 5 || got[6].Max != -1 || got[10].Args != "'it s  bad'" {
		t.Errorf("unsub max or err text: %+v %+v %+v", got[5], got[6], got[10])
	}
}

func TestStripClusterURLs(t *testing.T) {
	in := []byte(`{"server_id":"x","connect_urls":["10.0.0.1:4222"],"ws_connect_urls":["a"],"max_payload":1048576}`)
	out, changed, err := StripClusterURLs(in)
	if err != nil || !changed {
		t.Fatalf("changed=%v err=%v", changed, err)
	}
	if want := `{"max_payload":1048576,"server_id":"x"}`; string(out) != want {
		t.Errorf("got %s, want %s", out, want)
	}
	plain := []byte(`{"server_id":"x", "max_payload":5}`)
	out, changed, err = StripClusterURLs(plain)
	if err != nil || changed || &out[0] != &plain[0] {
		t.Errorf("an INFO without cluster URLs must pass as is: changed=%v err=%v", changed, err)
	}
	if _, _, err := StripClusterURLs([]byte(`{"a":`)); err == nil {
		t.Error("bad JSON: no error")
	}
	i, err := ParseInfo(in)
	if err != nil || i.MaxPayload != 1048576 {
		t.Errorf("ParseInfo = %+v, %v", i, err)
	}
}

func TestParseJSAck(t *testing.T) {
	tests := map[string]struct {
		subject string
		want    JSAck
		wantOK  bool
	}{
		"v1":              {"$JS.ACK.ORDERS.proc.2.17.5.1700000000000000000.3", JSAck{[]byte("ORDERS"), []byte("proc"), 2, 17, 5, 1700000000000000000, 3}, true},
		"v2":              {"$JS.ACK.hub.ACCHASH.ORDERS.proc.1.9.9.1700000000000000000.0.rand", JSAck{[]byte("ORDERS"), []byte("proc"), 1, 9, 9, 1700000000000000000, 0}, true},
		"inbox":           {"_INBOX.abc.def", JSAck{}, false},
		"fc reply":        {"$JS.FC.ORDERS.x.y", JSAck{}, false},
		"short":           {"$JS.ACK.S.C.1.2", JSAck{}, false},
		"not a number":    {"$JS.ACK.S.C.x.2.3.4.5", JSAck{}, false},
		"zero stream seq": {"$JS.ACK.S.C.1.0.3.4.5", JSAck{}, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := ParseJSAck([]byte(tc.subject))
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestIsAckBody(t *testing.T) {
	for body, want := range map[string]bool{
		"": true, "+ACK": true, "-NAK": true, `-NAK {"delay":100}`: true, "+WPI": true, "+TERM": true,
		"+TERM because": true, "+NXT": true, "+ACKX": false, "hello": false,
	} {
		if got := IsAckBody([]byte(body)); got != want {
			t.Errorf("IsAckBody(%q) = %v, want %v", body, got, want)
		}
	}
}
