package cluster

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Faults the tests inject into a running cluster: the broker cut off from
// the nodes, a node's kubelet stopped.

// brokerCutTable is the nftables table of CutBroker, in each node's
// namespace.
const brokerCutTable = "ms2m_brokercut"

// brokerPorts are the broker's ports as the nodes reach them on HostIP:
// AMQP, streams, their TLS listeners, and NATS.
var brokerPorts = []int{AMQPPort, StreamPort, 5671, 5551, NATSPort}

// CutBroker takes the broker away from the nodes for d, as a broker
// restart does to its clients: every connection a node or a pod has to the
// broker's ports on HostIP (AMQP, streams, their TLS listeners, NATS) is
// reset at once, on both ends, and new ones are refused (a reset answers
// the SYN, as a closed port does) until d has passed. The broker itself
// runs on (its queues, streams and their contents are kept, as RabbitMQ
// keeps durable queues across a restart), and so do connections from the
// host's own processes. It returns once the cut is in place, with the
// number of connections it reset; end lifts the cut early and is safe to
// call after d.
//
// The refusal is an nftables table in each node's namespace whose one
// address element carries the timeout d, so the kernel lifts the cut by
// itself even if the caller dies; the reset is the kernel's socket destroy
// (`ss -K`) of the broker's and the forwarders' ends, on the host, of the
// connections from the nodes and pods (their source is not HostIP). The
// broker's own wildcard listeners serve the nodes directly on HostIP (see
// ServeHost), so a cut in the forwarders alone would miss them.
func (c *Cluster) CutBroker(d time.Duration) (reset int, end func() error, err error) {
	if d <= 0 {
		return 0, nil, fmt.Errorf("cut the broker: duration %v, want > 0", d)
	}
	end = func() error {
		var errs []error
		for i := 1; i <= c.nodes; i++ {
			if _, err := nftIn(i, "add table inet "+brokerCutTable+"\ndelete table inet "+brokerCutTable+"\n"); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	rules := brokerCutRules(d)
	for i := 1; i <= c.nodes; i++ {
		if _, err := nftIn(i, rules); err != nil {
			return 0, nil, errors.Join(fmt.Errorf("cut the broker from %s: %w", NodeName(i), err), end())
		}
	}
	out, err := run("ss", "-K", "-t", "-n", "-H", "state", "established", brokerConnFilter())
	if err != nil {
		return 0, nil, errors.Join(fmt.Errorf("reset the nodes' broker connections: %w", err), end())
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) != "" {
			reset++
		}
	}
	return reset, end, nil
}

// brokerCutRules is the nftables script of CutBroker for one node: the
// table made anew, with HostIP in a set for d. A reset passes (the host's
// socket destroy sends one to each pod), anything else to or from the
// broker's ports on HostIP, forwarded for a pod or the node's own, is
// answered with a reset.
func brokerCutRules(d time.Duration) string {
	ports := make([]string, len(brokerPorts))
	for i, p := range brokerPorts {
		ports[i] = strconv.Itoa(p)
	}
	set := strings.Join(ports, ", ")
	chain := func(name, hook string) string {
		return fmt.Sprintf(`	chain %s {
		type filter hook %s priority -10; policy accept;
		tcp flags & rst != 0 accept
		ip daddr @cut tcp dport { %s } reject with tcp reset
		ip saddr @cut tcp sport { %s } reject with tcp reset
	}
`, name, hook, set, set)
	}
	return fmt.Sprintf(`add table inet %[1]s
delete table inet %[1]s
table inet %[1]s {
	set cut {
		type ipv4_addr
		flags timeout
		elements = { %[2]s timeout %[3]dms }
	}
%[4]s%[5]s}
`, brokerCutTable, HostIP, d.Milliseconds(), chain("forward", "forward"), chain("output", "output"))
}

// brokerConnFilter is the ss filter of the host's ends of the nodes' and
// pods' connections to the broker's ports on HostIP.
func brokerConnFilter() string {
	var ports []string
	for _, p := range brokerPorts {
		ports = append(ports, "sport = :"+strconv.Itoa(p))
	}
	return fmt.Sprintf("src %s and not dst %s and ( %s )", HostIP, HostIP, strings.Join(ports, " or "))
}

// nftIn runs an nftables script in node i's network namespace.
func nftIn(i int, script string) (string, error) {
	cmd := exec.Command("nsenter", "--net="+netnsPath(i), "--", "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nft in %s: %w: %s", NodeName(i), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// StopKubelet stops node i's kubelet (SIGSTOP) until start is called
// (SIGCONT): its API accepts connections but answers nothing, pods bound
// to the node are not started and deleted ones are not confirmed gone,
// while the containers that run go on running. start is safe to call more
// than once. A kubelet a dead caller left stopped is continued by the next
// Up that finds the cluster running.
func (c *Cluster) StopKubelet(i int) (start func() error, err error) {
	if i < 1 || i > c.nodes {
		return nil, fmt.Errorf("stop the kubelet: no node %d (the cluster has %d)", i, c.nodes)
	}
	pid, ok := running(c.l, compKubelet(i))
	if !ok {
		return nil, fmt.Errorf("stop the kubelet of %s: it does not run", NodeName(i))
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("stop the kubelet of %s (pid %d): %w", NodeName(i), pid, err)
	}
	return func() error {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("continue the kubelet of %s (pid %d): %w", NodeName(i), pid, err)
		}
		return nil
	}, nil
}

// continueKubelets sends SIGCONT to the running kubelets, for a cluster
// found up: a test that died between StopKubelet and start left one
// stopped.
func continueKubelets(l layout, nodes int) {
	for i := 1; i <= nodes; i++ {
		if pid, ok := running(l, compKubelet(i)); ok {
			_ = syscall.Kill(pid, syscall.SIGCONT) // a kubelet that just exited is no matter
		}
	}
}
