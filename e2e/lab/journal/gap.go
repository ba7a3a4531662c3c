package journal

import (
	"slices"
	"time"
)

// Fold is one entry of a consumer's journal: a folded message's numeric
// message-id (-1 without one), its latency from the producer's x-sent-at
// header (-1 without one), and when it was folded and sent, in Unix
// nanoseconds (SentNS is 0 without the header).
type Fold struct {
	ID        int64   `json:"id"`
	LatencyMS float64 `json:"latency_ms"`
	AtNS      int64   `json:"at_ns"`
	SentNS    int64   `json:"sent_ns"`
}

// Gap is an interval of the processing gap's kind: from Start to End no
// instance finished a message, and one was waiting throughout. The zero
// Gap is none.
type Gap struct {
	Start, End time.Time
}

// Duration is End - Start, 0 for the zero Gap.
func (g Gap) Duration() time.Duration { return g.End.Sub(g.Start) }

// SendTimes collects the producer's send time of every message that some
// journal folded, from the x-sent-at the producer stamped on it. A
// message that no instance folded is missing, and so does not count as
// waiting: a lost message shows in the hash, not here.
func SendTimes(journals [][]Fold) map[int64]time.Time {
	sent := map[int64]time.Time{}
	for _, j := range journals {
		for _, f := range j {
			if f.ID >= 0 && f.SentNS != 0 {
				sent[f.ID] = time.Unix(0, f.SentNS)
			}
		}
	}
	return sent
}

// ProcessingGap is the longest interval that overlaps the migration's
// window [from, to] in which no instance finished processing a message
// while at least one message was waiting: sent (sent, by message-id) and
// not yet processed by any instance.
//
// journals are those of every instance that served (source, shadow,
// target), in any order. A message is processed when it is first folded,
// in whichever journal: a restored instance's journal also holds the folds
// it inherited from the checkpoint, with their original times, and an
// instance that replays a message processed before does no new work for
// anyone waiting. Folds without a numeric id are ignored.
//
// An interval is counted whole when it overlaps the window: a stall that
// began just before the migration or ended just after it (the target's
// first message, which it finishes after the migrator returned) is still
// the migration's. Messages still waiting at the end make an interval that
// ends at to. All times are read from one clock: the instances run on one
// host, so there is no skew to correct.
func ProcessingGap(journals [][]Fold, sent map[int64]time.Time, from, to time.Time) Gap {
	first := map[int64]int64{} // id -> earliest fold, Unix ns
	for _, j := range journals {
		for _, f := range j {
			if f.ID < 0 {
				continue
			}
			if at, ok := first[f.ID]; !ok || f.AtNS < at {
				first[f.ID] = f.AtNS
			}
		}
	}
	// The events in time order: a message starts waiting at its send and
	// stops at its first fold; every first fold is progress.
	type event struct {
		at   int64
		fold bool // a first fold; otherwise a send
		wait bool // the fold ends a wait its send began
	}
	var events []event
	for id, at := range first {
		s, ok := sent[id]
		events = append(events, event{at: at, fold: true, wait: ok && s.UnixNano() < at})
	}
	for id, s := range sent {
		if at, ok := first[id]; !ok || s.UnixNano() < at { // one folded as it was sent never waited
			events = append(events, event{at: s.UnixNano()})
		}
	}
	// At one instant, folds before sends: a message sent as another is
	// folded does not make that fold end a wait.
	slices.SortFunc(events, func(a, b event) int {
		if a.at != b.at {
			return int(min(max(a.at-b.at, -1), 1))
		}
		switch {
		case a.fold == b.fold:
			return 0
		case a.fold:
			return -1
		}
		return 1
	})

	var best Gap
	consider := func(start, end int64) {
		g := Gap{Start: time.Unix(0, start), End: time.Unix(0, end)}
		if g.End.After(from) && g.Start.Before(to) && g.Duration() > best.Duration() {
			best = g
		}
	}
	waiting := 0
	var since int64 // the start of the current interval, while waiting > 0
	for _, e := range events {
		if !e.fold {
			if waiting == 0 {
				since = e.at
			}
			waiting++
			continue
		}
		if waiting > 0 {
			consider(since, e.at)
		}
		if e.wait {
			waiting--
		}
		since = e.at
	}
	if waiting > 0 && since < to.UnixNano() {
		consider(since, to.UnixNano())
	}
	return best
}
