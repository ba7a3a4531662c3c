package controller

import (
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/sign"
)

// Status is the JSON in contract.AnnotationMigrationStatus: the pod's last
// request and what became of it, and the ones before.
type Status struct {
	Name      string          `json:"name"`
	Phase     contract.Phase  `json:"phase"`
	Strategy  string          `json:"strategy"`
	Source    string          `json:"source,omitempty"` // node the pod ran on
	Target    string          `json:"target"`           // node
	TargetPod string          `json:"targetPod"`        // pod
	Started   time.Time       `json:"started"`
	Message   string          `json:"message,omitempty"`
	Report    *migrate.Report `json:"report,omitempty"`
	// Evacuation is the node the pod was evacuated from, when its
	// eviction became this migration (contract.AnnotationEvacuate).
	Evacuation string `json:"evacuation,omitempty"`
	// History is the pod's last requests that ended (this one included
	// once it has), newest first, at most HistoryLen. It goes from the
	// source to the target with each migration.
	History []Entry `json:"history,omitempty"`
}

// HistoryLen is how many ended requests a Status keeps.
const HistoryLen = 5

// Entry is one ended request in a Status's History.
type Entry struct {
	Name     string         `json:"name,omitempty"` // "" for a request refused before it was named
	Outcome  contract.Phase `json:"outcome"`
	From     string         `json:"from,omitempty"` // node
	To       string         `json:"to"`             // node
	Started  time.Time      `json:"started"`
	Total    time.Duration  `json:"total,omitempty"`
	Downtime time.Duration  `json:"downtime,omitempty"`
}

// ended returns st with its own Entry first in its History, once st has
// ended; st itself is not changed.
func (st Status) ended() Status {
	if st.Phase == contract.PhaseRunning || st.Phase == "" {
		return st
	}
	e := Entry{Name: st.Name, Outcome: st.Phase, From: st.Source, To: st.Target, Started: st.Started}
	if st.Report != nil {
		e.Total, e.Downtime = st.Report.Total, st.Report.Downtime
	}
	h := make([]Entry, 0, HistoryLen)
	h = append(h, e)
	for _, old := range st.History {
		if len(h) == HistoryLen {
			break
		}
		if old.Name != "" && old.Name == e.Name {
			continue // recorded already (a status written again)
		}
		h = append(h, old)
	}
	st.History = h
	return st
}

// statusOf reads a pod's migration status, if it has one.
func statusOf(p *corev1.Pod) (Status, bool, error) {
	v, ok := p.Annotations[contract.AnnotationMigrationStatus]
	if !ok {
		return Status{}, false, nil
	}
	st, err := DecodeStatus(v)
	if err != nil {
		return Status{}, true, fmt.Errorf("annotation %s is not the migrator's JSON: %w", contract.AnnotationMigrationStatus, err)
	}
	return st, true, nil
}

// DecodeStatus reads a Status from its JSON, wherever it was recorded.
func DecodeStatus(v string) (Status, error) {
	var st Status
	err := json.Unmarshal([]byte(v), &st)
	return st, err
}

func (st Status) encode() string {
	b, _ := json.Marshal(st)
	return string(b)
}

// request is a validated migration request.
type request struct {
	node      string
	strategy  contract.Strategy
	replayMax time.Duration
	cutoff    contract.CutoffRule
}

// parseRequest reads and checks the request annotations. The webhook
// checked their syntax when the pod was admitted; annotations added later
// are checked here, with messages that name the annotation.
func parseRequest(p *corev1.Pod) (request, error) {
	r := request{node: p.Annotations[contract.AnnotationMigrateTo], strategy: contract.StrategyMS2M}
	if r.node == "" {
		return r, fmt.Errorf("annotation %s is empty: name the target node", contract.AnnotationMigrateTo)
	}
	s, err := contract.ParseStrategy(p.Annotations[contract.AnnotationStrategy])
	if err != nil {
		return r, fmt.Errorf("annotation %s: %w", contract.AnnotationStrategy, err)
	}
	r.strategy = s
	if s == contract.StrategyAuto {
		r.strategy = migrate.ByOwner(p)
	}
	if v, ok := p.Annotations[contract.AnnotationCutoff]; ok {
		rule, err := contract.ParseCutoffRule(v)
		if err != nil {
			return r, fmt.Errorf("annotation %s: %w", contract.AnnotationCutoff, err)
		}
		r.cutoff = rule
	}
	if v := p.Annotations[contract.AnnotationReplayMax]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return r, fmt.Errorf("annotation %s: %q is not a positive Go duration like 5s", contract.AnnotationReplayMax, v)
		}
		r.replayMax = d
	}
	return r, nil
}

// A status is trusted only if the controller signed it: an HMAC-SHA256,
// with the controller's key, over the pod's namespace and the status JSON
// exactly as written (which names the migration). It binds neither the
// pod's name nor its UID, since a migrated pod carries its history on
// under a new name and UID; so a tenant can copy a signed status only
// between pods of its own namespace, where what it names (target pod,
// images of that migration) is its own already.
const statusSigContext = "ms2m.io/migration-status/v1"

// statusSignature signs raw, the status JSON, for namespace.
func statusSignature(key []byte, namespace, raw string) string {
	return sign.MAC(key, statusSigContext, namespace, raw)
}

// signedByUs says whether p's status carries a valid signature by key.
// A status without one (forged, or written before statuses were signed)
// is not.
func signedByUs(key []byte, p *corev1.Pod) bool {
	raw, ok := p.Annotations[contract.AnnotationMigrationStatus]
	sig := p.Annotations[contract.AnnotationMigrationStatusSignature]
	if !ok || sig == "" {
		return false
	}
	return sign.Valid(key, sig, statusSigContext, p.Namespace, raw)
}

// SignedAnnotations are the annotations that record st on a pod of
// namespace, signed with key, as the controller writes them: for tests
// that make what a controller killed mid-migration leaves, and for a tool
// that shares the controller's key.
func SignedAnnotations(key []byte, namespace string, st Status) map[string]string {
	raw := st.encode()
	return map[string]string{
		contract.AnnotationMigrationStatus:          raw,
		contract.AnnotationMigrationStatusSignature: statusSignature(key, namespace, raw),
	}
}
