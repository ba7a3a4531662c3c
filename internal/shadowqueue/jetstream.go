package shadowqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStreamOptions configures a JetStreamLog.
type JetStreamOptions struct {
	URL      string        // nats://user:pass@host:port
	Name     string        // stream name (the pod's replay log); also names its subject
	MaxAge   time.Duration // retention, 0 = none
	MaxBytes int64         // retention, 0 = none
	// ConnName is the client connection name, as the server lists it.
	// Default "ms2m-replay-log".
	ConnName string
	// Logger gets warnings, such as a stream that exists with other
	// retention. Default slog.Default().
	Logger *slog.Logger
}

// JetStreamSubjectPrefix starts the subject of every JetStream replay log:
// the stream named N stores the subject JetStreamSubjectPrefix+N only.
const JetStreamSubjectPrefix = "ms2m.replaylog."

// minLogPayload is the smallest max_payload a server must allow for the
// log: a message body of up to maxRecordLen bytes, which is what
// encodeBodies plans for (a NATS server's default is 1 MiB).
const minLogPayload = maxRecordLen

// JetStreamLog is a Log on a NATS JetStream stream with file storage, for
// NATS workloads: the same record format as StreamLog, message for message
// (record, batch and fragment messages, see StreamLog), with the stream
// sequence in place of the stream offset. No tail markers are written: the
// stream's state says where it ends.
//
// Write publishes a batch's messages asynchronously and returns once the
// server acknowledged every one as stored. A stream has one writer at a
// time (the Tee), as for StreamLog.
type JetStreamLog struct {
	opts    JetStreamOptions
	name    string // the stream's name (JetStreamName)
	subject string
	logger  *slog.Logger
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream

	mu     sync.Mutex // serialises writes
	closed bool
	// enc is the buffer the last write encoded into, once all its
	// messages are stored (guarded by mu): nats.go has copied them, and
	// the next write reuses it.
	enc []byte
}

// maxKeptEnc bounds the encoding buffer a JetStreamLog keeps between
// writes: a write of big records does not pin its buffer.
const maxKeptEnc = 1 << 20

// OpenJetStream connects to the server and declares the stream (file
// storage, the retention in o; an existing stream keeps its own retention,
// with a warning).
func OpenJetStream(ctx context.Context, o JetStreamOptions) (*JetStreamLog, error) {
	if o.Name == "" {
		return nil, errors.New("open a JetStream replay log: no stream name")
	}
	if o.ConnName == "" {
		o.ConnName = "ms2m-replay-log"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	nc, err := nats.Connect(o.URL, nats.Name(o.ConnName), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("open replay log %q: connect to NATS: %w", o.Name, err)
	}
	l := &JetStreamLog{opts: o, name: JetStreamName(o.Name), logger: o.Logger, nc: nc}
	l.subject = JetStreamSubjectPrefix + l.name
	if mp := nc.MaxPayload(); mp < minLogPayload {
		nc.Close()
		return nil, fmt.Errorf("open replay log %q: the server's max_payload is %d bytes; the replay log needs at least %d (raise max_payload)", o.Name, mp, minLogPayload)
	}
	l.js, err = jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("open replay log %q: %w", o.Name, err)
	}
	if err := l.declare(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return l, nil
}

func (l *JetStreamLog) declare(ctx context.Context) error {
	s, err := l.js.Stream(ctx, l.name)
	if err == nil {
		info := s.CachedInfo()
		if (l.opts.MaxAge > 0 && info.Config.MaxAge != l.opts.MaxAge) || (l.opts.MaxBytes > 0 && info.Config.MaxBytes != l.opts.MaxBytes) {
			l.logger.Warn("the replay log stream exists with other retention; keeping it as it is",
				"log", l.opts.Name, "max_age", info.Config.MaxAge, "max_bytes", info.Config.MaxBytes,
				"want_max_age", l.opts.MaxAge, "want_max_bytes", l.opts.MaxBytes)
		}
		if len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != l.subject {
			return fmt.Errorf("open replay log %q: the stream exists with subjects %q, want only %q; it is not an ms2m replay log", l.opts.Name, info.Config.Subjects, l.subject)
		}
		l.stream = s
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("open replay log %q: look up the stream: %w", l.opts.Name, err)
	}
	cfg := jetstream.StreamConfig{
		Name:      l.name,
		Subjects:  []string{l.subject},
		Storage:   jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy,
		MaxAge:    l.opts.MaxAge,
		MaxBytes:  -1,
		MaxMsgs:   -1,
		Discard:   jetstream.DiscardOld,
	}
	if l.opts.MaxBytes > 0 {
		cfg.MaxBytes = l.opts.MaxBytes
	}
	s, err = l.js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = l.js.Stream(ctx, l.name)
	}
	if err != nil {
		return fmt.Errorf("open replay log %q: create the stream: %w", l.opts.Name, err)
	}
	l.stream = s
	return nil
}

