package inject

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/upstream"
)

// The app's env vars that ms2m knows to hold the broker's address and
// settings.
const (
	envAMQPURL                     = "AMQP_URL"
	envRabbitMQURL                 = "RABBITMQ_URL"
	envSpringHost                  = "SPRING_RABBITMQ_HOST"
	envSpringPort                  = "SPRING_RABBITMQ_PORT"
	envSpringAddresses             = "SPRING_RABBITMQ_ADDRESSES"
	envSpringSSL                   = "SPRING_RABBITMQ_SSL_ENABLED"
	envSpringUsername              = "SPRING_RABBITMQ_USERNAME"
	envSpringPassword              = "SPRING_RABBITMQ_PASSWORD"
	envSpringVirtualHost           = "SPRING_RABBITMQ_VIRTUALHOST"  // Spring's relaxed binding of virtual-host
	envSpringVirtualHostUnderscore = "SPRING_RABBITMQ_VIRTUAL_HOST" // as people also write it
)

// wellKnownBrokerEnv lists them in the order messages name them.
var wellKnownBrokerEnv = []string{envAMQPURL, envRabbitMQURL, envSpringHost, envSpringAddresses}

// localhost is where the app reaches the sidecar.
const localhost = "127.0.0.1"

// appEnvPrefix prefixes the app's broker vars that the sidecar receives by
// reference, so that the kubelet can compose MS2M_UPSTREAM from them.
const appEnvPrefix = "MS2M_APP_"

// varKind is how a broker env var's value is read.
type varKind int

const (
	kindNone        varKind = iota
	kindURL                 // an amqp:// or amqps:// URL
	kindURLOrAddr           // a URL or host:port (ms2m.io/broker-env)
	kindSpringHost          // a host name; the port is in SPRING_RABBITMQ_PORT
	kindSpringAddrs         // Spring's comma list of addresses or URLs
)

// brokerRewrite is what rewriting the app's broker settings found.
type brokerRewrite struct {
	// upstream is the sidecar's env that names the broker: MS2M_UPSTREAM,
	// a literal or the app's own reference, and what goes with it (TLS,
	// credentials by reference). Empty when nothing could be rewritten.
	upstream []corev1.EnvVar
	// env is the app container's new env.
	env       []corev1.EnvVar
	rewritten []string
	// skipped holds the vars that could not be rewritten, and why.
	skipped []string
	// fatal is set when the pod must be left alone: nothing could be
	// rewritten, or two vars point at different brokers.
	fatal string
	// considered counts the broker vars the container sets, rewritable
	// or not.
	considered int
	// noneSet: the app sets no broker var in env at all.
	noneSet bool
	// envFrom and mounts are the app's sources that the sidecar gets too
	// when the broker comes from the app's settings (fromAppSettings).
	envFrom []corev1.EnvFromSource
	mounts  []corev1.VolumeMount
}

// hit is one var rewritten, and the broker it pointed at: literal
// host:port entries, or, for a value the webhook cannot read, the
// sidecar's env that carries the app's reference.
type hit struct {
	name     string
	upstream string          // the MS2M_UPSTREAM literal, or "" when by reference
	ref      []corev1.EnvVar // the sidecar's env for a reference
	tls      bool
	spring   bool
}

// placeholderURL is what an app whose broker URL the webhook cannot read
// (it is in a Secret or ConfigMap) is given: the sidecar, with credentials
// the sidecar replaces by the real ones from the same reference.
var placeholderURL = "amqp://" + upstream.PlaceholderUser + ":" + upstream.PlaceholderPassword + "@" + localhost

// readableRef says whether a valueFrom is one the sidecar can be given by
// the same reference: a Secret's or a ConfigMap's key.
func readableRef(s *corev1.EnvVarSource) bool {
	return s != nil && (s.SecretKeyRef != nil || s.ConfigMapKeyRef != nil)
}

