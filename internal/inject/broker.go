package inject

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// The app's env vars that ms2m knows to hold the broker's address.
const (
	envAMQPURL         = "AMQP_URL"
	envRabbitMQURL     = "RABBITMQ_URL"
	envSpringHost      = "SPRING_RABBITMQ_HOST"
	envSpringPort      = "SPRING_RABBITMQ_PORT"
	envSpringAddresses = "SPRING_RABBITMQ_ADDRESSES"
	envSpringSSL       = "SPRING_RABBITMQ_SSL_ENABLED"
)

// wellKnownBrokerEnv lists them in the order messages name them.
var wellKnownBrokerEnv = []string{envAMQPURL, envRabbitMQURL, envSpringHost, envSpringAddresses}

// localhost is where the app reaches the sidecar.
const localhost = "127.0.0.1"

// varKind is how a broker env var's value is read.
type varKind int

const (
	kindNone        varKind = iota
	kindURL                 // an amqp:// URL
	kindURLOrAddr           // an amqp:// URL or host:port (ms2m.io/broker-env)
	kindSpringHost          // a host name; the port is in SPRING_RABBITMQ_PORT
	kindSpringAddrs         // Spring's comma list of addresses or URLs
)

// brokerRewrite is what rewriting the app's broker settings found.
type brokerRewrite struct {
	// upstream is the broker that the rewritten vars pointed at: the
	// sidecar's MS2M_UPSTREAM. Empty when nothing could be rewritten.
	upstream string
	// env is the app container's new env.
	env       []corev1.EnvVar
	rewritten []string
	// skipped holds the vars that could not be rewritten, and why.
	skipped []string
	// fatal is set when the pod must be left alone: nothing could be
	// rewritten, or two vars point at different brokers.
	fatal string
}

// hit is one var rewritten, and the broker it pointed at.
type hit struct{ name, upstream string }

