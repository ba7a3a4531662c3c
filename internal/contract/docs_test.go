package contract

import (
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// declared type-checks this package's non-test files and returns its
// string constants whose names start with prefix, name to value: the keys
// and reasons as the compiler sees them, so that a constant added without
// a list entry or a docs row is found.
func declared(t *testing.T, prefix string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	// The files that declare constants import nothing; the rest (parse
	// functions) are left out, so no importer is needed.
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Imports) == 0 {
			files = append(files, f)
		}
	}
	pkg, err := (&types.Config{}).Check("contract", fset, files, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, name := range pkg.Scope().Names() {
		c, ok := pkg.Scope().Lookup(name).(*types.Const)
		if ok && strings.HasPrefix(name, prefix) && c.Val().Kind() == constant.String {
			out[name] = constant.StringVal(c.Val())
		}
	}
	return out
}

// section returns the lines of the markdown file path from the heading
// that starts with heading up to the next heading of the same or a higher
// level.
func section(t *testing.T, path, heading string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	level := strings.Index(heading, " ")
	var out []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		if h := strings.Index(l, " "); h > 0 && strings.Trim(l[:h], "#") == "" {
			if in && h <= level {
				break
			}
			if strings.HasPrefix(l, heading) {
				in = true
				continue
			}
		}
		if in {
			out = append(out, l)
		}
	}
	if !in {
		t.Fatalf("%s: no section %q", path, heading)
	}
	return out
}

// rows are the data rows of the markdown tables in lines, as cells.
func rows(lines []string) [][]string {
	var out [][]string
	for _, l := range lines {
		if !strings.HasPrefix(l, "|") || strings.HasPrefix(l, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		out = append(out, cells)
	}
	return out
}

var backticked = regexp.MustCompile("`([^`]+)`")

// words are the backticked words of s that are plain names (lower-case
// letters, digits and '-', not starting with '-'): strategies and rules,
// not flags, keys or key=value examples.
func words(s string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(s, -1) {
		if regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`).MatchString(m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return slices.Compact(s)
}

// The docs users read say what the code does: docs/webhook.md's table of
// annotations and labels has one row per key the contract declares (a
// label's row says it is a label), with the strategies and cutoff rules
// the contract has; its Events section lists every reason; and
// docs/usage.md's lists of strategies, for the annotation and for
// `migrator migrate --strategy`, are Strategies.
func TestDocsMatchContract(t *testing.T) {
	annotations, labels := declared(t, "Annotation"), declared(t, "Label")
	var known []string
	for k := range KnownAnnotations {
		known = append(known, k)
	}
	var annValues []string
	for _, v := range annotations {
		annValues = append(annValues, v)
	}
	if diff := cmp.Diff(sorted(annValues), sorted(known)); diff != "" {
		t.Errorf("KnownAnnotations against the Annotation constants (-constants +known):\n%s", diff)
	}

	// docs/webhook.md, the annotations and labels.
	var gotAnn, gotLabels []string
	strategyRow, cutoffRow := "", ""
	for _, r := range rows(section(t, "../../docs/webhook.md", "## Annotations and labels")) {
		if len(r) < 4 || !strings.HasPrefix(r[0], "`"+Prefix) {
			continue
		}
		key := strings.Trim(r[0], "`")
		if strings.Contains(r[1], "label") {
			gotLabels = append(gotLabels, key)
		} else {
			gotAnn = append(gotAnn, key)
		}
		switch key {
		case AnnotationStrategy:
			strategyRow = r[3]
		case AnnotationCutoff:
			cutoffRow = r[3]
		}
	}
	var wantLabels []string
	for _, v := range labels {
		wantLabels = append(wantLabels, v)
	}
	if diff := cmp.Diff(sorted(annValues), sorted(gotAnn)); diff != "" {
		t.Errorf("docs/webhook.md's annotation rows against the contract (-contract +docs):\n%s", diff)
	}
	if diff := cmp.Diff(sorted(wantLabels), sorted(gotLabels)); diff != "" {
		t.Errorf("docs/webhook.md's label rows (\"on\" says label) against the contract (-contract +docs):\n%s", diff)
	}
	if diff := cmp.Diff(sorted(StrategyNames()), sorted(words(strategyRow))); diff != "" {
		t.Errorf("docs/webhook.md, %s: strategies (-contract +docs):\n%s", AnnotationStrategy, diff)
	}
	if diff := cmp.Diff(sorted(CutoffRuleNames()), sorted(words(cutoffRow))); diff != "" {
		t.Errorf("docs/webhook.md, %s: cutoff rules (-contract +docs):\n%s", AnnotationCutoff, diff)
	}

	// docs/webhook.md, the Events.
	reasons := declared(t, "Reason")
	var want []string
	for name, v := range reasons {
		if name != "Reason"+v {
			t.Errorf("constant %s = %q: name a reason Reason and its value", name, v)
		}
		want = append(want, v)
	}
	if diff := cmp.Diff(sorted(want), sorted(append(slices.Clone(WebhookReasons), ControllerReasons...))); diff != "" {
		t.Errorf("WebhookReasons and ControllerReasons against the Reason constants (-constants +lists):\n%s", diff)
	}
	var gotReasons []string
	for _, r := range rows(section(t, "../../docs/webhook.md", "## Events")) {
		if m := backticked.FindStringSubmatch(r[0]); m != nil && m[0] == r[0] {
			gotReasons = append(gotReasons, m[1])
		}
	}
	if diff := cmp.Diff(sorted(want), sorted(gotReasons)); diff != "" {
		t.Errorf("docs/webhook.md's Event tables against the contract (-contract +docs):\n%s", diff)
	}

	// docs/usage.md: the annotation's strategies, and the CLI's.
	usage, err := os.ReadFile("../../docs/usage.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(usage)
	const choose = "choose the strategy with `" + AnnotationStrategy + "`"
	i := strings.Index(text, choose)
	if i < 0 {
		t.Fatalf("docs/usage.md no longer says %q", choose)
	}
	para := text[i:]
	para = para[:strings.Index(para, "\n\n")]
	if diff := cmp.Diff(sorted(StrategyNames()), sorted(words(strings.TrimPrefix(para, choose)))); diff != "" {
		t.Errorf("docs/usage.md, the strategies for %s (-contract +docs):\n%s", AnnotationStrategy, diff)
	}
	var cli []string
	for _, r := range rows(strings.Split(text, "\n")) {
		if len(r) >= 2 && r[0] == "`--strategy`" {
			cli = words(r[1])
		}
	}
	if diff := cmp.Diff(sorted(StrategyNames()), sorted(cli)); diff != "" {
		t.Errorf("docs/usage.md, migrator migrate --strategy (-contract +docs):\n%s", diff)
	}
}
