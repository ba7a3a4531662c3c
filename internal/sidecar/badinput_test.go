package sidecar_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// readClose reads frames from r until a connection.close, and returns it.
func readClose(t *testing.T, c net.Conn) *amqpwire.ConnectionClose {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Errorf("read deadline: %v", err)
	}
	p := amqpwire.NewParser(0)
	br := bufio.NewReader(c)
	buf := make([]byte, 4096)
	var got *amqpwire.ConnectionClose
	for got == nil {
		n, err := br.Read(buf)
		if n > 0 {
			// Bad framing yields no connection.close: the read deadline
			// ends the loop and the test fails on the missing close.
			_ = p.Parse(buf[:n], func(f amqpwire.Frame) error {
				if f.Type == amqpwire.FrameMethod {
					if m, err := amqpwire.DecodeMethod(f.Payload); err == nil {
						if cl, ok := m.(*amqpwire.ConnectionClose); ok {
							got = cl
						}
					}
				}
				return nil
			})
		}
		if err != nil && got == nil {
			t.Fatalf("connection ended without a connection.close: %v", err)
		}
	}
	return got
}

// TestMalformedFrameFromApp: a bad frame closes that connection with the
// AMQP error, and disturbs no other connection.
func TestMalformedFrameFromApp(t *testing.T) {
	e := newEnv(t)
	e.start(sidecar.Options{})
	good := e.dial(amqp.Config{})
	q := e.queue()

	for name, tc := range map[string]struct {
		frame    []byte
		wantCode uint16
	}{
		"bad frame end":  {frame: []byte{1, 0, 1, 0, 0, 0, 4, 0, 60, 0, 80, 0x00}, wantCode: amqpwire.FrameError},
		"oversized":      {frame: []byte{1, 0, 1, 0x7f, 0, 0, 0}, wantCode: amqpwire.FrameError},
		"unknown type":   {frame: []byte{9, 0, 1, 0, 0, 0, 0, amqpwire.FrameEnd}, wantCode: amqpwire.FrameError},
		"body no header": {frame: []byte{3, 0, 1, 0, 0, 0, 1, 'x', amqpwire.FrameEnd}, wantCode: amqpwire.UnexpectedFrame},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", e.sc.AMQPAddr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, b := range [][]byte{amqpwire.ProtocolHeader, tc.frame} {
				if _, err := c.Write(b); err != nil {
					t.Fatal(err)
				}
			}
			cl := readClose(t, c)
			if cl.ReplyCode != tc.wantCode {
				t.Errorf("connection.close code %d (%q), want %d", cl.ReplyCode, cl.ReplyText, tc.wantCode)
			}
			if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadAll(c); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
				t.Errorf("connection not closed after the error: %v", err)
			}
		})
	}

	// The other connection still works.
	ch, err := good.Channel()
	if err != nil {
		t.Fatalf("the good connection broke: %v", err)
	}
	e.publish(q, "still-fine")
	if d, ok, err := ch.Get(q, true); !ok || err != nil || string(d.Body) != "still-fine" {
		t.Fatalf("get on the good connection = %q, %v, %v", d.Body, ok, err)
	}
}

// TestMalformedFrameFromBroker: a broker that sends garbage gets a 501 and
// the app a forced close, not a hang.
func TestMalformedFrameFromBroker(t *testing.T) {
	e := newEnv(t)
	fake, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	brokerGot := make(chan *amqpwire.ConnectionClose, 1)
	go func() {
		c, err := fake.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, 8)); err != nil {
			t.Errorf("fake broker: read the protocol header: %v", err)
			return
		}
		if _, err := c.Write([]byte{1, 0, 0, 0, 0, 0, 4, 0, 10, 0, 10, 0x42}); err != nil { // bad end octet
			t.Errorf("fake broker: write: %v", err)
			return
		}
		brokerGot <- readClose(t, c)
	}()
	cfg := e.config()
	cfg.Upstream = fake.Addr().String()
	e.startConfig(cfg, sidecar.Options{})

	c, err := net.Dial("tcp", e.sc.AMQPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(amqpwire.ProtocolHeader); err != nil {
		t.Fatal(err)
	}
	if cl := readClose(t, c); cl.ReplyCode != amqpwire.ConnectionForced {
		t.Errorf("app got connection.close %d (%q), want %d", cl.ReplyCode, cl.ReplyText, amqpwire.ConnectionForced)
	}
	select {
	case cl := <-brokerGot:
		if cl.ReplyCode != amqpwire.FrameError {
			t.Errorf("broker got connection.close %d, want %d", cl.ReplyCode, amqpwire.FrameError)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the broker got no connection.close")
	}
}

// TestUnreachableBroker: with no broker, the app's connection fails cleanly
// and soon; once the broker is reachable, the next connection works.
func TestUnreachableBroker(t *testing.T) {
	e := newEnv(t)
	addr := testenv.FreeAddr(t)
	cfg := e.config()
	cfg.Upstream = addr
	cfg.UpstreamConnectTimeout = time.Second
	e.startConfig(cfg, sidecar.Options{})

	start := time.Now()
	_, err := amqp.DialConfig("amqp://guest:guest@"+e.sc.AMQPAddr()+"/", amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err == nil {
		t.Fatal("dial through the sidecar succeeded with no broker behind it")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the app waited %s for its connection to fail, want about the 1s connect timeout", d)
	}

	// Now the broker appears at that address.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go forward(ctx, ln, e.broker.AMQPAddr)
	conn := e.dial(amqp.Config{})
	if _, err := conn.Channel(); err != nil {
		t.Fatalf("channel once the broker is back: %v", err)
	}
}

// forward relays connections on ln to addr, until ctx is done.
func forward(ctx context.Context, ln net.Listener, addr string) {
	context.AfterFunc(ctx, func() { ln.Close() })
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			u, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				return
			}
			context.AfterFunc(ctx, func() { c.Close(); u.Close() })
			// A relay ends when either side does; that is no error here.
			go func() {
				_, _ = io.Copy(u, c)
				u.Close()
			}()
			_, _ = io.Copy(c, u)
			c.Close()
		}()
	}
}

