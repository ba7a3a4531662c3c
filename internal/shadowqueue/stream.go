package shadowqueue

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// ErrRecordTooLarge is wrapped by Write when a record's encoding is over
// 256 MiB (maxAssembledLen), the most a fragmented record may take. Writing
// it again cannot succeed. RabbitMQ's default message size limit, 128 MiB,
// keeps such records from reaching the sidecar. Readers wrap it, besides
// ErrBadRecord, for a fragment that claims a record over the cap.
var ErrRecordTooLarge = errors.New("shadowqueue: record too large for the replay log")

// ErrReaderDisconnected is wrapped by FollowFrom when the reader's
// connection to the broker failed, could not be made, or its subscription
// was closed by the broker (a restart, a closed connection): following
// again from the offset FollowFrom returned resumes exactly where it
// stopped. Other errors (a record that does not decode, a deleted stream,
// fn's own) are not worth retrying.
var ErrReaderDisconnected = errors.New("shadowqueue: the replay log reader lost its connection to the broker")

const (
	// streamFrameMax is the frame size the stream client asks for; the
	// broker's stream.frame_max (1 MiB by default) can only lower it.
	streamFrameMax = 1048574
	// publishFrameHeader is a publish frame's size without its messages:
	// length prefix, key, version, publisher ID and message count.
	publishFrameHeader = 4 + 2 + 2 + 1 + 4
	// publishMessageOverhead is what a publish frame adds to an encoded
	// record: publishing ID and length (12), and the AMQP 1.0 data section
	// header the client wraps it in (at most 8).
	publishMessageOverhead = 12 + 8
	// maxRecordLen is the largest message body, so the largest encoded
	// record, that fits in one frame.
	maxRecordLen = streamFrameMax - publishFrameHeader - publishMessageOverhead
	// fragmentChunk is the payload of every fragment but a record's last:
	// with its header, a fragment fills at most one frame.
	fragmentChunk = maxRecordLen - maxFragmentHeaderLen

	// socketBuffer replaces the client's 8 KiB socket buffers, which cap
	// consumption at about 700 msg/s.
	socketBuffer = 1 << 20
	// defaultStreamPort is the stream protocol's port when the URI has none.
	defaultStreamPort = 5552
)

// markerVersion is the first byte of a stream message that holds no record
// data (records start with recordVersion, their fragments with
// fragmentVersion, batches of them with batchVersion). Last and ReadAll
// append such a tail marker, followed by a random token, to learn where the
// log ends: RabbitMQ 3.10 has no stream statistics command. Every reader
// here skips markers.
const markerVersion = 0

// StreamOptions configures a StreamLog.
type StreamOptions struct {
	URI string // rabbitmq-stream://user:pass@host:port/vhost, or rabbitmq-stream+tls://
	// TLS configures the connections of a rabbitmq-stream+tls URI (its
	// ServerName defaults to the URI's host); nil means the system's roots.
	TLS          *tls.Config
	Name         string        // stream name (the pod's replay log)
	MaxAge       time.Duration // retention, 0 = none
	MaxBytes     int64         // retention, 0 = none
	SegmentBytes int64         // 0 = broker default
	// ReaderName is the client-provided connection name of the reading
	// connections (Follow, ReadAll, Last), as the broker lists it.
	// Default "ms2m-replay-reader".
	ReaderName string
	// Logger gets warnings, such as a stream that exists with other
	// retention. Default slog.Default().
	Logger *slog.Logger
}

// StreamLog is a Log on a RabbitMQ stream. Write is safe for concurrent
// use, though writes are sent one call at a time.
//
// Format: every stream message body starts with a version byte.
//
//   - 3: a batch of two or more whole records, each AppendRecord's encoding
//     behind its length (see batchVersion). Write packs consecutive records
//     whose encodings fit one stream frame (maxRecordLen, about 1 MiB) into
//     batches as large as one frame takes: a Write of hundreds of small
//     records is one message, and the broker's and the client's work is
//     per message. Readers hand out a batch's records in order, each with
//     the batch message's offset.
//   - 1: a whole record, AppendRecord's encoding. A record that fits one
//     frame but has no neighbour to share a batch with (the only record of
//     a Write, or one whose neighbours are too large to share its frame) is
//     written so. Logs written before batches existed hold only these,
//     fragments and markers, and read as they always did.
//   - 2: one fragment of a larger record, up to 256 MiB encoded (see
//     fragmentHeader). Write sends all fragments of a record consecutively,
//     in order, and returns once all are confirmed; readers put them back
//     together and hand out whole records only. A set of fragments cut short
//     by a failed write is dropped when the retry starts over.
//   - 0: a tail marker that readers append to find the end of the log (see
//     markerVersion), skipped by every reader.
//
// A stream has one writer at a time (the Tee): readers rely on it to tell a
// cut-short fragment set from a complete one. A batch is one message, so
// the broker stores it whole or not at all.
//
// The client library cannot abandon a connection attempt: when ctx ends
// while the broker is unreachable, the call returns but a goroutine keeps
// trying in the background and closes what it gets.
type StreamLog struct {
	opts     StreamOptions
	resolver stream.AddressResolver // the URI's host:port, for every connection
	logger   *slog.Logger

	mu      sync.Mutex  // serialises writes; guards the fields below
	conn    *streamConn // nil before the first connection and after a failure
	nextPub int64       // publishing ID of the next message
	closed  bool

	// holdConfirms is for tests: connections made while it is set hand out
	// no confirmation until it is closed.
	holdConfirms chan struct{}
}

