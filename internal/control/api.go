package control

import (
	"time"

	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/replay"
)

// The control API, by route:
//
//	GET  /state                      -> State
//	POST /quiesce?timeout=D          -> Cut
//	POST /resume?timeout=D[&hold=H]  -> ResumeResult (409 if H is not the hold in force)
//	POST /stop?timeout=D             -> StopResult
//	GET  /healthz, /readyz, /metrics (no token)
//
// An error answers ErrorResponse with a status: 400 bad input, 401 no or
// wrong token, 409 not allowed in the sidecar's mode (ErrConflict), 504 the
// timeout passed, 500 anything else.

// State is GET /state: the sidecar's mode, queues, log and, on a target,
// its replay.
type State struct {
	LogName string `json:"logName"`
	Ready   bool   `json:"ready"`
	proxy.State
	// Source is, on a target, what the log holds for its replay.
	Source *replay.Status `json:"source,omitempty"`
	// ReplayLag is, on a target, how many records the log holds beyond the
	// last one replayed to the app.
	ReplayLag *uint64 `json:"replayLag,omitempty"`
	// Hold is the hold of the quiesce in force, if any (see Cut.Hold).
	Hold string `json:"hold,omitempty"`
	// TookOver is, on a target whose sidecar restarted after it had taken
	// the log over, that takeover, read from its state folder: such a
	// sidecar serves as a source does, and is switched.
	TookOver *TakeOver `json:"tookOver,omitempty"`
}

// TakeOver is a target's takeover of the log, recorded when it switched.
type TakeOver struct {
	CutoffID   uint64    `json:"cutoffId"`
	Epoch      uint64    `json:"epoch"`
	SwitchedAt time.Time `json:"switchedAt"`
}

// Modes a State can show: the proxy's, and two of the sidecar's own.
const (
	ModeServing   = "serving"
	ModeQuiesced  = "quiesced"
	ModeStopped   = "stopped"
	ModeReplaying = "replaying" // a target that has not taken over yet
	ModeStarting  = "starting"  // its replay log is not open yet
)

// Cut is POST /quiesce: where a quiesced sidecar stands. A replay of a
// checkpoint taken now covers the IDs after ID, and waits for a cutoff
// marker of an epoch after Epoch.
type Cut struct {
	ID    uint64 `json:"checkpointId"`
	Epoch uint64 `json:"epoch"`
	// Hold names this quiesce. POST /resume?hold=Hold after the checkpoint
	// proves that the sidecar stayed quiesced all along; empty from a
	// sidecar that predates holds.
	Hold string `json:"hold,omitempty"`
}

// ResumeResult is POST /resume.
type ResumeResult struct {
	Mode string `json:"mode"`
}

// StopResult is POST /stop: the cutoff the sidecar's tenure ended at.
type StopResult struct {
	// StartedAt is when the stop began cancelling the app's consumers: from
	// then on the sidecar accepts no primary-queue deliveries.
	StartedAt time.Time `json:"startedAt"`
	CutoffID  uint64    `json:"cutoffId"`
	Epoch     uint64    `json:"epoch"`
	// Held counts deliveries held back since a quiesce that the stop gave
	// the app, at or before the cutoff; Requeued those it gave back to the
	// broker instead.
	Held      int       `json:"held"`
	Requeued  int       `json:"requeued"`
	StoppedAt time.Time `json:"stoppedAt"`
	// Recovered counts, for NATS push consumers, the deliveries the server
	// made during the stop to a subject no one listened on any more, which
	// the stop read back from the stream and logged before the cutoff: the
	// target replays them in order, and the app of this sidecar never had
	// them.
	Recovered int `json:"recovered,omitempty"`
}

// ErrorResponse is the body of every answer that is not 200 OK (but
// /readyz's, which is plain text).
type ErrorResponse struct {
	Error string `json:"error"`
}