// TestConfigErrorsNameTheVariable: a bad configuration fails with a message
// that names the variable.
func TestConfigErrorsNameTheVariable(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{
		"MS2M_UPSTREAM":      "127.0.0.1:5672",
		"MS2M_STREAM_URI":    "rabbitmq-stream://u:p@127.0.0.1:5552/",
		"MS2M_LOG_NAME":      "orders-consumer",
		"MS2M_CONTROL_TOKEN": "t",
	}
	for name, tc := range map[string]struct {
		set     map[string]string
		unset   string
		wantErr string
	}{
		"missing upstream":          {unset: "MS2M_UPSTREAM", wantErr: "MS2M_UPSTREAM"},
		"upstream not an addr":      {set: map[string]string{"MS2M_UPSTREAM": "http://broker:0"}, wantErr: "MS2M_UPSTREAM"},
		"upstream password hidden":  {set: map[string]string{"MS2M_UPSTREAM": "amqp://u:s3cr%zz@broker"}, wantErr: "it is not shown"},
		"bad stream uri":            {set: map[string]string{"MS2M_STREAM_URI": "amqp://x"}, wantErr: "MS2M_STREAM_URI"},
		"log name with slash":       {set: map[string]string{"MS2M_LOG_NAME": "a/b"}, wantErr: "MS2M_LOG_NAME"},
		"no token":                  {unset: "MS2M_CONTROL_TOKEN", wantErr: "MS2M_CONTROL_TOKEN"},
		"two tokens":                {set: map[string]string{"MS2M_CONTROL_TOKEN_FILE": empty}, wantErr: "MS2M_CONTROL_TOKEN_FILE"},
		"empty token file":          {set: map[string]string{"MS2M_CONTROL_TOKEN": "", "MS2M_CONTROL_TOKEN_FILE": empty}, wantErr: "is empty"},
		"bad duration":              {set: map[string]string{"MS2M_LOG_MAX_AGE": "soon"}, wantErr: "MS2M_LOG_MAX_AGE"},
		"bad level":                 {set: map[string]string{"MS2M_LOG_LEVEL": "loud"}, wantErr: "MS2M_LOG_LEVEL"},
		"bad stop-held mode":        {set: map[string]string{"MS2M_STOP_HELD": "drop"}, wantErr: "MS2M_STOP_HELD"},
		"negative bytes":            {set: map[string]string{"MS2M_LOG_MAX_BYTES": "-1"}, wantErr: "MS2M_LOG_MAX_BYTES"},
		"replay start not a number": {set: map[string]string{"MS2M_REPLAY_START": "x"}, wantErr: "MS2M_REPLAY_START"},
		"cutoff below start":        {set: map[string]string{"MS2M_REPLAY_START": "10", "MS2M_REPLAY_CUTOFF": "5"}, wantErr: "below start"},
		"cutoff not a number":       {set: map[string]string{"MS2M_REPLAY_START": "1", "MS2M_REPLAY_CUTOFF": "soon"}, wantErr: "MS2M_REPLAY_CUTOFF"},
		"epoch not a number":        {set: map[string]string{"MS2M_REPLAY_START": "1", "MS2M_REPLAY_EPOCH": "-1"}, wantErr: "MS2M_REPLAY_EPOCH"},
		"unknown broker":            {set: map[string]string{"MS2M_BROKER": "kafka"}, wantErr: "MS2M_BROKER"},
		"nats without its url":      {set: map[string]string{"MS2M_BROKER": "nats"}, wantErr: "MS2M_NATS_URL"},
		"nats url of another kind":  {set: map[string]string{"MS2M_BROKER": "nats", "MS2M_NATS_URL": "amqp://x:4222"}, wantErr: "MS2M_NATS_URL"},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range base {
				if k != tc.unset {
					t.Setenv(k, v)
				}
			}
			for k, v := range tc.set {
				t.Setenv(k, v)
			}
			_, err := sidecar.LoadConfig()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("LoadConfig() error = %v, want one naming %s", err, tc.wantErr)
			}
		})
	}
	t.Run("good", func(t *testing.T) {
		for k, v := range base {
			t.Setenv(k, v)
		}
		if _, err := sidecar.LoadConfig(); err != nil {
			t.Errorf("LoadConfig() = %v, want no error", err)
		}
	})
	t.Run("good nats", func(t *testing.T) {
		for k, v := range base {
			if k != "MS2M_STREAM_URI" {
				t.Setenv(k, v)
			}
		}
		t.Setenv("MS2M_BROKER", "nats")
		t.Setenv("MS2M_NATS_URL", "nats://u:p@127.0.0.1:4222")
		if _, err := sidecar.LoadConfig(); err != nil {
			t.Errorf("LoadConfig() = %v, want no error", err)
		}
	})
}
