package contract

import (
	"strings"
	"testing"
)

func TestParseStrategy(t *testing.T) {
	for in, want := range map[string]Strategy{
		"":                   StrategyAuto,
		"auto":               StrategyAuto,
		"stop-and-copy":      StrategyStopAndCopy,
		"ms2m":               StrategyMS2M,
		"ms2m-cutoff":        StrategyMS2MCutoff,
		"statefulset":        StrategyStatefulSet,
		"statefulset-shadow": StrategyStatefulSetShadow,
		"criu-alone":         StrategyCRIUAlone,
	} {
		if got, err := ParseStrategy(in); err != nil || got != want {
			t.Errorf("ParseStrategy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"teleport", "MS2M", " ms2m", "ms2m "} {
		_, err := ParseStrategy(in)
		if err == nil || !strings.Contains(err.Error(), "is not a strategy; want one of auto, stop-and-copy, ms2m, ms2m-cutoff, statefulset, statefulset-shadow, criu-alone") {
			t.Errorf("ParseStrategy(%q): %v, want an error naming every strategy", in, err)
		}
	}
	if Strategy("").Valid() {
		t.Error(`Strategy("").Valid(): an empty annotation is not a strategy`)
	}
}

func TestParseCutoffRule(t *testing.T) {
	for in, want := range map[string]CutoffRule{"": CutoffFormula, "formula": CutoffFormula, "adaptive": CutoffAdaptive} {
		if got, err := ParseCutoffRule(in); err != nil || got != want {
			t.Errorf("ParseCutoffRule(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseCutoffRule("eq5"); err == nil || !strings.Contains(err.Error(), `unknown cutoff rule "eq5" (want formula or adaptive)`) {
		t.Errorf("ParseCutoffRule(eq5): %v", err)
	}
}