// rewriteBroker points the app container's broker settings at the sidecar
// on 127.0.0.1:listenPort. Literal values are rewritten in place; values
// from a Secret or ConfigMap are not read: the app gets the sidecar's
// address with placeholder credentials, and the sidecar gets the same
// reference. TLS (amqps://, SPRING_RABBITMQ_SSL_ENABLED) moves to the
// sidecar. brokerEnv is the ms2m.io/broker-env annotation.
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
	listen := strconv.Itoa(int(listenPort))

	sslIdx, portIdx := -1, -1 // the last of each: the one that takes effect
	for i, e := range app.Env {
		switch e.Name {
		case envSpringSSL:
			sslIdx = i
		case envSpringPort:
			portIdx = i
		}
	}
	springTLS := sslIdx >= 0 && app.Env[sslIdx].ValueFrom == nil && strings.EqualFold(strings.TrimSpace(app.Env[sslIdx].Value), "true")

	edits := map[int]corev1.EnvVar{} // env index → new entry
	var added *corev1.EnvVar         // SPRING_RABBITMQ_PORT, added after the host
	addedAfter := -1
	portDone := false // SPRING_RABBITMQ_PORT rewritten or added already
	seen := map[string]bool{}
	var hits []hit
	literal := func(i int, v string) { edits[i] = corev1.EnvVar{Name: app.Env[i].Name, Value: v} }
	for i, e := range app.Env {
		kind := kindOf(e.Name)
		if kind == kindNone {
			continue
		}
		seen[e.Name] = true
		if e.ValueFrom != nil && !(readableRef(e.ValueFrom) && kind != kindURLOrAddr) {
			why := "cannot rewrite; set it as a literal or list a literal var in " + contract.AnnotationBrokerEnv
			if kind == kindURLOrAddr && readableRef(e.ValueFrom) {
				why = "a var named by " + contract.AnnotationBrokerEnv + " must be a literal (from a reference, ms2m cannot tell a URL from host:port); use AMQP_URL or RABBITMQ_URL for a URL in a Secret"
			}
			r.skipped = append(r.skipped, fmt.Sprintf("%s comes from %s: %s", e.Name, valueSource(e.ValueFrom), why))
			continue
		}
		if e.ValueFrom == nil && e.Value == "" {
			r.skipped = append(r.skipped, e.Name+" is empty: cannot rewrite")
			continue
		}
		switch kind {
		case kindURL, kindURLOrAddr:
			if e.ValueFrom != nil {
				literal(i, placeholderURL+":"+listen+"/")
				r.rewritten = append(r.rewritten, fmt.Sprintf("%s: from %s → %s:%s/ (the sidecar reads the URL from the same reference and puts its credentials, virtual host and TLS into the connection)",
					e.Name, refName(e.ValueFrom), maskValue(placeholderURL), listen))
				hits = append(hits, hit{name: e.Name, ref: []corev1.EnvVar{{Name: envUpstream, ValueFrom: e.ValueFrom.DeepCopy()}}})
				continue
			}
			a, err := parseBrokerAddr(e.Value)
			if err == nil && a.scheme == "" && kind == kindURL {
				err = errors.New("not an amqp:// or amqps:// URL")
			}
			if err == nil && a.scheme == "" && a.port == "" {
				err = errors.New("neither an amqp:// URL nor host:port")
			}
			if reason := addrProblem(e.Name, e.Value, a, err); reason != "" {
				r.skipped = append(r.skipped, reason)
				continue
			}
			n := a.plain(localhost, listenPort)
			literal(i, n.String())
			line := fmt.Sprintf("%s: %s → %s", e.Name, a.masked(), n.masked())
			if a.isTLS() {
				line += " (TLS to the broker moves to the sidecar)"
			}
			r.rewritten = append(r.rewritten, line)
			hits = append(hits, hit{name: e.Name, upstream: a.upstream(), tls: a.isTLS()})

		case kindSpringHost:
			upstreamHost := ""
			if e.ValueFrom == nil {
				a, err := parseBrokerAddr(e.Value)
				if err == nil && (a.scheme != "" || a.userinfo != "" || a.port != "" || a.rest != "") {
					err = errors.New("not a host name")
				}
				if reason := addrProblem(e.Name, e.Value, a, err); reason != "" {
					r.skipped = append(r.skipped, reason)
					continue
				}
				upstreamHost = a.hostText()
			}
			port := "5672"
			if springTLS {
				port = "5671"
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
				port = strings.TrimSpace(p.Value)
			}
			literal(i, localhost)
			h := hit{name: e.Name, spring: true}
			if e.ValueFrom != nil {
				ref := appEnvPrefix + e.Name
				h.ref = []corev1.EnvVar{
					{Name: ref, ValueFrom: e.ValueFrom.DeepCopy()},
					{Name: envUpstream, Value: "$(" + ref + "):" + port},
				}
				r.rewritten = append(r.rewritten, fmt.Sprintf("%s: from %s → %s (the sidecar gets the same reference)", e.Name, refName(e.ValueFrom), localhost))
			} else {
				h.upstream = strings.ToLower(upstreamHost) + ":" + port
				r.rewritten = append(r.rewritten, fmt.Sprintf("%s: %s → %s", e.Name, e.Value, localhost))
			}
			switch {
			case portDone:
			case portIdx >= 0:
				for j, p := range app.Env {
					if p.Name == envSpringPort {
						literal(j, listen)
					}
				}
				if old := app.Env[portIdx].Value; old != listen {
					r.rewritten = append(r.rewritten, fmt.Sprintf("%s: %s → %s", envSpringPort, old, listen))
				}
			default:
				added = &corev1.EnvVar{Name: envSpringPort, Value: listen}
				addedAfter = i
				r.rewritten = append(r.rewritten, fmt.Sprintf("%s: (unset) → %s", envSpringPort, listen))
			}
			portDone = true
			hits = append(hits, h)

		case kindSpringAddrs:
			if e.ValueFrom != nil {
				v := upstream.PlaceholderUser + ":" + upstream.PlaceholderPassword + "@" + localhost + ":" + listen
				literal(i, v)
				r.rewritten = append(r.rewritten, fmt.Sprintf("%s: from %s → %s (the sidecar reads the addresses from the same reference, keeps them all and fails over among them)",
					e.Name, refName(e.ValueFrom), maskValue(v)))
				hits = append(hits, hit{name: e.Name, spring: true, ref: append([]corev1.EnvVar{{Name: envUpstream, ValueFrom: e.ValueFrom.DeepCopy()}}, springCredentials(app)...)})
				continue
			}
			entries := splitList(e.Value)
			var first brokerAddr
			var upstreams []string
			var reason string
			tls := springTLS
			for k, s := range entries {
				a, err := parseBrokerAddr(s)
				if reason = addrProblem(e.Name, e.Value, a, err); reason != "" {
					break
				}
				if k == 0 {
					first = a
				}
				if k > 0 && a.isTLS() != first.isTLS() {
					reason = fmt.Sprintf("%s lists brokers with and without amqps:// (%s): the sidecar uses TLS for all or none; use one", e.Name, maskValue(e.Value))
					break
				}
				tls = tls || a.isTLS()
				if u := a.upstreamWithDefault(springTLS || a.isTLS()); !slices.Contains(upstreams, u) {
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
			n := first.plain(localhost, listenPort)
			literal(i, n.String())
			line := fmt.Sprintf("%s: %s → %s", e.Name, maskValue(e.Value), n.masked())
			if len(upstreams) > 1 {
				line += fmt.Sprintf(" (the sidecar keeps all %d brokers and fails over among them in this order)", len(upstreams))
			}
			r.rewritten = append(r.rewritten, line)
			hits = append(hits, hit{name: e.Name, upstream: strings.Join(upstreams, ","), tls: tls, spring: true})
		}
	}

	for _, name := range extra {
		if !seen[name] {
			r.skipped = append(r.skipped, fmt.Sprintf("%s names %s, which container %q does not set", contract.AnnotationBrokerEnv, name, app.Name))
		}
	}

	r.considered = len(seen)
	if len(hits) == 0 {
		if len(seen) == 0 {
			r.noneSet = true
			msg := fmt.Sprintf("container %q sets none of %s: name the var that holds the broker's address in %s",
				app.Name, strings.Join(wellKnownBrokerEnv, ", "), contract.AnnotationBrokerEnv)
			if len(app.EnvFrom) > 0 {
				msg += " (its envFrom sources are Secrets or ConfigMaps only through their keys: set the broker var with valueFrom instead, which ms2m passes to the sidecar by reference)"
			}
			r.fatal = msg
		} else {
			r.fatal = fmt.Sprintf("no broker setting of container %q could be rewritten, so the sidecar has no broker to proxy", app.Name)
		}
		return r
	}
	chosen := hits[0]
	for _, h := range hits[1:] {
		switch {
		case h.ref != nil || chosen.ref != nil:
			if h.ref != nil && chosen.ref == nil {
				chosen = h // a reference is the app's real setting; a literal beside it is likely a default
			}
		case h.upstream != chosen.upstream:
			var parts []string
			for _, h := range hits {
				parts = append(parts, h.name+" → "+h.upstream)
			}
			r.fatal = fmt.Sprintf("container %q points at different brokers (%s): the sidecar proxies one broker list; point them at the same one",
				app.Name, strings.Join(parts, ", "))
			return r
		}
	}
	if len(hits) > 1 && (chosen.ref != nil || hits[0].ref != nil) {
		r.skipped = append(r.skipped, fmt.Sprintf("%d broker vars set and not all can be read: the sidecar proxies the broker of %s", len(hits), chosen.name))
	}
	if chosen.ref != nil {
		r.upstream = chosen.ref
	} else {
		r.upstream = []corev1.EnvVar{{Name: envUpstream, Value: chosen.upstream}}
	}
	if chosen.tls {
		r.upstream = append(r.upstream, corev1.EnvVar{Name: envUpstreamTLS, Value: "true"})
	}
	if chosen.spring && sslIdx >= 0 {
		s := app.Env[sslIdx]
		switch {
		case s.ValueFrom != nil && readableRef(s.ValueFrom):
			r.upstream = append(r.upstream, corev1.EnvVar{Name: envUpstreamTLS, ValueFrom: s.ValueFrom.DeepCopy()})
			literal(sslIdx, "false")
			r.rewritten = append(r.rewritten, fmt.Sprintf("%s: from %s → false (the sidecar gets the same reference: TLS to the broker is its)", envSpringSSL, refName(s.ValueFrom)))
		case springTLS:
			if !chosen.tls {
				r.upstream = append(r.upstream, corev1.EnvVar{Name: envUpstreamTLS, Value: "true"})
			}
			literal(sslIdx, "false")
			r.rewritten = append(r.rewritten, fmt.Sprintf("%s: %s → false (TLS to the broker moves to the sidecar)", envSpringSSL, s.Value))
		}
	}

	r.env = make([]corev1.EnvVar, 0, len(app.Env)+1)
	for i, e := range app.Env {
		if v, ok := edits[i]; ok {
			e = v
		}
		r.env = append(r.env, e)
		if i == addedAfter {
			r.env = append(r.env, *added)
		}
	}
	return r
}

// springCredentials is the sidecar's env that carries the Spring app's
// user, password and virtual host, by the same value or reference, for a
// placeholder in SPRING_RABBITMQ_ADDRESSES; Spring's defaults (guest) when
// the app sets none.
func springCredentials(app *corev1.Container) []corev1.EnvVar {
	var out []corev1.EnvVar
	found := map[string]bool{}
	for _, m := range []struct{ app, sidecar string }{
		{envSpringUsername, envUpstreamUsername}, {envSpringPassword, envUpstreamPassword}, {envSpringVirtualHost, envUpstreamVHost}, {envSpringVirtualHostUnderscore, envUpstreamVHost},
	} {
		if found[m.sidecar] {
			continue
		}
		for _, e := range slices.Backward(app.Env) {
			if e.Name != m.app {
				continue
			}
			if e.ValueFrom == nil {
				out = append(out, corev1.EnvVar{Name: m.sidecar, Value: e.Value})
			} else if readableRef(e.ValueFrom) {
				out = append(out, corev1.EnvVar{Name: m.sidecar, ValueFrom: e.ValueFrom.DeepCopy()})
			}
			found[m.app], found[m.sidecar] = true, true
			break
		}
	}
	if !found[envSpringUsername] && !found[envSpringPassword] {
		out = append(out, corev1.EnvVar{Name: envUpstreamUsername, Value: "guest"}, corev1.EnvVar{Name: envUpstreamPassword, Value: "guest"})
	}
	return out
}

// addrProblem is the skip reason for a broker address that cannot be
// rewritten, or "".
func addrProblem(name, value string, a brokerAddr, err error) string {
	switch {
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

// refName names a Secret or ConfigMap key reference, for a message.
func refName(s *corev1.EnvVarSource) string {
	switch {
	case s.SecretKeyRef != nil:
		return fmt.Sprintf("Secret %s key %s", s.SecretKeyRef.Name, s.SecretKeyRef.Key)
	case s.ConfigMapKeyRef != nil:
		return fmt.Sprintf("ConfigMap %s key %s", s.ConfigMapKeyRef.Name, s.ConfigMapKeyRef.Key)
	}
	return valueSource(s)
}
