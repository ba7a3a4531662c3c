package controller

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/sign"
)

// Phase is where a requested migration is.
type Phase string

const (
	PhaseRunning    Phase = "Running"
	PhaseSucceeded  Phase = "Succeeded"
	PhaseFailed     Phase = "Failed"
	PhaseRolledBack Phase = "RolledBack"
)

// Status is the JSON in inject.AnnotationMigrationStatus: the pod's last
// request and what became of it, and the ones before.
type Status struct {
	Name      string          `json:"name"`
	Phase     Phase           `json:"phase"`
	Strategy  string          `json:"strategy"`
	Source    string          `json:"source,omitempty"` // node the pod ran on
	Target    string          `json:"target"`           // node
	TargetPod string          `json:"targetPod"`        // pod
	Started   time.Time       `json:"started"`
	Message   string          `json:"message,omitempty"`
	Report    *migrate.Report `json:"report,omitempty"`
	// History is the pod's last requests that ended (this one included
	// once it has), newest first, at most HistoryLen. It goes from the
	// source to the target with each migration.
	History []Entry `json:"history,omitempty"`
}

// HistoryLen is how many ended requests a Status keeps.
const HistoryLen = 5

// Entry is one ended request in a Status's History.
type Entry struct {
	Name     string        `json:"name,omitempty"` // "" for a request refused before it was named
	Outcome  Phase         `json:"outcome"`
	From     string        `json:"from,omitempty"` // node
	To       string        `json:"to"`             // node
	Started  time.Time     `json:"started"`
	Total    time.Duration `json:"total,omitempty"`
	Downtime time.Duration `json:"downtime,omitempty"`
}

// ended returns st with its own Entry first in its History, once st has
// ended; st itself is not changed.
func (st Status) ended() Status {
	if st.Phase == PhaseRunning || st.Phase == "" {
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
	v, ok := p.Annotations[inject.AnnotationMigrationStatus]
	if !ok {
		return Status{}, false, nil
	}
	st, err := DecodeStatus(v)
	if err != nil {
		return Status{}, true, fmt.Errorf("annotation %s is not the migrator's JSON: %w", inject.AnnotationMigrationStatus, err)
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
	strategy  migrate.Strategy
	replayMax time.Duration
	cutoff    migrate.CutoffRule
}

// parseRequest reads and checks the request annotations. The webhook
// checked their syntax when the pod was admitted; annotations added later
// are checked here, with messages that name the annotation.
func parseRequest(p *corev1.Pod) (request, error) {
	r := request{node: p.Annotations[inject.AnnotationMigrateTo], strategy: migrate.MS2M}
	if r.node == "" {
		return r, fmt.Errorf("annotation %s is empty: name the target node", inject.AnnotationMigrateTo)
	}
	switch s := migrate.Strategy(p.Annotations[inject.AnnotationStrategy]); s {
	case "", migrate.Auto:
		r.strategy = migrate.ByOwner(p)
	case migrate.MS2M, migrate.MS2MCutoff, migrate.StopAndCopy, migrate.CRIUAlone, migrate.StatefulSet, migrate.StatefulSetShadow:
		r.strategy = s
	default:
		return r, fmt.Errorf("annotation %s: %q is not a strategy; want one of %s", inject.AnnotationStrategy, s, strategyList())
	}
	if v, ok := p.Annotations[inject.AnnotationCutoff]; ok {
		rule, err := migrate.ParseCutoffRule(v)
		if err != nil {
			return r, fmt.Errorf("annotation %s: %w", inject.AnnotationCutoff, err)
		}
		r.cutoff = rule
	}
	if v := p.Annotations[inject.AnnotationReplayMax]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return r, fmt.Errorf("annotation %s: %q is not a positive Go duration like 5s", inject.AnnotationReplayMax, v)
		}
		r.replayMax = d
	}
	return r, nil
}

func strategyList() string {
	var names []string
	for _, s := range migrate.Strategies {
		names = append(names, string(s))
	}
	return strings.Join(names, ", ")
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
	raw, ok := p.Annotations[inject.AnnotationMigrationStatus]
	sig := p.Annotations[inject.AnnotationMigrationStatusSignature]
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
		inject.AnnotationMigrationStatus:          raw,
		inject.AnnotationMigrationStatusSignature: statusSignature(key, namespace, raw),
	}
}