// OpenStream connects to the broker, declares the stream with the retention
// in o (an existing stream keeps its own retention, with a warning) and
// creates the producer that Write uses.
func OpenStream(ctx context.Context, o StreamOptions) (*StreamLog, error) {
	if o.Name == "" {
		return nil, errors.New("open replay log: the stream name is empty")
	}
	resolver, err := streamResolver(o.URI)
	if err != nil {
		return nil, fmt.Errorf("open replay log stream %q: %w", o.Name, err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	l := &StreamLog{opts: o, resolver: resolver, logger: o.Logger, nextPub: 1}
	if err := l.declare(ctx); err != nil {
		return nil, err
	}
	c, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	l.conn = c
	return l, nil
}

// streamResolver returns the host and port of a rabbitmq-stream URI. The
// broker advertises its node name as the host to connect to; the resolver
// makes the client use the configured address instead.
func streamResolver(uri string) (stream.AddressResolver, error) {
	u, err := url.Parse(uri)
	if err != nil {
		// url.Parse's error quotes the URI, or the part it choked on,
		// which may be the password: say nothing of either.
		return stream.AddressResolver{}, errors.New("the stream URI does not parse (it is not shown: it holds the password); want rabbitmq-stream://user:pass@host:port/vhost, with '%', '/', '?', '#' and '@' in the password percent-encoded")
	}
	if u.Scheme != "rabbitmq-stream" && u.Scheme != "rabbitmq-stream+tls" {
		return stream.AddressResolver{}, fmt.Errorf("stream URI scheme is %q, want rabbitmq-stream://user:pass@host:port/vhost (or rabbitmq-stream+tls://)", u.Scheme)
	}
	if u.Hostname() == "" {
		return stream.AddressResolver{}, errors.New("stream URI has no host; want rabbitmq-stream://user:pass@host:port/vhost")
	}
	port := defaultStreamPort
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil {
			return stream.AddressResolver{}, fmt.Errorf("stream URI port %q: %w", p, err)
		}
	}
	return stream.AddressResolver{Host: u.Hostname(), Port: port}, nil
}

// newEnvironment connects to the broker. It gives up when ctx is done,
// leaving the attempt to finish in the background; whatever it yields then
// goes to abandon.
func newEnvironment(ctx context.Context, uri string, resolver stream.AddressResolver, tc *tls.Config, setup func(*stream.Environment) error) (*stream.Environment, error) {
	type result struct {
		env *stream.Environment
		err error
	}
	done := make(chan result, 1)
	go func() {
		opts := stream.NewEnvironmentOptions().
			SetUri(uri).
			SetAddressResolver(resolver).
			SetReadBuffer(socketBuffer).
			SetWriteBuffer(socketBuffer)
		if strings.HasPrefix(uri, "rabbitmq-stream+tls:") {
			c := &tls.Config{MinVersion: tls.VersionTLS12}
			if tc != nil {
				c = tc.Clone()
			}
			if c.ServerName == "" {
				c.ServerName = resolver.Host
			}
			opts.IsTLS(true).SetTLSConfig(c)
		}
		env, err := stream.NewEnvironment(opts)
		if err != nil {
			done <- result{err: err}
			return
		}
		if setup != nil {
			if err := setup(env); err != nil {
				_ = env.Close()
				done <- result{err: err}
				return
			}
		}
		done <- result{env: env}
	}()
	select {
	case r := <-done:
		return r.env, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.env != nil {
				_ = r.env.Close()
			}
		}()
		return nil, context.Cause(ctx)
	}
}

