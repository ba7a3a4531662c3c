package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	js, err := l.conn()
	if err != nil {
		return "", "", false, err
	}
	streams := js.ListStreams(ctx)
	for si := range streams.Info() {
		s, err := js.Stream(ctx, si.Config.Name)
		if err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				continue // deleted meanwhile
			}
			return "", "", false, err
		}
		lister := s.ListConsumers(ctx)
		for ci := range lister.Info() {
			if ci.Config.DeliverSubject == subject && !ok {
				stream, consumer, ok = si.Config.Name, ci.Name, true
			}
		}
		if err := lister.Err(); err != nil {
			return "", "", false, err
		}
	}
	if err := streams.Err(); err != nil {
		return "", "", false, err
	}
	return stream, consumer, ok, nil
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