// JetStreamName is the JetStream stream that holds the replay log name. A
// stream name cannot hold '.', which the webhook's log names do
// (namespace.pod); they hold no '_' (Kubernetes names cannot), so mapping
// '.' to '_' keeps them apart.
func JetStreamName(name string) string { return strings.ReplaceAll(name, ".", "_") }

// JetStreamExists reports whether the stream name exists on the server at
// url, as StreamExists does for RabbitMQ.
func JetStreamExists(ctx context.Context, url, name string) (bool, error) {
	nc, err := nats.Connect(url, nats.Name("ms2m-replay-log-check"))
	if err != nil {
		return false, fmt.Errorf("look up replay log %q: connect to NATS: %w", name, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false, fmt.Errorf("look up replay log %q: %w", name, err)
	}
	_, err = js.Stream(ctx, JetStreamName(name))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("look up replay log %q: %w", name, err)
	}
}

// DeleteJetStream deletes the replay log stream name.
func DeleteJetStream(ctx context.Context, url, name string) error {
	nc, err := nats.Connect(url, nats.Name("ms2m-replay-log-delete"))
	if err != nil {
		return fmt.Errorf("delete replay log %q: connect to NATS: %w", name, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("delete replay log %q: %w", name, err)
	}
	if err := js.DeleteStream(ctx, JetStreamName(name)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete replay log %q: %w", name, err)
	}
	return nil
}

// Write appends recs and returns once the server stored every message.
func (l *JetStreamLog) Write(ctx context.Context, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("write to replay log %q: the log is closed", l.opts.Name)
	}
	bodies, _, enc, err := encodeBodiesInto(l.enc, recs, fragmentChunk)
	// Until every message of this write is stored, nats.go may publish
	// one again from enc (a retry after no responders): a write that
	// fails leaves enc to it, and the next one takes a fresh buffer.
	l.enc = nil
	if err != nil {
		return err
	}
	futures := make([]jetstream.PubAckFuture, 0, len(bodies))
	for _, b := range bodies {
		// No headers: a body may take all of max_payload. A busy server
		// may keep the client's async window full for a while: wait for
		// room rather than fail the write at once.
		f, err := l.js.PublishAsync(l.subject, b, jetstream.WithStallWait(10*time.Second))
		if err != nil {
			return fmt.Errorf("write records %d..%d to replay log %q: %w", recs[0].ID, recs[len(recs)-1].ID, l.opts.Name, err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("write records %d..%d to replay log %q: the server did not store a message: %w", recs[0].ID, recs[len(recs)-1].ID, l.opts.Name, err)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	if cap(enc) <= maxKeptEnc {
		l.enc = enc
	}
	return nil
}

// Close closes the log's connection.
func (l *JetStreamLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.nc.Close()
	return nil
}

// bounds returns the stream's first and last sequence now; last is 0 for an
// empty stream.
func (l *JetStreamLog) bounds(ctx context.Context) (first, last uint64, err error) {
	info, err := l.stream.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("replay log %q: read the stream's state: %w", l.opts.Name, err)
	}
	return info.State.FirstSeq, info.State.LastSeq, nil
}

// Last returns the last complete record in the log (of a batch, its last
// record), reading windows that end at the stream's last message and grow
// until one holds a complete record.
func (l *JetStreamLog) Last(ctx context.Context) (Record, bool, error) {
	first, end, err := l.bounds(ctx)
	if err != nil || end == 0 {
		return Record{}, false, err
	}
	for window := uint64(16); ; window *= 8 {
		from := first
		if end > window && end-window+1 > first {
			from = end - window + 1
		}
		var last Record
		found := false
		var asm reassembler
		var recs []Record
		err := l.readRange(ctx, from, end, func(seq uint64, body []byte) error {
			var err error
			recs, err = asm.add(recs[:0], int64(seq), body)
			if errors.Is(err, ErrBadRecord) {
				l.logger.Warn("the replay log holds a message that is not a record; ignored when looking for the last record, but a replay across it fails",
					"log", l.opts.Name, "seq", seq, "err", err)
				return nil
			}
			if err != nil {
				return err
			}
			if len(recs) > 0 {
				last, found = recs[len(recs)-1], true
			}
			return nil
		})
		if err != nil || found || from == first {
			return last, found, err
		}
	}
}

// ReadAll returns every record in the log when it is called, in log order.
func (l *JetStreamLog) ReadAll(ctx context.Context) ([]Record, error) {
	first, end, err := l.bounds(ctx)
	if err != nil || end == 0 {
		return nil, err
	}
	var recs []Record
	var asm reassembler
	err = l.readRange(ctx, first, end, func(seq uint64, body []byte) error {
		var err error
		if recs, err = asm.add(recs, int64(seq), body); err != nil {
			return fmt.Errorf("replay log %q sequence %d: %w", l.opts.Name, seq, err)
		}
		return nil
	})
	return recs, err
}

// FollowFrom calls fn with each record from sequence o.From (0: the start)
// on, as StreamLog.FollowFrom does with offsets, until ctx is done, fn fails
// or the connection fails (ErrReaderDisconnected). It returns the sequence
// to follow from to see exactly the records fn has not been given yet.
func (l *JetStreamLog) FollowFrom(ctx context.Context, o FollowOptions, fn func(seq int64, r Record) error) (next int64, err error) {
	next = max(o.From, 1)
	var asm reassembler
	var recs []Record
	firstMsg := true
	err = l.read(ctx, uint64(next), o.Subscribed, func(seq uint64, body []byte) (bool, error) {
		if firstMsg {
			firstMsg = false
			if o.From > 1 && int64(seq) > o.From {
				return false, fmt.Errorf("follow replay log %q from sequence %d: the log now starts at %d, retention removed the records between; they cannot be replayed", l.opts.Name, o.From, seq)
			}
		}
		var err error
		recs, err = asm.add(recs[:0], int64(seq), body)
		if err != nil {
			return false, fmt.Errorf("replay log %q sequence %d: %w", l.opts.Name, seq, err)
		}
		for _, r := range recs {
			if err := fn(int64(seq), r); err != nil {
				next = int64(seq)
				return false, err
			}
		}
		clear(recs)
		if asm.state == assemblyCollecting {
			next = asm.offset
		} else {
			next = int64(seq) + 1
		}
		return true, nil
	})
	return next, err
}

// readRange calls fn with the body of every message from sequence from to
// end, both included, in order.
func (l *JetStreamLog) readRange(ctx context.Context, from, end uint64, fn func(seq uint64, body []byte) error) error {
	if from > end {
		return nil
	}
	return l.read(ctx, from, nil, func(seq uint64, body []byte) (bool, error) {
		if seq > end {
			return false, nil
		}
		if err := fn(seq, body); err != nil {
			return false, err
		}
		return seq < end, nil
	})
}

// read delivers the stream's messages from sequence from on to fn, through
// an ordered consumer of its own, until fn returns false or an error, or
// ctx ends.
func (l *JetStreamLog) read(ctx context.Context, from uint64, subscribed func(), fn func(seq uint64, body []byte) (bool, error)) error {
	cons, err := l.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   max(from, 1),
	})
	if err != nil {
		return fmt.Errorf("%w: replay log %q: create a reader: %w", ErrReaderDisconnected, l.opts.Name, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("%w: replay log %q: start reading: %w", ErrReaderDisconnected, l.opts.Name, err)
	}
	defer it.Stop()
	if subscribed != nil {
		subscribed()
	}
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return fmt.Errorf("%w: replay log %q: %w", ErrReaderDisconnected, l.opts.Name, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("replay log %q: a message without JetStream metadata: %w", l.opts.Name, err)
		}
		more, err := fn(md.Sequence.Stream, m.Data())
		if err != nil || !more {
			return err
		}
	}
}
