package lab

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSDurable is the durable JetStream consumer the "consumer-nats" image
// binds to (Consumer.NATSMode says push or pull).
const NATSDurable = "worker"

// NATSSubject is the subject the stream name takes its messages on.
func NATSSubject(name string) string { return name + ".in" }

// CheckNATS fails, saying why, unless the NATS server at addr (host:port)
// answers with an INFO that says JetStream is on.
func CheckNATS(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("no NATS server at %s: %w", addr, err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("the NATS server at %s sent no INFO: %w", addr, err)
	}
	return checkNATSInfo(addr, line)
}

// checkNATSInfo checks the server's first line, line: an INFO whose JSON
// says JetStream is on.
func checkNATSInfo(addr, line string) error {
	if !strings.HasPrefix(line, "INFO ") {
		return fmt.Errorf("%s is not a NATS server: its first line is not INFO", addr)
	}
	if !strings.Contains(line, `"jetstream":true`) {
		return fmt.Errorf("the NATS server at %s runs without JetStream (start it with -js)", addr)
	}
	return nil
}

// NATSStream is a JetStream stream with the durable consumer the sample
// NATS consumer binds to, and the host's connection that made them.
type NATSStream struct {
	Name string
	JS   jetstream.JetStream
	nc   *nats.Conn
}

// natsConsumerConfig is the durable consumer of the sample NATS consumer
// in mode: push (on deliver.<stream>) or pull.
func natsConsumerConfig(stream, mode string) (jetstream.ConsumerConfig, error) {
	cc := jetstream.ConsumerConfig{Durable: NATSDurable, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 50}
	switch mode {
	case "pull":
	case "push":
		cc.DeliverSubject = "deliver." + stream
	default:
		return cc, fmt.Errorf("NATS consumer mode %q: want push or pull", mode)
	}
	return cc, nil
}

// CreateNATSStream connects to the NATS server at url and makes the
// stream name, on NATSSubject(name), with the durable consumer NATSDurable
// in mode (push or pull). Delete removes the stream and closes the
// connection; on an error nothing is left.
func CreateNATSStream(ctx context.Context, url, name, mode string) (*NATSStream, error) {
	cc, err := natsConsumerConfig(name, mode)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, nats.Name("ms2m-e2e-"+name))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	s := &NATSStream{Name: name, nc: nc}
	if s.JS, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{NATSSubject(name)}}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("create stream %s: %w", name, err)
	}
	if _, err := s.JS.CreateOrUpdateConsumer(ctx, name, cc); err != nil {
		return nil, errors.Join(fmt.Errorf("create consumer %s on stream %s: %w", NATSDurable, name, err), s.Delete(ctx))
	}
	return s, nil
}

// Delete deletes the stream (with its consumer) and closes the connection.
func (s *NATSStream) Delete(ctx context.Context) error {
	defer s.nc.Close()
	if err := s.JS.DeleteStream(ctx, s.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete stream %s: %w", s.Name, err)
	}
	return nil
}

// NATSProducer is the NATS producer, on the host: it publishes msg-1 ..
// msg-n to a stream's subject at a rate, as the sample producer does to a
// queue, and folds the hash chain the sample consumers fold. Each message
// carries its number i as its Nats-Msg-Id and the time it was sent as
// x-sent-at (Unix nanoseconds, decimal), as the sample producer's AMQP
// messages carry a message-id and an x-sent-at header: the NATS sample
// consumer journals them, and the processing gap is read from the
// journals.
type NATSProducer struct {
	cancel context.CancelFunc
	done   chan struct{}
	want   ProducerResult
	err    error
}

// Produce starts publishing msg-1 .. msg-n to the stream at rate per
// second, each once the server has stored the one before. Wait gives what
// was sent; Stop ends it early.
func (s *NATSStream) Produce(ctx context.Context, n int, rate float64) *NATSProducer {
	ctx, cancel := context.WithCancel(ctx)
	p := &NATSProducer{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer cancel()
		var h chain
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for i := 1; i <= n; i++ {
			body := fmt.Appendf(nil, "msg-%d", i)
			if _, err := s.JS.PublishMsg(ctx, natsMessage(NATSSubject(s.Name), i, body, time.Now())); err != nil {
				p.err = fmt.Errorf("NATS producer: publish %d: %w", i, err)
				return
			}
			h.add(body)
			if i == n {
				break
			}
			select {
			case <-tick.C: // the producer's pace
			case <-ctx.Done():
				p.err = fmt.Errorf("NATS producer: stopped after %d of %d messages: %w", i, n, ctx.Err())
				return
			}
		}
		p.want = ProducerResult{Count: n, Hash: h.hex()}
	}()
	return p
}

// natsMessage is the producer's i-th message, body, sent at sent: its
// number as its Nats-Msg-Id (which also has the server drop a publish
// retried within its duplicate window) and sent as x-sent-at.
func natsMessage(subject string, i int, body []byte, sent time.Time) *nats.Msg {
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, strconv.Itoa(i))
	h.Set("x-sent-at", strconv.FormatInt(sent.UnixNano(), 10))
	return &nats.Msg{Subject: subject, Header: h, Data: body}
}

// Wait waits for the producer to finish and returns what it sent.
func (p *NATSProducer) Wait(ctx context.Context) (ProducerResult, error) {
	select {
	case <-p.done:
		return p.want, p.err
	case <-ctx.Done():
		return ProducerResult{}, fmt.Errorf("the NATS producer did not finish: %w", ctx.Err())
	}
}

// Stop ends the producer if it still runs, and waits for it.
func (p *NATSProducer) Stop() {
	p.cancel()
	<-p.done
}

// chain is the sample consumers' hash chain, folded as bodies are sent:
// h0 is 32 zero bytes, h(i) = SHA-256(h(i-1) || body(i)).
type chain [sha256.Size]byte

func (h *chain) add(body []byte) {
	d := sha256.New()
	d.Write(h[:])
	d.Write(body)
	d.Sum(h[:0])
}

func (h *chain) hex() string { return hex.EncodeToString(h[:]) }