// declare creates the stream with the configured retention, or keeps an
// existing one.
func (l *StreamLog) declare(ctx context.Context) error {
	opts := stream.NewStreamOptions()
	if l.opts.MaxAge > 0 {
		opts.SetMaxAge(l.opts.MaxAge)
	}
	if l.opts.MaxBytes > 0 {
		opts.SetMaxLengthBytes(stream.ByteCapacity{}.B(l.opts.MaxBytes))
	}
	if l.opts.SegmentBytes > 0 {
		opts.SetMaxSegmentSizeBytes(stream.ByteCapacity{}.B(l.opts.SegmentBytes))
	}
	var differs bool
	env, err := newEnvironment(ctx, l.opts.URI, l.resolver, l.opts.TLS, func(env *stream.Environment) error {
		err := env.DeclareStream(l.opts.Name, opts)
		if errors.Is(err, stream.PreconditionFailed) {
			differs = true
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("declare replay log stream %q at %s:%d: %w; check that RabbitMQ runs with the rabbitmq_stream plugin and that the URI's user may configure the stream",
			l.opts.Name, l.resolver.Host, l.resolver.Port, err)
	}
	_ = env.Close()
	if differs {
		l.logger.Warn("replay log stream exists with other arguments; keeping its retention",
			"stream", l.opts.Name, "maxAge", l.opts.MaxAge, "maxBytes", l.opts.MaxBytes, "segmentBytes", l.opts.SegmentBytes)
	}
	return nil
}

// connect opens a new environment and producer. It does not declare the
// stream: a stream deleted under a running sidecar is an error to report,
// not something to paper over.
func (l *StreamLog) connect(ctx context.Context) (*streamConn, error) {
	c := &streamConn{waiting: make(map[int64]chan<- confirmResult), dead: make(chan struct{}), hold: l.holdConfirms}
	env, err := newEnvironment(ctx, l.opts.URI, l.resolver, l.opts.TLS, func(env *stream.Environment) error {
		p, err := env.NewProducer(l.opts.Name, stream.NewProducerOptions().SetClientProvidedName("ms2m-replay-log"))
		if err != nil {
			return err
		}
		c.prod = p
		c.confirms = p.NotifyPublishConfirmation()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("connect a producer to replay log stream %q at %s:%d: %w; the broker may be down (writes retry) or the stream deleted (restart the sidecar to declare it again)",
			l.opts.Name, l.resolver.Host, l.resolver.Port, err)
	}
	c.env = env
	go c.dispatch()
	return c, nil
}

// streamConn is one environment with its producer. Its dispatch goroutine
// hands each confirmation to the Write waiting for it.
type streamConn struct {
	env      *stream.Environment
	prod     *stream.Producer
	confirms stream.ChannelPublishConfirm

	mu      sync.Mutex
	waiting map[int64]chan<- confirmResult // by publishing ID
	dead    chan struct{}                  // closed once the producer is gone
	once    sync.Once

	hold chan struct{} // tests only: nil, or confirmations wait until it is closed
}

type confirmResult struct {
	pub int64
	err error // nil when the broker confirmed the message
}

func (c *streamConn) dispatch() {
	for statuses := range c.confirms {
		if c.hold != nil {
			<-c.hold
		}
		for _, s := range statuses {
			var err error
			if !s.IsConfirmed() {
				err = s.GetError()
				if err == nil {
					err = fmt.Errorf("not confirmed, code %d", s.GetErrorCode())
				}
				// Timed out or closed: the connection is no use any more.
				if errors.Is(err, stream.ConfirmationTimoutError) || errors.Is(err, stream.AlreadyClosed) {
					c.kill()
				}
			}
			c.mu.Lock()
			w := c.waiting[s.GetPublishingId()]
			delete(c.waiting, s.GetPublishingId())
			c.mu.Unlock()
			if w != nil {
				w <- confirmResult{pub: s.GetPublishingId(), err: err}
			}
		}
	}
	c.kill() // the producer closed the channel: it is gone
}

// kill marks the connection unusable; the next Write opens a new one.
func (c *streamConn) kill() { c.once.Do(func() { close(c.dead) }) }

func (c *streamConn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// wait registers pubs to be confirmed on results, which needs room for all
// of them. forget undoes it for the ones still pending.
func (c *streamConn) wait(pubs []int64, results chan<- confirmResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range pubs {
		c.waiting[p] = results
	}
}

func (c *streamConn) forget(pubs []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range pubs {
		delete(c.waiting, p)
	}
}

func (c *streamConn) close() error {
	c.kill()
	return c.env.Close()
}

// Write appends recs to the stream and returns once the broker confirmed
// all of them. Consecutive records go out together in batch messages of up
// to about 1 MiB; a record left alone, because its neighbours are too large
// to join it, goes as a record message. A record whose encoding does not
// fit one stream frame is split into fragments of about 1 MiB, one message
// each. Messages go out in frames of up to 1 MiB without waiting in
// between, so a Write costs about one broker round trip. A record over 256
// MiB encoded is refused, with ErrRecordTooLarge, before anything is sent.
//
// If the connection is gone (broker restart, network), Write connects again
// before sending; if it dies during the write, Write sends all of recs
// once more on a new connection. Either way some records may be stored
// twice, and the first fragments of a record may be stored without the
// rest; the Log contract allows both, and readers drop such an incomplete
// set.
func (l *StreamLog) Write(ctx context.Context, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	bodies, parts, err := encodeBodies(recs, fragmentChunk)
	if err != nil {
		return fmt.Errorf("write to replay log stream %q: %w", l.opts.Name, err)
	}
	return l.writeBodies(ctx, bodies, func(i int) string {
		p := parts[i]
		r := &recs[p.rec]
		switch {
		case p.batch > 0:
			return fmt.Sprintf("record ID %d to %d (a batch of %d records)", r.ID, recs[p.rec+p.batch-1].ID, p.batch)
		case p.count > 0:
			return fmt.Sprintf("record ID %d (kind %d, fragment %d of %d)", r.ID, r.Kind, p.index, p.count)
		default:
			return fmt.Sprintf("record ID %d (kind %d)", r.ID, r.Kind)
		}
	})
}

// bodyPart says what a message body of a Write holds.
type bodyPart struct {
	rec          int // index of the record, or of a batch's first record, in recs
	batch        int // records in a batch message; 0 for a record or a fragment
	index, count int // fragment index and count; count 0 unless a fragment
}

// messageSpan is the records of recs that one message holds, or that one
// set of fragments holds.
type messageSpan struct {
	first, n   int  // recs[first:first+n]; n >= 2 makes a batch
	fragmented bool // n is 1, and the record goes in fragments
}

// planMessages groups recs into messages, in order: consecutive records
// share a batch message for as long as its encoding stays within
// maxRecordLen; a record whose encoding is over maxRecordLen goes in
// fragments of chunk payload bytes, and a batch that ends up with one
// record is written as a record message. size and messages are the bytes
// and the message bodies that encoding the plan takes.
func planMessages(recs []Record, chunk int) (spans []messageSpan, size, messages int, err error) {
	open := messageSpan{}
	entries := 0 // the open batch's entries, in bytes
	closeOpen := func() {
		switch open.n {
		case 0:
			return
		case 1:
			size += encodedRecordLen(&recs[open.first])
		default:
			size += batchHeaderLen(open.n) + entries
		}
		spans = append(spans, open)
		messages++
		open, entries = messageSpan{}, 0
	}
	for i := range recs {
		n := encodedRecordLen(&recs[i])
		switch {
		case n <= maxRecordLen:
			if open.n > 0 && batchHeaderLen(open.n+1)+entries+fieldLen(n) > maxRecordLen {
				closeOpen()
			}
			if open.n == 0 {
				open.first = i
			}
			open.n++
			entries += fieldLen(n)
		case n <= maxAssembledLen:
			closeOpen()
			spans = append(spans, messageSpan{first: i, n: 1, fragmented: true})
			size += fragmentsLen(recs[i].ID, n, chunk)
			messages += fragmentCount(n, chunk)
		default:
			return nil, 0, 0, fmt.Errorf("record ID %d is %d bytes encoded, over the %d MiB the replay log takes; it cannot be written: %w",
				recs[i].ID, n, maxAssembledLen>>20, ErrRecordTooLarge)
		}
	}
	closeOpen()
	return spans, size, messages, nil
}

// encodeBodies encodes recs as stream message bodies, in order, as
// planMessages groups them: batch messages, record messages, and fragments
// with payloads of chunk bytes. parts[i] says what bodies[i] holds. All
// bodies share one allocation.
func encodeBodies(recs []Record, chunk int) (bodies [][]byte, parts []bodyPart, err error) {
	bodies, parts, _, err = encodeBodiesInto(nil, recs, chunk)
	return bodies, parts, err
}

// encodeBodiesInto is encodeBodies into buf's array, when it holds them
// (its contents are overwritten): a writer that keeps no body once its
// write returns reuses one buffer from write to write. It returns the
// buffer the bodies are in, for the next write.
func encodeBodiesInto(buf []byte, recs []Record, chunk int) (bodies [][]byte, parts []bodyPart, out []byte, err error) {
	spans, size, messages, err := planMessages(recs, chunk)
	if err != nil {
		return nil, nil, buf, err
	}
	if cap(buf) < size {
		buf = make([]byte, 0, size)
	}
	buf = buf[:0]
	bodies = make([][]byte, 0, messages)
	parts = make([]bodyPart, 0, messages)
	for _, s := range spans {
		start := len(buf)
		switch {
		case s.fragmented:
			first := len(bodies)
			buf, bodies = appendFragments(buf, bodies, &recs[s.first], chunk)
			for j := first; j < len(bodies); j++ {
				parts = append(parts, bodyPart{rec: s.first, index: j - first, count: len(bodies) - first})
			}
			continue
		case s.n == 1:
			buf = AppendRecord(buf, &recs[s.first])
			parts = append(parts, bodyPart{rec: s.first})
		default:
			buf = appendBatch(buf, recs[s.first:s.first+s.n])
			parts = append(parts, bodyPart{rec: s.first, batch: s.n})
		}
		bodies = append(bodies, buf[start:len(buf):len(buf)])
	}
	return bodies, parts, buf, nil
}

// writeBodies sends bodies as one message each and waits for their
// confirmations. describe names bodies[i] in errors.
func (l *StreamLog) writeBodies(ctx context.Context, bodies [][]byte, describe func(i int) string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("write to replay log stream %q: the log is closed", l.opts.Name)
	}
	var err error
	for attempt := 1; attempt <= 2; attempt++ {
		if l.conn == nil || l.conn.isDead() {
			if l.conn != nil {
				_ = l.conn.close()
				l.conn = nil
			}
			c, cerr := l.connect(ctx)
			if cerr != nil {
				return fmt.Errorf("write %s: %w", describe(0), cerr)
			}
			l.conn = c
		}
		c := l.conn
		err = l.sendAndWait(ctx, c, bodies, describe)
		if err == nil || ctx.Err() != nil || !c.isDead() || attempt == 2 {
			return err
		}
		l.logger.Warn("replay log connection lost during a write; sending the batch again on a new connection",
			"stream", l.opts.Name, "attempt", attempt, "err", err)
	}
	return err
}

func (l *StreamLog) sendAndWait(ctx context.Context, c *streamConn, bodies [][]byte, describe func(i int) string) error {
	pubs := make([]int64, len(bodies))
	index := make(map[int64]int, len(bodies)) // publishing ID -> position
	for i := range bodies {
		pubs[i] = l.nextPub
		index[l.nextPub] = i
		l.nextPub++
	}
	results := make(chan confirmResult, len(bodies))
	c.wait(pubs, results)
	defer c.forget(pubs)

	// Send in frames that stay under the negotiated frame size.
	for start := 0; start < len(bodies); {
		end, size := start, publishFrameHeader
		for end < len(bodies) && (end == start || size+len(bodies[end])+publishMessageOverhead <= streamFrameMax) {
			size += len(bodies[end]) + publishMessageOverhead
			end++
		}
		msgs := make([]message.StreamMessage, 0, end-start)
		for i := start; i < end; i++ {
			m := amqp.NewMessage(bodies[i])
			m.SetPublishingId(pubs[i])
			msgs = append(msgs, m)
		}
		if err := c.prod.BatchSend(msgs); err != nil {
			if !errors.Is(err, stream.FrameTooLarge) {
				c.kill() // a send error means the socket or producer is broken
			}
			return fmt.Errorf("write %s to replay log stream %q: send: %w", describe(start), l.opts.Name, err)
		}
		start = end
	}

	confirmed := make([]bool, len(bodies))
	firstPending := func() int {
		for i, ok := range confirmed {
			if !ok {
				return i
			}
		}
		return 0
	}
	for left := len(bodies); left > 0; left-- {
		select {
		case r := <-results:
			i := index[r.pub]
			if r.err != nil {
				return fmt.Errorf("write %s to replay log stream %q: the broker did not confirm it: %w; write the batch again",
					describe(i), l.opts.Name, r.err)
			}
			confirmed[i] = true
		case <-c.dead:
			return fmt.Errorf("write %s to replay log stream %q: connection lost before the broker confirmed it; write the batch again",
				describe(firstPending()), l.opts.Name)
		case <-ctx.Done():
			return fmt.Errorf("write %s to replay log stream %q: gave up waiting for the broker's confirmation: %w",
				describe(firstPending()), l.opts.Name, context.Cause(ctx))
		}
	}
	return nil
}

// Close closes the producer and its connections. Later writes fail.
func (l *StreamLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.conn == nil {
		return nil
	}
	c := l.conn
	l.conn = nil
	if err := c.close(); err != nil {
		return fmt.Errorf("close replay log stream %q: %w", l.opts.Name, err)
	}
	return nil
}

// Last returns the last complete record in the log (of a batch, its last
// record): a set of fragments that a failed write cut short is not a
// record. It appends a tail marker (see markerVersion) to find the end,
// then reads the offsets before it in growing windows that end there,
// until one holds a complete record or reaches the start of the log. A
// window that starts inside a fragment set does not see that record; the
// next, larger one does.
func (l *StreamLog) Last(ctx context.Context) (Record, bool, error) {
	env, end, err := l.readToTail(ctx, "find the last record of")
	if err != nil {
		return Record{}, false, err
	}
	defer func() { _ = env.Close() }()
	for window := int64(16); ; window *= 8 {
		from := max(0, end-window)
		r, found, truncated, err := l.lastBetween(ctx, env, from, end)
		if err != nil || found {
			return r, found, err
		}
		if from == 0 || truncated {
			return Record{}, false, nil // nothing older is left
		}
	}
}

// lastBetween returns the last complete record whose last message has an
// offset in [from, end); a record whose first fragments come before from is
// not seen, nor is a message that does not decode (it is logged). truncated
// says that retention removed offsets at or after from.
func (l *StreamLog) lastBetween(ctx context.Context, env *stream.Environment, from, end int64) (last Record, found, truncated bool, err error) {
	truncated, err = l.scanBetween(ctx, env, from, end, "looking for the last record", func(r *Record) {
		last, found = *r, true
	})
	if err != nil {
		return Record{}, false, false, err
	}
	return last, found, truncated, nil
}

// scanBetween calls fn, in log order, with each complete record whose last
// message has an offset in [from, end); a record whose first fragments come
// before from is not seen. A message that does not decode is logged (doing
// says what for) and skipped: a message this sidecar did not write (anyone
// with the stream's credentials can append one) must not keep the writer
// from starting, and replay, which reads every message, fails on it.
// truncated says that retention removed offsets at or after from. fn may
// keep r; r.Body shares the message's memory.
func (l *StreamLog) scanBetween(ctx context.Context, env *stream.Environment, from, end int64, doing string, fn func(r *Record)) (truncated bool, err error) {
	sub, err := l.subscribe(env, stream.OffsetSpecification{}.Offset(from))
	if err != nil {
		return false, err
	}
	defer sub.close()
	var asm reassembler
	var recs []Record
	first := true
	for {
		m, err := sub.next(ctx)
		if err != nil {
			return false, err
		}
		if first {
			truncated = m.offset > from
			first = false
		}
		if m.offset >= end {
			return truncated, nil
		}
		recs, err = l.decode(recs[:0], &asm, m)
		if errors.Is(err, ErrBadRecord) {
			l.logger.Warn("the replay log holds a message that is not a record; ignored when "+doing+", but a replay across it fails",
				"log", l.opts.Name, "offset", m.offset, "err", err)
		} else if err != nil {
			return false, err
		}
		for i := range recs {
			fn(&recs[i])
		}
		if m.offset == end-1 {
			return truncated, nil
		}
	}
}

// Recent returns the log's last records, at most n, in log order, of every
// kind. Like Last, it appends a tail marker to find the end, then reads
// windows of offsets that end there, from 64 offsets growing eightfold,
// until one holds n records, reaches the start of the log or spans
// 4·max(n, 1024) offsets. A record takes one offset (a batch puts many in
// one, a fragmented body more than one), and so does each tail marker
// (every Last, Recent and ReadAll adds one): the bound leaves room for
// both, and a sidecar that calls it at start (proxy.Options.Recent, n =
// 4096) reads at most about 21000 messages (windows of 64, 512, 4096 and
// 16384 offsets), and a few hundred where the log was written in batches.
// A message that is not a record is skipped, as in Last. The records'
// bodies share the messages' memory.
func (l *StreamLog) Recent(ctx context.Context, n int) ([]Record, error) {
	if n <= 0 {
		return nil, nil
	}
	env, end, err := l.readToTail(ctx, "read the last records of")
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Close() }()
	maxWindow := 4 * int64(max(n, 1024))
	for window := int64(64); ; window *= 8 {
		window = min(window, maxWindow)
		from := max(0, end-window)
		var recs []Record
		truncated, err := l.scanBetween(ctx, env, from, end, "reading the last records", func(r *Record) {
			if len(recs) == 2*n { // keep the last n, copying seldom
				recs = append(recs[:0], recs[n:]...)
			}
			recs = append(recs, *r)
		})
		if err != nil {
			return nil, err
		}
		if len(recs) >= n || from == 0 || truncated || window == maxWindow {
			return recs[max(0, len(recs)-n):], nil
		}
	}
}

// ReadAll returns every record in the log when it is called, in log order.
// It appends a tail marker (see markerVersion) to know where to stop; a
// record whose fragments are not all before it is left out.
func (l *StreamLog) ReadAll(ctx context.Context) ([]Record, error) {
	env, end, err := l.readToTail(ctx, "read")
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Close() }()
	sub, err := l.subscribe(env, stream.OffsetSpecification{}.First())
	if err != nil {
		return nil, err
	}
	defer sub.close()
	var recs []Record
	var asm reassembler
	for {
		m, err := sub.next(ctx)
		if err != nil {
			return nil, err
		}
		if m.offset >= end {
			return recs, nil
		}
		recs, err = l.decode(recs, &asm, m)
		if err != nil {
			return nil, err
		}
	}
}

// Follow calls fn with each record from the start of the log, then with
// each new record as it is written, until ctx is done (it returns
// context.Cause(ctx)), fn returns an error (it returns that error) or the
// connection fails (it returns an error wrapping ErrReaderDisconnected; to
// go on without seeing records again, use FollowFrom). Records are passed
// in log order with their stream offsets (for a record from a batch, the
// batch message's offset, which the batch's records share; for a
// fragmented record, the offset of its last fragment: fn sees it once all
// fragments are in); fn runs on the calling goroutine and may keep r.
// r.Body and r.Properties of a record from a batch share the batch
// message's memory, so keeping one record keeps the whole message.
func (l *StreamLog) Follow(ctx context.Context, fn func(offset int64, r Record) error) error {
	_, err := l.FollowFrom(ctx, FollowOptions{}, fn)
	return err
}

// FollowOptions says where FollowFrom starts.
type FollowOptions struct {
	// From is the stream offset to start at: 0 for the start of the log,
	// or the offset an earlier FollowFrom returned.
	From int64
	// Subscribed, if set, is called once the subscription is open.
	Subscribed func()
}

// FollowFrom is Follow from offset o.From. It also returns next, the offset
// to follow from to see exactly the records fn has not been given yet: one
// past the last message whose records fn had all been given, or, while a
// fragmented record is incomplete, the offset of its first fragment. After
// an error wrapping ErrReaderDisconnected, FollowFrom(next) resumes with no
// record missed and none seen twice. When fn fails, next is the offset of
// the message whose record it failed on.
//
// If retention removed the records at o.From (above 0) before the
// subscription reached them, FollowFrom fails rather than skip them.
func (l *StreamLog) FollowFrom(ctx context.Context, o FollowOptions, fn func(offset int64, r Record) error) (next int64, err error) {
	next = o.From
	env, err := l.readEnvironment(ctx, "follow")
	if err != nil {
		if ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", ErrReaderDisconnected, err)
		}
		return next, err
	}
	defer func() { _ = env.Close() }()
	spec := stream.OffsetSpecification{}.First()
	if o.From > 0 {
		spec = stream.OffsetSpecification{}.Offset(o.From)
	}
	sub, err := l.subscribe(env, spec)
	if err != nil {
		if !errors.Is(err, stream.StreamDoesNotExist) {
			err = fmt.Errorf("%w: %w", ErrReaderDisconnected, err)
		}
		return next, err
	}
	defer sub.close()
	if o.Subscribed != nil {
		o.Subscribed()
	}
	var asm reassembler
	var recs []Record
	first := true
	for {
		m, err := sub.next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("%w: %w", ErrReaderDisconnected, err)
			}
			return next, err
		}
		if m.offset < o.From {
			continue // the broker sends whole chunks
		}
		if first {
			first = false
			if o.From > 0 && m.offset > o.From {
				return next, fmt.Errorf("follow replay log stream %q from offset %d: the log now starts at offset %d, retention removed the records between; they cannot be replayed", l.opts.Name, o.From, m.offset)
			}
		}
		recs, err = l.decode(recs[:0], &asm, m)
		if err != nil {
			return next, err
		}
		for _, r := range recs {
			if err := fn(m.offset, r); err != nil {
				return m.offset, err
			}
		}
		clear(recs) // let go of m's body: fn has its own copies
		if asm.state == assemblyCollecting {
			next = asm.offset
		} else {
			next = m.offset + 1
		}
	}
}

