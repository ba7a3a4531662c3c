package contract

import (
	"fmt"
	"slices"
	"strings"
)

// Strategy names a way to migrate: the value of AnnotationStrategy and of
// the migrator's --strategy.
type Strategy string

const (
	// StrategyAuto picks by owner: statefulset-shadow for a StatefulSet's
	// pod, ms2m for any other.
	StrategyAuto Strategy = "auto"
	// StrategyStopAndCopy stops the source at a cutoff, checkpoints it, and
	// restores the target; nothing consumes in between.
	StrategyStopAndCopy Strategy = "stop-and-copy"
	// StrategyMS2M checkpoints the source while it keeps serving, restores
	// the target, lets it replay the log, and hands over at a cutoff.
	StrategyMS2M Strategy = "ms2m"
	// StrategyMS2MCutoff is ms2m with the source stopped once T_cutoff has
	// passed since the target began to replay, T_cutoff = T_replay_max × μ
	// / λ (the paper's eq. 5, λ and μ measured live by the sidecars), so
	// that the replay after the stop stays bounded as λ approaches μ.
	StrategyMS2MCutoff Strategy = "ms2m-cutoff"
	// StrategyStatefulSet is the paper's strategy for a StatefulSet pod,
	// whose name is its identity: checkpoint it while it serves, stop it at
	// a cutoff once the image is pushed, and delete it; the StatefulSet
	// controller recreates the pod, the webhook turns it into a restore on
	// the target node (from the pending-migration ConfigMap), and it
	// replays to the cutoff. Down from the stop until the new pod consumes.
	StrategyStatefulSet Strategy = "statefulset"
	// StrategyStatefulSetShadow gives a StatefulSet pod ms2m's downtime: a
	// shadow pod on the target node takes over from the source by the ms2m
	// handoff; then the source is deleted, the StatefulSet's recreated pod
	// is restored from a checkpoint of the shadow on the same node, and
	// takes over from the shadow by the same handoff.
	StrategyStatefulSetShadow Strategy = "statefulset-shadow"
	// StrategyCRIUAlone checkpoints and restores with no quiesce and no
	// replay: the baseline that shows what replay is for. It loses what
	// the source handled after its checkpoint.
	StrategyCRIUAlone Strategy = "criu-alone"
)

// Strategies are every strategy the webhook admits in AnnotationStrategy
// and the migrator runs, auto first, then in the order of the design.
var Strategies = []Strategy{
	StrategyAuto,
	StrategyStopAndCopy,
	StrategyMS2M,
	StrategyMS2MCutoff,
	StrategyStatefulSet,
	StrategyStatefulSetShadow,
	StrategyCRIUAlone,
}

// StrategyNames are Strategies as strings, in the same order.
func StrategyNames() []string { return names(Strategies) }

// Valid reports whether s is one of Strategies.
func (s Strategy) Valid() bool { return slices.Contains(Strategies, s) }

// ParseStrategy reads a strategy by name; "" is StrategyAuto. The error
// names the strategies there are.
func ParseStrategy(s string) (Strategy, error) {
	if s == "" {
		return StrategyAuto, nil
	}
	if st := Strategy(s); st.Valid() {
		return st, nil
	}
	return "", fmt.Errorf("%q is not a strategy; want one of %s", s, strings.Join(StrategyNames(), ", "))
}

// CutoffRule is how ms2m-cutoff decides when to stop the source: the value
// of AnnotationCutoff and of the migrator's --cutoff.
type CutoffRule string

const (
	// CutoffFormula stops the source once T_cutoff (the paper's eq. 5,
	// sized by λ and μ when the handover begins) has passed.
	CutoffFormula CutoffRule = "formula"
	// CutoffAdaptive stops it as soon as the target's live backlog can be
	// replayed within T_replay_max at the target's live rate, and at the
	// latest when T_cutoff passes: the bound on the replay after the stop
	// holds however the rates move, and the source stops no later than by
	// the formula.
	CutoffAdaptive CutoffRule = "adaptive"
)

// CutoffRules are every stop rule, the default first.
var CutoffRules = []CutoffRule{CutoffFormula, CutoffAdaptive}

// CutoffRuleNames are CutoffRules as strings, in the same order.
func CutoffRuleNames() []string { return names(CutoffRules) }

// Valid reports whether r is one of CutoffRules.
func (r CutoffRule) Valid() bool { return slices.Contains(CutoffRules, r) }

// ParseCutoffRule reads a rule by name; "" is CutoffFormula. The error
// names the rules there are.
func ParseCutoffRule(s string) (CutoffRule, error) {
	if s == "" {
		return CutoffFormula, nil
	}
	if r := CutoffRule(s); r.Valid() {
		return r, nil
	}
	return "", fmt.Errorf("unknown cutoff rule %q (want %s)", s, strings.Join(CutoffRuleNames(), " or "))
}

func names[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}
