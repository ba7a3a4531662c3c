package inject

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The app's env vars that ms2m knows to hold a NATS server's address:
// nats.go's and nats-py's conventional NATS_URL, and NATS_SERVERS. Both may
// hold a comma-separated list of servers.
const (
	envNATSURL     = "NATS_URL"
	envNATSServers = "NATS_SERVERS"
)

var wellKnownNATSEnv = []string{envNATSURL, envNATSServers}

// defaultNATSPort is the NATS client port a URL implies when it names none.
const defaultNATSPort = 4222

// errNATSTLS: the NATS sidecar speaks plain NATS to the server, so a tls://
// server is left alone rather than downgraded.
var errNATSTLS = errors.New("a tls:// NATS server is not proxied: the NATS sidecar has no TLS to the server yet (docs/nats.md)")

// parseNATSAddr parses one NATS server address: nats://[user:password@]host[:port],
// or the same without the scheme. tls:// is errNATSTLS; other schemes are errors.
func parseNATSAddr(s string) (brokerAddr, error) {
	scheme, rest := "", s
	if i := strings.Index(s, "://"); i >= 0 {
		scheme, rest = s[:i], s[i+3:]
		switch strings.ToLower(scheme) {
		case "nats":
		case "tls":
			return brokerAddr{scheme: scheme}, errNATSTLS
		default:
			return brokerAddr{scheme: scheme}, fmt.Errorf("the scheme %q is not nats://", scheme)
		}
	}
	a, err := parseBrokerAddr(rest)
	a.scheme = scheme
	return a, err
}

// natsUpstream is the address's server as host:port, the port defaulted
// to NATS's.
func natsUpstream(a brokerAddr) string {
	port := a.port
	if port == "" {
		port = strconv.Itoa(defaultNATSPort)
	}
	return net.JoinHostPort(strings.ToLower(a.host), port)
}

// rewriteNATS points the app container's NATS settings (NATS_URL,
// NATS_SERVERS) at the sidecar on 127.0.0.1:listenPort. A list becomes its
// first server, rewritten: the sidecar proxies one server. Like
// rewriteBroker it reads only literal values; considered counts the vars it
// found.
func rewriteNATS(app *corev1.Container, listenPort int32) (r brokerRewrite, considered int) {
	edits := map[int]string{}
	var hits []hit
	for i, e := range app.Env {
		if e.Name != envNATSURL && e.Name != envNATSServers {
			continue
		}
		considered++
		if e.ValueFrom != nil {
			r.skipped = append(r.skipped, fmt.Sprintf("%s comes from %s: cannot rewrite; set it as a literal", e.Name, valueSource(e.ValueFrom)))
			continue
		}
		entries := splitList(e.Value)
		if len(entries) == 0 {
			r.skipped = append(r.skipped, e.Name+" is empty: cannot rewrite")
			continue
		}
		var first brokerAddr
		var upstreams []string
		reason := ""
		for k, s := range entries {
			a, err := parseNATSAddr(s)
			if err == nil && a.rest != "" {
				err = errors.New("a NATS URL has no path")
			}
			if reason = addrProblem(e.Name, e.Value, a, err); reason != "" {
				break
			}
			if k == 0 {
				first = a
			}
			if u := natsUpstream(a); !slices.Contains(upstreams, u) {
				upstreams = append(upstreams, u)
			}
		}
		if reason != "" {
			r.skipped = append(r.skipped, reason)
			continue
		}
		n := first.withHostPort(localhost, listenPort)
		edits[i] = n.String()
		line := fmt.Sprintf("%s: %s → %s", e.Name, maskValue(e.Value), n.masked())
		if len(entries) > 1 {
			line += fmt.Sprintf(" (it listed %d servers; the sidecar proxies to the first, %s)", len(entries), upstreams[0])
		}
		r.rewritten = append(r.rewritten, line)
		hits = append(hits, hit{name: e.Name, upstream: upstreams[0]})
	}
	if len(hits) == 0 {
		if considered > 0 {
			r.fatal = fmt.Sprintf("no NATS setting of container %q could be rewritten, so the sidecar has no server to proxy", app.Name)
		}
		return r, considered
	}
	for _, h := range hits[1:] {
		if h.upstream != hits[0].upstream {
			r.fatal = fmt.Sprintf("container %q points %s and %s at different NATS servers (%s, %s): the sidecar proxies one server",
				app.Name, hits[0].name, h.name, hits[0].upstream, h.upstream)
			return r, considered
		}
	}
	r.upstream = []corev1.EnvVar{{Name: envUpstream, Value: hits[0].upstream}}
	r.env = make([]corev1.EnvVar, 0, len(app.Env))
	for i, e := range app.Env {
		if v, ok := edits[i]; ok {
			e.Value = v
		}
		r.env = append(r.env, e)
	}
	return r, considered
}

// SpeaksNATS says whether pod's injected sidecar is a NATS one: the
// migrator takes such a pod only by the strategies that cover NATS
// (docs/nats.md).
func SpeaksNATS(pod *corev1.Pod) bool {
	i := sidecarIndex(pod.Spec.InitContainers)
	return i >= 0 && isNATSSidecar(&pod.Spec.InitContainers[i])
}

// isNATSSidecar says whether an injected sidecar is a NATS one.
func isNATSSidecar(c *corev1.Container) bool {
	for _, e := range c.Env {
		if e.Name == envBroker && e.Value == "nats" {
			return true
		}
	}
	return false
}