// readEnvironment opens a connection of its own for one read, so that a
// long Follow and the writer's reconnects do not disturb each other.
func (l *StreamLog) readEnvironment(ctx context.Context, what string) (*stream.Environment, error) {
	env, err := newEnvironment(ctx, l.opts.URI, l.resolver, l.opts.TLS, nil)
	if err != nil {
		return nil, fmt.Errorf("%s replay log stream %q: connect to %s:%d: %w", what, l.opts.Name, l.resolver.Host, l.resolver.Port, err)
	}
	return env, nil
}

// readToTail connects for reading (what says what for, in errors) and
// appends a tail marker (tail), whose offset it returns as end. The caller
// closes env.
func (l *StreamLog) readToTail(ctx context.Context, what string) (env *stream.Environment, end int64, err error) {
	env, err = l.readEnvironment(ctx, what)
	if err != nil {
		return nil, 0, err
	}
	if end, err = l.tail(ctx, env); err != nil {
		_ = env.Close()
		return nil, 0, err
	}
	return env, end, nil
}

// tail appends a tail marker and returns its offset: every record written
// before the call has a lower offset. It subscribes at the end first, so
// the marker is the first or a later message the subscription sees.
func (l *StreamLog) tail(ctx context.Context, env *stream.Environment) (int64, error) {
	sub, err := l.subscribe(env, stream.OffsetSpecification{}.Next())
	if err != nil {
		return 0, err
	}
	defer sub.close()
	marker := make([]byte, 1, 17)
	marker[0] = markerVersion
	marker = append(marker, rand.Text()[:16]...)
	if err := l.writeBodies(ctx, [][]byte{marker}, func(int) string { return "the tail marker" }); err != nil {
		return 0, err
	}
	for {
		m, err := sub.next(ctx)
		if err != nil {
			return 0, err
		}
		if bytes.Equal(m.body, marker) {
			return m.offset, nil
		}
	}
}