// rewriteBroker points the app container's broker settings at the sidecar
// on 127.0.0.1:listenPort. It reads only literal values; brokerEnv is the
// ms2m.io/broker-env annotation.
func rewriteBroker(app *corev1.Container, brokerEnv string, listenPort int32) brokerRewrite {
	var r brokerRewrite
	extra := splitList(brokerEnv)
	kindOf := func(name string) varKind {
		switch name {
		case envAMQPURL, envRabbitMQURL:
			return kindURL
		case envSpringHost:
			return kindSpringHost
		case envSpringAddresses:
			return kindSpringAddrs
		}
		if slices.Contains(extra, name) {
			return kindURLOrAddr
		}
		return kindNone
	}

	springTLS := false
	portIdx := -1 // the last SPRING_RABBITMQ_PORT: the one that takes effect
	for i, e := range app.Env {
		switch e.Name {
		case envSpringSSL:
			springTLS = e.ValueFrom == nil && strings.EqualFold(strings.TrimSpace(e.Value), "true")
		case envSpringPort:
			portIdx = i
		}
	}

	edits := map[int]string{} // env index → new value
	var added *corev1.EnvVar  // SPRING_RABBITMQ_PORT, added after the host
	addedAfter := -1
	portDone := false // SPRING_RABBITMQ_PORT rewritten or added already
	seen := map[string]bool{}
	var hits []hit
	for i, e := range app.Env {
		kind := kindOf(e.Name)
		if kind == kindNone {
			continue
		}
		seen[e.Name] = true
		if e.ValueFrom != nil {
			r.skipped = append(r.skipped, fmt.Sprintf("%s comes from %s: cannot rewrite; set it as a literal or list a literal var in %s",
				e.Name, valueSource(e.ValueFrom), contract.AnnotationBrokerEnv))
			continue
		}
		if e.Value == "" {
			r.skipped = append(r.skipped, e.Name+" is empty: cannot rewrite")
			continue
		}
		if springTLS && (kind == kindSpringHost || kind == kindSpringAddrs) {
			r.skipped = append(r.skipped, fmt.Sprintf("%s: %v (%s=true)", e.Name, errTLS, envSpringSSL))
			continue
		}
		switch kind {
		case kindURL, kindURLOrAddr:
			a, err := parseBrokerAddr(e.Value)
			if err == nil && a.scheme == "" && kind == kindURL {
				err = errors.New("not an amqp:// URL")
			}
			if err == nil && a.scheme == "" && a.port == "" {
				err = errors.New("neither an amqp:// URL nor host:port")
			}
			if reason := addrProblem(e.Name, e.Value, a, err); reason != "" {
				r.skipped = append(r.skipped, reason)
				continue
			}
			n := a.withHostPort(localhost, listenPort)
			edits[i] = n.String()
			r.rewritten = append(r.rewritten, fmt.Sprintf("%s: %s → %s", e.Name, a.masked(), n.masked()))
			hits = append(hits, hit{e.Name, a.upstream()})

		case kindSpringHost:
			a, err := parseBrokerAddr(e.Value)
			if err == nil && (a.scheme != "" || a.userinfo != "" || a.port != "" || a.rest != "") {
				err = errors.New("not a host name")
			}
			if reason := addrProblem(e.Name, e.Value, a, err); reason != "" {
				r.skipped = append(r.skipped, reason)
				continue
			}
			if portIdx >= 0 {
				p := app.Env[portIdx]
				if p.ValueFrom != nil {
					r.skipped = append(r.skipped,
						fmt.Sprintf("%s comes from %s: cannot rewrite; set it as a literal or list a literal var in %s", p.Name, valueSource(p.ValueFrom), contract.AnnotationBrokerEnv),
						fmt.Sprintf("%s: not rewritten, because %s cannot be read", e.Name, envSpringPort))
					continue
				}
				if _, err := parsePort(strings.TrimSpace(p.Value)); err != nil {
					r.skipped = append(r.skipped, fmt.Sprintf("%s: not rewritten, because %s is %s, not a port number (1 to 65535)", e.Name, envSpringPort, quote(p.Value)))
					continue
				}
				a.port = strings.TrimSpace(p.Value)
			}
			edits[i] = localhost
			r.rewritten = append(r.rewritten, fmt.Sprintf("%s: %s → %s", e.Name, e.Value, localhost))
			newPort := strconv.Itoa(int(listenPort))
			switch {
			case portDone:
			case portIdx >= 0:
				for j, p := range app.Env {
					if p.Name == envSpringPort {
						edits[j] = newPort
					}
				}
				if old := app.Env[portIdx].Value; old != newPort {
					r.rewritten = append(r.rewritten, fmt.Sprintf("%s: %s → %s", envSpringPort, old, newPort))
				}
			default:
				added = &corev1.EnvVar{Name: envSpringPort, Value: newPort}
				addedAfter = i
				r.rewritten = append(r.rewritten, fmt.Sprintf("%s: (unset) → %s", envSpringPort, newPort))
			}
			portDone = true
			hits = append(hits, hit{e.Name, a.upstream()})

		case kindSpringAddrs:
			entries := splitList(e.Value)
			var first brokerAddr
			var upstreams []string
			var reason string
			for k, s := range entries {
				a, err := parseBrokerAddr(s)
				if reason = addrProblem(e.Name, e.Value, a, err); reason != "" {
					break
				}
				if k == 0 {
					first = a
				}
				if u := a.upstream(); !slices.Contains(upstreams, u) {
					upstreams = append(upstreams, u)
				}
			}
			if len(entries) == 0 {
				reason = e.Name + " lists no address: cannot rewrite"
			}
			if reason != "" {
				r.skipped = append(r.skipped, reason)
				continue
			}
			n := first.withHostPort(localhost, listenPort)
			edits[i] = n.String()
			line := fmt.Sprintf("%s: %s → %s", e.Name, maskValue(e.Value), n.masked())
			if len(upstreams) > 1 {
				line += fmt.Sprintf(" (it listed %d brokers; the sidecar proxies to the first, %s)", len(upstreams), upstreams[0])
			}
			r.rewritten = append(r.rewritten, line)
			hits = append(hits, hit{e.Name, upstreams[0]})
		}
	}

	for _, name := range extra {
		if !seen[name] {
			r.skipped = append(r.skipped, fmt.Sprintf("%s names %s, which container %q does not set", contract.AnnotationBrokerEnv, name, app.Name))
		}
	}

	if len(hits) == 0 {
		if len(seen) == 0 {
			msg := fmt.Sprintf("container %q sets none of %s: name the var that holds the broker's address in %s",
				app.Name, strings.Join(wellKnownBrokerEnv, ", "), contract.AnnotationBrokerEnv)
			if len(app.EnvFrom) > 0 {
				msg += " (env from envFrom sources cannot be read)"
			}
			r.fatal = msg
		} else {
			r.fatal = fmt.Sprintf("no broker setting of container %q could be rewritten, so the sidecar has no broker to proxy", app.Name)
		}
		return r
	}
	for _, h := range hits[1:] {
		if h.upstream != hits[0].upstream {
			var parts []string
			for _, h := range hits {
				parts = append(parts, h.name+" → "+h.upstream)
			}
			r.fatal = fmt.Sprintf("container %q points at different brokers (%s): the sidecar proxies one broker; point them at the same one",
				app.Name, strings.Join(parts, ", "))
			return r
		}
	}
	r.upstream = hits[0].upstream

	r.env = make([]corev1.EnvVar, 0, len(app.Env)+1)
	for i, e := range app.Env {
		if v, ok := edits[i]; ok {
			e.Value = v
		}
		r.env = append(r.env, e)
		if i == addedAfter {
			r.env = append(r.env, *added)
		}
	}
	return r
}

// addrProblem is the skip reason for a broker address that cannot be
// rewritten, or "".
func addrProblem(name, value string, a brokerAddr, err error) string {
	switch {
	case errors.Is(err, errTLS):
		return fmt.Sprintf("%s: %v (%s)", name, errTLS, maskValue(value))
	case err != nil:
		return fmt.Sprintf("%s is %s: %v; cannot rewrite", name, quote(maskValue(value)), err)
	case a.isLoopback():
		return fmt.Sprintf("%s already points at %s, inside the pod: nothing to proxy", name, a.upstream())
	}
	return ""
}

// valueSource says where a valueFrom var comes from, for a message.
func valueSource(s *corev1.EnvVarSource) string {
	switch {
	case s.SecretKeyRef != nil:
		return "a Secret"
	case s.ConfigMapKeyRef != nil:
		return "a ConfigMap"
	case s.FieldRef != nil:
		return "a field reference"
	case s.ResourceFieldRef != nil:
		return "a resource field reference"
	case s.FileKeyRef != nil:
		return "a file"
	}
	return "valueFrom"
}
