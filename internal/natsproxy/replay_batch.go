package natsproxy

import (
	"context"
	"errors"
	"time"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// replayBatchMax is the most a replay holds before it writes to the app.
const replayBatchMax = 32 << 10

var (
	// errWouldWait is the cause of nowCtx: a record not there yet.
	errWouldWait = errors.New("the record is not in the log yet")
	// errNoWaitEmpty ends a no_wait pull request's wait for a record.
	errNoWaitEmpty = errors.New("no record for a no_wait pull request")
	// errAppWrite wraps a failed write of replayed records to the app.
	errAppWrite = errors.New("write replayed messages to the app")
)

// nowCtx is done from the start: a Next with it waits for nothing.
var nowCtx = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errWouldWait)
	return ctx
}()

// replayBatch holds replayed messages for the app until they are written
// in one go (one write per message cost the target most of its CPU). Its
// records are handed out (in flight) but count as replayed only once
// written; a failed write puts them back.
type replayBatch struct {
	k   *keyReplay
	out []byte
	ids []uint64
}

func (b *replayBatch) add(out []byte, id uint64) {
	b.out = out
	b.ids = append(b.ids, id)
}

func (b *replayBatch) full() bool { return len(b.out) >= replayBatchMax }

// flushReplay writes what b holds to the app and counts its records as
// replayed. On a failed write the records in flight on c go back, to be
// replayed again (as after any failed write to the app).
func (c *conn) flushReplay(b *replayBatch) error {
	if len(b.out) == 0 {
		return nil
	}
	err := c.writeApp(b.out)
	if err != nil {
		b.k.dropConn(c)
		err = errors.Join(errAppWrite, err)
	} else {
		c.p.rp.markReplayed(b.ids, time.Now())
	}
	b.out, b.ids = b.out[:0], b.ids[:0]
	return err
}

// nextRecord returns k's record idx; if it must wait for it, it first
// writes what b holds, so that the app never waits on what the sidecar
// has.
func (c *conn) nextRecord(ctx context.Context, k *keyReplay, idx int, b *replayBatch) (rec shadowqueue.Record, done bool, err error) {
	if len(b.ids) > 0 {
		rec, done, err = c.p.rp.src.Next(nowCtx, k.key, idx)
		if !errors.Is(err, errWouldWait) {
			return rec, done, err
		}
		if err := c.flushReplay(b); err != nil {
			return rec, false, err
		}
	}
	return c.p.rp.src.Next(ctx, k.key, idx)
}

// replayRun hands the app up to n of k's records on the subscription sid,
// in as few writes as it can, and writes all it holds before it returns.
// With noWait each record has 50 ms to come (then errNoWaitEmpty). It
// returns how many records it sent and the outcome of the last replayOne.
// Callers hold k's feed.
func (c *conn) replayRun(ctx context.Context, k *keyReplay, sid []byte, n int, noWait bool) (sent, done int, err error) {
	b := &replayBatch{k: k}
	for sent < n {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if noWait {
			rctx, cancel = context.WithTimeoutCause(ctx, 50*time.Millisecond, errNoWaitEmpty)
		}
		done, err = c.replayOne(rctx, k, sid, b)
		cancel()
		if err != nil || done != sentOne {
			break
		}
		sent++
	}
	if ferr := c.flushReplay(b); err == nil {
		err = ferr
	}
	return sent, done, err
}