// decode feeds a stream message to asm, the reader's reassembler, and
// appends the records that m holds or completes to dst.
func (l *StreamLog) decode(dst []Record, asm *reassembler, m streamMessage) ([]Record, error) {
	dst, err := asm.add(dst, m.offset, m.body)
	if err != nil {
		return dst, fmt.Errorf("replay log stream %q offset %d: %w; the stream holds data this sidecar did not write", l.opts.Name, m.offset, err)
	}
	return dst, nil
}

// streamMessage is one message of a subscription.
type streamMessage struct {
	offset int64
	body   []byte
}

// subscription hands a consumer's messages to the reading goroutine.
type subscription struct {
	stream   string
	consumer *stream.Consumer
	msgs     chan streamMessage
	closed   stream.ChannelClose
	stop     chan struct{}
	err      error // set once the consumer closed
}

func (l *StreamLog) subscribe(env *stream.Environment, from stream.OffsetSpecification) (*subscription, error) {
	s := &subscription{stream: l.opts.Name, msgs: make(chan streamMessage, 256), stop: make(chan struct{})}
	handler := func(cc stream.ConsumerContext, m *amqp.Message) {
		select {
		case s.msgs <- streamMessage{offset: cc.Consumer.GetOffset(), body: m.GetData()}:
		case <-s.stop:
		}
	}
	opts := stream.NewConsumerOptions().
		SetOffset(from).
		SetManualCommit().
		SetClientProvidedName(l.readerName())
	consumer, err := env.NewConsumer(l.opts.Name, handler, opts)
	if err != nil {
		return nil, fmt.Errorf("subscribe to replay log stream %q from %s: %w", l.opts.Name, from, err)
	}
	s.consumer = consumer
	s.closed = consumer.NotifyClose()
	return s, nil
}

