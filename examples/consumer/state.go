package main

import (
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ms2m/ms2m/examples/internal/hashchain"
	"github.com/ms2m/ms2m/examples/internal/journal"
)

// state is the consumer's in-memory state and connection status. The HTTP
// server reads it while the consume loop writes it.
type state struct {
	// skipRedeliveries turns on the redelivery skip in apply; set before
	// the first apply.
	skipRedeliveries bool

	mu         sync.Mutex
	chain      hashchain.Chain
	count      int
	last       string
	lastID     int64 // message-id of the last folded message, if haveLastID
	haveLastID bool
	skipped    int
	connected  bool
	sessions   int
	maxLatency time.Duration
	// journal is every folded message in fold order, the last
	// journal.Max of them: what a benchmark needs to tell each message's
	// latency and to count lost and repeated ones.
	journal journal.Journal

	// extra is STATE_MB's state: never read, only kept, so that it is
	// part of every checkpoint.
	extra []byte
}

// extraState is mib MiB of pseudo-random bytes, every page written (so
// resident, and nothing compresses it away), or nil for 0.
func extraState(mib int) []byte {
	if mib == 0 {
		return nil
	}
	b := make([]byte, mib<<20)
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(time.Now().UnixNano()))
	_, _ = rand.NewChaCha8(seed).Read(b) // ChaCha8's Read never fails
	return b
}

// message is what apply needs from a delivery.
type message struct {
	body        []byte
	messageID   string
	redelivered bool
	sentAt      time.Time // zero when the message has no x-sent-at header
}

// apply folds m into the hash chain and reports true. With
// skipRedeliveries on, it reports false instead when m is a redelivery of a
// message that was already folded: it is redelivered, and its numeric
// message-id is not above that of the last folded message. That happens
// when the connection drops after a message was folded but before its ack
// reached the broker. Skipping it keeps the state exactly-once, but it also
// hides a duplicate that something else caused (a migration that handed the
// app a message twice), so it is off unless asked for.
func (s *state) apply(m message, now time.Time) bool {
	id, err := strconv.ParseInt(m.messageID, 10, 64)
	hasID := err == nil

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.skipRedeliveries && m.redelivered && hasID && s.haveLastID && id <= s.lastID {
		s.skipped++
		return false
	}
	s.chain.Fold(m.body)
	s.count++
	s.last = string(m.body)
	s.lastID, s.haveLastID = id, hasID
	if !m.sentAt.IsZero() {
		s.maxLatency = max(s.maxLatency, now.Sub(m.sentAt))
	}
	s.journal.Add(journal.NewFold(m.messageID, m.sentAt, now))
	return true
}

// setConnected records that a session started or ended consuming.
func (s *state) setConnected(c bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = c
	if c {
		s.sessions++
	}
}

// stateJSON is the body of GET /state.
type stateJSON struct {
	Count        int     `json:"count"`
	Hash         string  `json:"hash"`
	Last         string  `json:"last"`
	Connected    bool    `json:"connected"`
	Reconnects   int     `json:"reconnects"`
	MaxLatencyMS float64 `json:"max_latency_ms"`
	Skipped      int     `json:"skipped_redeliveries"`
}

func (s *state) snapshot() stateJSON {
	s.mu.Lock()
	defer s.mu.Unlock()
	return stateJSON{
		Count:        s.count,
		Hash:         s.chain.Hex(),
		Last:         s.last,
		Connected:    s.connected,
		Reconnects:   max(0, s.sessions-1),
		MaxLatencyMS: float64(s.maxLatency) / float64(time.Millisecond),
		Skipped:      s.skipped,
	}
}

// folds is the body of GET /folds: the journal, oldest first.
func (s *state) folds() journal.Folds {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.journal.Snapshot()
}

// handler serves the state. A reply that cannot be written means the client
// went away: there is no one left to tell, so those errors are dropped.
func (s *state) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.snapshot())
	})
	mux.HandleFunc("GET /folds", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.folds())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
