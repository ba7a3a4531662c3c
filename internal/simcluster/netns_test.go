package simcluster

import (
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestPickSubnet: a cluster takes the first /24 of 10.78.0.0/16 that no
// route of the host holds, so that two clusters on one machine never share
// one (the API server would reach the other's kubelet); broader routes do
// not count.
func TestPickSubnet(t *testing.T) {
	for _, tc := range []struct {
		name   string
		routes string // `ip -4 route show table all`
		want   string
	}{
		{"nothing routed", "default via 192.0.2.1 dev eth0\n192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2\n", "10.78.0."},
		{"another cluster's subnet", `default via 192.0.2.1 dev eth0
10.78.0.0/24 dev ms2msim4870 proto kernel scope link src 10.78.0.1
local 10.78.0.1 dev ms2msim4870 table local proto kernel scope host src 10.78.0.1
broadcast 10.78.0.255 dev ms2msim4870 table local proto kernel scope link src 10.78.0.1
local 127.0.0.0/8 dev lo table local proto kernel scope host src 127.0.0.1
`, "10.78.1."},
		{"two others", "10.78.0.0/24 dev a\n10.78.1.0/24 dev b\n", "10.78.2."},
		{"a gap", "10.78.0.0/24 dev a\n10.78.2.0/24 dev b\n", "10.78.1."},
		{"an address alone", "local 10.78.0.7 dev x table local\n", "10.78.1."},
		{"a smaller route inside", "unreachable 10.78.0.128/25\n", "10.78.1."},
		{"broader routes", "10.0.0.0/8 via 192.0.2.9 dev eth0\n10.78.0.0/16 dev vpn0\n", "10.78.0."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pickSubnet(routed(tc.routes))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("subnet (-want +got):\n%s", diff)
			}
		})
	}
	var all string
	for i := 0; i < 256; i++ {
		all += "10.78." + strconv.Itoa(i) + ".0/24 dev x\n"
	}
	if got, err := pickSubnet(routed(all)); err == nil {
		t.Errorf("every /24 routed: got %q, want an error", got)
	}
}

// TestOwnerLock: a namespace is the live process's while it holds the
// namespace's owner lock, whatever the process is named (the soak's
// namespaces were taken for stale ones, as its binary is not a .test);
// one without a lock file is left to the older rule.
func TestOwnerLock(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	name := "ms2m-sim-test-owner"
	if _, known := ownerAlive(name); known {
		t.Fatalf("a namespace without an owner lock is known")
	}
	f, err := holdOwner(name)
	if err != nil {
		t.Fatal(err)
	}
	if alive, known := ownerAlive(name); !alive || !known {
		t.Errorf("a held owner lock: alive %v, known %v; want both", alive, known)
	}
	if _, err := holdOwner(name); err == nil {
		t.Errorf("a second holder of the same namespace: want an error")
	}
	f.Close()
	if alive, known := ownerAlive(name); alive || !known {
		t.Errorf("a released owner lock: alive %v, known %v; want dead and known", alive, known)
	}
	if _, known := ownerAlive(name); known {
		t.Errorf("a stale lock file is not removed once seen")
	}
}