func (l *StreamLog) readerName() string {
	if l.opts.ReaderName != "" {
		return l.opts.ReaderName
	}
	return "ms2m-replay-reader"
}

func (s *subscription) next(ctx context.Context) (streamMessage, error) {
	if s.err == nil {
		select {
		case m := <-s.msgs:
			return m, nil
		case <-ctx.Done():
			return streamMessage{}, context.Cause(ctx)
		case ev := <-s.closed:
			s.err = fmt.Errorf("read replay log stream %q: subscription closed (%s); read again", s.stream, ev.Reason)
		}
	}
	// Hand out what arrived before the close, then the error.
	select {
	case m := <-s.msgs:
		return m, nil
	default:
		return streamMessage{}, s.err
	}
}

func (s *subscription) close() {
	close(s.stop)
	_ = s.consumer.Close()
}

// DeleteStream deletes the stream name. A stream that does not exist is not
// an error. Tests use it to clean up.
func DeleteStream(ctx context.Context, uri, name string) error {
	resolver, err := streamResolver(uri)
	if err != nil {
		return fmt.Errorf("delete stream %q: %w", name, err)
	}
	env, err := newEnvironment(ctx, uri, resolver, nil, func(env *stream.Environment) error {
		err := env.DeleteStream(name)
		if errors.Is(err, stream.StreamDoesNotExist) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("delete stream %q at %s: %w", name, net.JoinHostPort(resolver.Host, strconv.Itoa(resolver.Port)), err)
	}
	return env.Close()
}
