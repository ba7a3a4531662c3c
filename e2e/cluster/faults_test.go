package cluster

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/testenv"
)

// TestBrokerCutRules checks CutBroker's nftables script with nft's own
// parser (check mode: nothing is applied) and its ss filter with ss: a
// script nft refuses would make every CutBroker fail on a real cluster.
func TestBrokerCutRules(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		testenv.Missing(t, "nft (nftables)", "apt-get install nftables")
	}
	if _, err := exec.LookPath("ss"); err != nil {
		testenv.Missing(t, "ss (iproute2)", "apt-get install iproute2")
	}
	script := brokerCutRules(1500 * time.Millisecond)
	for _, want := range []string{"table inet " + brokerCutTable, HostIP + " timeout 1500ms", "hook forward", "hook output", "5672", "5552", "4222"} {
		if !strings.Contains(script, want) {
			t.Errorf("the script lacks %q:\n%s", want, script)
		}
	}
	cmd := exec.Command("nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("nft -c refuses the script: %v: %s\n%s", err, out, script)
	}
	// Listing (not -K) with the filter: ss parses it or fails.
	if out, err := exec.Command("ss", "-t", "-n", "-H", "state", "established", brokerConnFilter()).CombinedOutput(); err != nil {
		t.Errorf("ss refuses the filter %q: %v: %s", brokerConnFilter(), err, out)
	}
}
