package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/natsproxy"
)

// natsLookup answers a NATS target's questions to the server on a
// connection of the sidecar's own, to MS2M_NATS_URL: the app's streams
// must be visible there (the same account), or push consumers cannot be
// told apart from core subscriptions (docs/nats.md).
type natsLookup struct {
	url string

	mu sync.Mutex
	nc *nats.Conn
	js jetstream.JetStream
}

func (l *natsLookup) conn() (jetstream.JetStream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.js != nil {
		return l.js, nil
	}
	nc, err := nats.Connect(l.url, nats.Name("ms2m-replay-lookup"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	l.nc, l.js = nc, js
	return js, nil
}

// PushConsumer finds the consumer whose deliver subject is subject, among
// every stream's consumers (read afresh each time: the app may have made
// its consumer a moment ago).
func (l *natsLookup) PushConsumer(ctx context.Context, subject string) (stream, consumer string, ok bool, err error) {
	err = l.eachConsumer(ctx, func(s string, ci *jetstream.ConsumerInfo) {
		if ci.Config.DeliverSubject == subject && !ok {
			stream, consumer, ok = s, ci.Name, true
		}
	})
	if err != nil {
		return "", "", false, err
	}
	return stream, consumer, ok, nil
}

// PushConsumers maps every push consumer's deliver subject to its
// ReplayKey, for a source's cutoff marker (natsproxy.Recoverer).
func (l *natsLookup) PushConsumers(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	err := l.eachConsumer(ctx, func(s string, ci *jetstream.ConsumerInfo) {
		if d := ci.Config.DeliverSubject; d != "" {
			if _, dup := out[d]; !dup {
				out[d] = natsproxy.ReplayKey(s, ci.Name)
			}
		}
	})
	return out, err
}

// eachConsumer calls fn with every consumer of every stream the server has.
func (l *natsLookup) eachConsumer(ctx context.Context, fn func(stream string, ci *jetstream.ConsumerInfo)) error {
	js, err := l.conn()
	if err != nil {
		return err
	}
	streams := js.ListStreams(ctx)
	for si := range streams.Info() {
		s, err := js.Stream(ctx, si.Config.Name)
		if err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				continue // deleted meanwhile
			}
			return err
		}
		lister := s.ListConsumers(ctx)
		for ci := range lister.Info() {
			fn(si.Config.Name, ci)
		}
		if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err // a stream deleted while its consumers are listed is skipped, as above
		}
	}
	return streams.Err()
}

// StreamOf returns the stream that stores subject.
func (l *natsLookup) StreamOf(ctx context.Context, subject string) (string, bool, error) {
	js, err := l.conn()
	if err != nil {
		return "", false, err
	}
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return name, true, nil
}

func (l *natsLookup) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.nc != nil {
		l.nc.Close()
	}
}

// Delivered reads how far consumer of stream has delivered, for a stop's
// read-back of push deliveries made to no one (natsproxy, void.go).
func (l *natsLookup) Delivered(ctx context.Context, stream, consumer string) (natsproxy.ConsumerDelivered, error) {
	if _, err := l.conn(); err != nil {
		return natsproxy.ConsumerDelivered{}, err
	}
	l.mu.Lock()
	nc := l.nc
	l.mu.Unlock()
	// The JetStream API's own request: jetstream.Consumer serves pull
	// consumers only.
	msg, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.INFO."+stream+"."+consumer, nil)
	if err != nil {
		return natsproxy.ConsumerDelivered{}, err
	}
	var info struct {
		jetstream.ConsumerInfo
		Error *jetstream.APIError `json:"error,omitempty"`
	}
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		return natsproxy.ConsumerDelivered{}, fmt.Errorf("consumer info of %s/%s: %w", stream, consumer, err)
	}
	if info.Error != nil {
		return natsproxy.ConsumerDelivered{}, fmt.Errorf("consumer info of %s/%s: %w", stream, consumer, info.Error)
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	return natsproxy.ConsumerDelivered{StreamSeq: info.Delivered.Stream, Filters: filters, Bound: info.PushBound}, nil
}

// Message reads the message stream stores at seq.
func (l *natsLookup) Message(ctx context.Context, stream string, seq uint64) (natsproxy.StoredMsg, bool, error) {
	js, err := l.conn()
	if err != nil {
		return natsproxy.StoredMsg{}, false, err
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return natsproxy.StoredMsg{}, false, err
	}
	m, err := s.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return natsproxy.StoredMsg{}, false, nil
	case err != nil:
		return natsproxy.StoredMsg{}, false, err
	}
	return natsproxy.StoredMsg{Subject: m.Subject, Header: headerBlock(m.Header), Body: m.Data, Time: m.Time}, true, nil
}

// headerBlock is h as the NATS/1.0 header block of an HMSG, or nil.
func headerBlock(h nats.Header) []byte {
	if len(h) == 0 {
		return nil
	}
	b := []byte("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}
