package sidecar_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/ms2m/ms2m/internal/sidecar"
)

// TestEveryVariableIsDocumented: each variable the sidecar reads has a row
// in docs/sidecar.md, and the row gives the same default.
func TestEveryVariableIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/sidecar.md")
	if err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{} // variable → its row's default column
	for _, line := range strings.Split(string(doc), "\n") {
		if cols := strings.Split(line, "|"); len(cols) > 3 && strings.HasPrefix(line, "| `MS2M_") {
			defaults[strings.Trim(cols[1], " `")] = strings.TrimSpace(cols[2])
		}
	}
	typ := reflect.TypeFor[sidecar.Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" {
			continue
		}
		doc, ok := defaults[name]
		if !ok {
			t.Errorf("%s (Config.%s) has no row in docs/sidecar.md", name, f.Name)
			continue
		}
		if def, ok := f.Tag.Lookup("envDefault"); ok && doc != "`"+def+"`" {
			t.Errorf("docs/sidecar.md gives %s the default %s, the code %q", name, doc, def)
		}
	}
}
