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
//
// It walks the env once (rewriteVar), then picks the one broker the
// sidecar proxies (choose), hands it to the sidecar (setUpstream) and
// builds the app's new env (newEnv). app is not modified.
func rewriteBroker(app *corev1.Container, brokerEnv string, listenPort int32) brokerRewrite {
	w := newBrokerRewriter(app, brokerEnv, listenPort)
	for i, e := range app.Env {
		w.rewriteVar(i, e)
	}
	for _, name := range w.extra {
		if !w.seen[name] {
			w.r.skipped = append(w.r.skipped, fmt.Sprintf("%s names %s, which container %q does not set", contract.AnnotationBrokerEnv, name, app.Name))
		}
	}
	w.r.considered = len(w.seen)
	chosen, ok := w.choose()
	if !ok {
		return w.r
	}
	w.setUpstream(chosen)
	w.r.env = w.newEnv()
	return w.r
}

// brokerRewriter is rewriteBroker's state: what it read of the app's
// Spring settings up front, and what it found and decided var by var.
type brokerRewriter struct {
	app        *corev1.Container
	extra      []string // the vars that ms2m.io/broker-env names
	listenPort int32
	listen     string // listenPort, as text
	sslIdx     int    // the last SPRING_RABBITMQ_SSL_ENABLED (the one that takes effect), or -1
	portIdx    int    // the last SPRING_RABBITMQ_PORT, or -1
	springTLS  bool   // SPRING_RABBITMQ_SSL_ENABLED is the literal "true"

	edits      map[int]corev1.EnvVar // env index → new entry
	added      *corev1.EnvVar        // SPRING_RABBITMQ_PORT, added after the host
	addedAfter int                   // the env index added follows, or -1
	portDone   bool                  // SPRING_RABBITMQ_PORT rewritten or added already
	seen       map[string]bool       // the broker vars the container sets
	hits       []hit
	r          brokerRewrite
}

// newBrokerRewriter reads the app's Spring SSL and port settings, which
// the other vars' rewriting depends on.
func newBrokerRewriter(app *corev1.Container, brokerEnv string, listenPort int32) *brokerRewriter {
	w := &brokerRewriter{
		app:        app,
		extra:      splitList(brokerEnv),
		listenPort: listenPort,
		listen:     strconv.Itoa(int(listenPort)),
		sslIdx:     -1,
		portIdx:    -1,
		edits:      map[int]corev1.EnvVar{},
		addedAfter: -1,
		seen:       map[string]bool{},
	}
	for i, e := range app.Env {
		switch e.Name {
		case envSpringSSL:
			w.sslIdx = i
		case envSpringPort:
			w.portIdx = i
		}
	}
	if w.sslIdx >= 0 {
		s := app.Env[w.sslIdx]
		w.springTLS = s.ValueFrom == nil && strings.EqualFold(strings.TrimSpace(s.Value), "true")
	}
	return w
}

// kindOf says how the var called name is read, or kindNone when it does
// not hold the broker's address.
func (w *brokerRewriter) kindOf(name string) varKind {
	switch name {
	case envAMQPURL, envRabbitMQURL:
		return kindURL
	case envSpringHost:
		return kindSpringHost
	case envSpringAddresses:
		return kindSpringAddrs
	}
	if slices.Contains(w.extra, name) {
		return kindURLOrAddr
	}
	return kindNone
}

// literal replaces the app's env entry i by the literal v.
func (w *brokerRewriter) literal(i int, v string) {
	w.edits[i] = corev1.EnvVar{Name: w.app.Env[i].Name, Value: v}
}

// skip records why a var was not rewritten.
func (w *brokerRewriter) skip(reasons ...string) {
	w.r.skipped = append(w.r.skipped, reasons...)
}

// rewriteVar rewrites the app's env entry i, e, if it holds the broker's
// address, or records why it cannot.
func (w *brokerRewriter) rewriteVar(i int, e corev1.EnvVar) {
	kind := w.kindOf(e.Name)
	if kind == kindNone {
		return
	}
	w.seen[e.Name] = true
	if reason := unrewritable(e, kind); reason != "" {
		w.skip(reason)
		return
	}
	switch kind {
	case kindURL, kindURLOrAddr:
		w.rewriteURL(i, e, kind)
	case kindSpringHost:
		w.rewriteSpringHost(i, e)
	case kindSpringAddrs:
		w.rewriteSpringAddrs(i, e)
	}
}

// unrewritable is why a broker var of this kind cannot be rewritten
// whatever its value says: it comes from a source the sidecar cannot be
// given, or it is empty. "" when it may be.
func unrewritable(e corev1.EnvVar, kind varKind) string {
	if e.ValueFrom != nil && (!readableRef(e.ValueFrom) || kind == kindURLOrAddr) {
		why := "cannot rewrite; set it as a literal or list a literal var in " + contract.AnnotationBrokerEnv
		if kind == kindURLOrAddr && readableRef(e.ValueFrom) {
			why = "a var named by " + contract.AnnotationBrokerEnv + " must be a literal (from a reference, ms2m cannot tell a URL from host:port); use AMQP_URL or RABBITMQ_URL for a URL in a Secret"
		}
		return fmt.Sprintf("%s comes from %s: %s", e.Name, valueSource(e.ValueFrom), why)
	}
	if e.ValueFrom == nil && e.Value == "" {
		return e.Name + " is empty: cannot rewrite"
	}
	return ""
}

// rewriteURL rewrites a URL var (AMQP_URL, RABBITMQ_URL), or a var named by
// ms2m.io/broker-env, which may also hold host:port. One from a reference
// becomes the placeholder URL, and the sidecar reads the same reference.
func (w *brokerRewriter) rewriteURL(i int, e corev1.EnvVar, kind varKind) {
	if e.ValueFrom != nil {
		w.literal(i, placeholderURL+":"+w.listen+"/")
		w.r.rewritten = append(w.r.rewritten, fmt.Sprintf("%s: from %s → %s:%s/ (the sidecar reads the URL from the same reference and puts its credentials, virtual host and TLS into the connection)",
			e.Name, refName(e.ValueFrom), maskValue(placeholderURL), w.listen))
		w.hits = append(w.hits, hit{name: e.Name, ref: []corev1.EnvVar{{Name: envUpstream, ValueFrom: e.ValueFrom.DeepCopy()}}})
		return
	}
	a, err := parseBrokerAddr(e.Value)
	if err == nil && a.scheme == "" && kind == kindURL {
		err = errors.New("not an amqp:// or amqps:// URL")
	}
	if err == nil && a.scheme == "" && a.port == "" {
		err = errors.New("neither an amqp:// URL nor host:port")
	}
	if reason := addrProblem(e.Name, e.Value, a, err); reason != "" {
		w.skip(reason)
		return
	}
	n := a.plain(localhost, w.listenPort)
	w.literal(i, n.String())
	line := fmt.Sprintf("%s: %s → %s", e.Name, a.masked(), n.masked())
	if a.isTLS() {
		line += " (TLS to the broker moves to the sidecar)"
	}
	w.r.rewritten = append(w.r.rewritten, line)
	w.hits = append(w.hits, hit{name: e.Name, upstream: a.upstream(), tls: a.isTLS()})
}

// rewriteSpringHost rewrites SPRING_RABBITMQ_HOST to 127.0.0.1 and points
// SPRING_RABBITMQ_PORT at the sidecar, adding it when the app leaves it
// unset. The broker's port is the app's SPRING_RABBITMQ_PORT, else
// Spring's default for the app's TLS setting.
func (w *brokerRewriter) rewriteSpringHost(i int, e corev1.EnvVar) {
	upstreamHost := ""
	if e.ValueFrom == nil {
		a, err := parseBrokerAddr(e.Value)
		if err == nil && (a.scheme != "" || a.userinfo != "" || a.port != "" || a.rest != "") {
			err = errors.New("not a host name")
		}
		if reason := addrProblem(e.Name, e.Value, a, err); reason != "" {
			w.skip(reason)
			return
		}
		upstreamHost = a.hostText()
	}
	port, reasons := w.springPort(e.Name)
	if reasons != nil {
		w.skip(reasons...)
		return
	}
	w.literal(i, localhost)
	h := hit{name: e.Name, spring: true}
	if e.ValueFrom != nil {
		ref := appEnvPrefix + e.Name
		h.ref = []corev1.EnvVar{
			{Name: ref, ValueFrom: e.ValueFrom.DeepCopy()},
			{Name: envUpstream, Value: "$(" + ref + "):" + port},
		}
		w.r.rewritten = append(w.r.rewritten, fmt.Sprintf("%s: from %s → %s (the sidecar gets the same reference)", e.Name, refName(e.ValueFrom), localhost))
	} else {
		h.upstream = strings.ToLower(upstreamHost) + ":" + port
		w.r.rewritten = append(w.r.rewritten, fmt.Sprintf("%s: %s → %s", e.Name, e.Value, localhost))
	}
	w.pointSpringPort(i)
	w.hits = append(w.hits, h)
}

// springPort is the broker's port for the Spring host var called host:
// the app's SPRING_RABBITMQ_PORT, else 5672, or 5671 with Spring's TLS on.
// reasons is set, and the host must be skipped, when the app's port cannot
// be read.
func (w *brokerRewriter) springPort(host string) (port string, reasons []string) {
	if w.portIdx < 0 {
		if w.springTLS {
			return "5671", nil
		}
		return "5672", nil
	}
	p := w.app.Env[w.portIdx]
	if p.ValueFrom != nil {
		return "", []string{
			fmt.Sprintf("%s comes from %s: cannot rewrite; set it as a literal or list a literal var in %s", p.Name, valueSource(p.ValueFrom), contract.AnnotationBrokerEnv),
			fmt.Sprintf("%s: not rewritten, because %s cannot be read", host, envSpringPort),
		}
	}
	if _, err := parsePort(strings.TrimSpace(p.Value)); err != nil {
		return "", []string{fmt.Sprintf("%s: not rewritten, because %s is %s, not a port number (1 to 65535)", host, envSpringPort, quote(p.Value))}
	}
	return strings.TrimSpace(p.Value), nil
}

// pointSpringPort sets every SPRING_RABBITMQ_PORT to the sidecar's port,
// or adds one after the host var at index host, once.
func (w *brokerRewriter) pointSpringPort(host int) {
	switch {
	case w.portDone:
	case w.portIdx >= 0:
		for j, p := range w.app.Env {
			if p.Name == envSpringPort {
				w.literal(j, w.listen)
			}
		}
		if old := w.app.Env[w.portIdx].Value; old != w.listen {
			w.r.rewritten = append(w.r.rewritten, fmt.Sprintf("%s: %s → %s", envSpringPort, old, w.listen))
		}
	default:
		w.added = &corev1.EnvVar{Name: envSpringPort, Value: w.listen}
		w.addedAfter = host
		w.r.rewritten = append(w.r.rewritten, fmt.Sprintf("%s: (unset) → %s", envSpringPort, w.listen))
	}
	w.portDone = true
}

// rewriteSpringAddrs rewrites SPRING_RABBITMQ_ADDRESSES to the sidecar's
// address; the sidecar keeps the whole list and fails over among it. One
// from a reference gets placeholder credentials, and the sidecar the same
// reference and the app's Spring credentials.
func (w *brokerRewriter) rewriteSpringAddrs(i int, e corev1.EnvVar) {
	if e.ValueFrom != nil {
		v := upstream.PlaceholderUser + ":" + upstream.PlaceholderPassword + "@" + localhost + ":" + w.listen
		w.literal(i, v)
		w.r.rewritten = append(w.r.rewritten, fmt.Sprintf("%s: from %s → %s (the sidecar reads the addresses from the same reference, keeps them all and fails over among them)",
			e.Name, refName(e.ValueFrom), maskValue(v)))
		w.hits = append(w.hits, hit{name: e.Name, spring: true, ref: append([]corev1.EnvVar{{Name: envUpstream, ValueFrom: e.ValueFrom.DeepCopy()}}, springCredentials(w.app)...)})
		return
	}
	first, upstreams, tls, reason := springAddresses(e.Name, e.Value, w.springTLS)
	if reason != "" {
		w.skip(reason)
		return
	}
	n := first.plain(localhost, w.listenPort)
	w.literal(i, n.String())
	line := fmt.Sprintf("%s: %s → %s", e.Name, maskValue(e.Value), n.masked())
	if len(upstreams) > 1 {
		line += fmt.Sprintf(" (the sidecar keeps all %d brokers and fails over among them in this order)", len(upstreams))
	}
	w.r.rewritten = append(w.r.rewritten, line)
	w.hits = append(w.hits, hit{name: e.Name, upstream: strings.Join(upstreams, ","), tls: tls, spring: true})
}

// springAddresses reads the literal value of the SPRING_RABBITMQ_ADDRESSES
// var called name: its first entry, the brokers in order without repeats
// (host:port, with the default port for TLS when springTLS or amqps://
// says so), and whether TLS is on. reason says why it cannot be rewritten:
// an entry does not parse or points inside the pod, the entries mix TLS and
// plain, or there are none.
func springAddresses(name, value string, springTLS bool) (first brokerAddr, upstreams []string, tls bool, reason string) {
	entries := splitList(value)
	if len(entries) == 0 {
		return brokerAddr{}, nil, false, name + " lists no address: cannot rewrite"
	}
	tls = springTLS
	for k, s := range entries {
		a, err := parseBrokerAddr(s)
		if reason = addrProblem(name, value, a, err); reason != "" {
			return first, upstreams, tls, reason
		}
		if k == 0 {
			first = a
		}
		if k > 0 && a.isTLS() != first.isTLS() {
			return first, upstreams, tls, fmt.Sprintf("%s lists brokers with and without amqps:// (%s): the sidecar uses TLS for all or none; use one", name, maskValue(value))
		}
		tls = tls || a.isTLS()
		if u := a.upstreamWithDefault(springTLS || a.isTLS()); !slices.Contains(upstreams, u) {
			upstreams = append(upstreams, u)
		}
	}
	return first, upstreams, tls, ""
}

// choose picks the rewritten var whose broker the sidecar proxies. It sets
// r.fatal and returns false when no var could be rewritten, or when two
// literals point at different brokers. A reference wins over a literal
// beside it, which is likely a default.
func (w *brokerRewriter) choose() (hit, bool) {
	if len(w.hits) == 0 {
		w.r.noneSet = len(w.seen) == 0
		w.r.fatal = noBrokerReason(w.app, w.r.noneSet)
		return hit{}, false
	}
	chosen := w.hits[0]
	for _, h := range w.hits[1:] {
		switch {
		case h.ref != nil || chosen.ref != nil:
			if h.ref != nil && chosen.ref == nil {
				chosen = h
			}
		case h.upstream != chosen.upstream:
			var parts []string
			for _, h := range w.hits {
				parts = append(parts, h.name+" → "+h.upstream)
			}
			w.r.fatal = fmt.Sprintf("container %q points at different brokers (%s): the sidecar proxies one broker list; point them at the same one",
				w.app.Name, strings.Join(parts, ", "))
			return hit{}, false
		}
	}
	if len(w.hits) > 1 && (chosen.ref != nil || w.hits[0].ref != nil) {
		w.skip(fmt.Sprintf("%d broker vars set and not all can be read: the sidecar proxies the broker of %s", len(w.hits), chosen.name))
	}
	return chosen, true
}

// noBrokerReason is the fatal reason of an app none of whose broker vars
// could be rewritten; noneSet when it sets none at all.
func noBrokerReason(app *corev1.Container, noneSet bool) string {
	if !noneSet {
		return fmt.Sprintf("no broker setting of container %q could be rewritten, so the sidecar has no broker to proxy", app.Name)
	}
	msg := fmt.Sprintf("container %q sets none of %s: name the var that holds the broker's address in %s",
		app.Name, strings.Join(wellKnownBrokerEnv, ", "), contract.AnnotationBrokerEnv)
	if len(app.EnvFrom) > 0 {
		msg += " (its envFrom sources are Secrets or ConfigMaps only through their keys: set the broker var with valueFrom instead, which ms2m passes to the sidecar by reference)"
	}
	return msg
}

// setUpstream gives the sidecar the chosen broker, and the TLS to it: from
// an amqps:// URL, or from SPRING_RABBITMQ_SSL_ENABLED, which the app then
// has set to false.
func (w *brokerRewriter) setUpstream(chosen hit) {
	if chosen.ref != nil {
		w.r.upstream = chosen.ref
	} else {
		w.r.upstream = []corev1.EnvVar{{Name: envUpstream, Value: chosen.upstream}}
	}
	if chosen.tls {
		w.r.upstream = append(w.r.upstream, corev1.EnvVar{Name: envUpstreamTLS, Value: "true"})
	}
	if !chosen.spring || w.sslIdx < 0 {
		return
	}
	s := w.app.Env[w.sslIdx]
	switch {
	case s.ValueFrom != nil && readableRef(s.ValueFrom):
		w.r.upstream = append(w.r.upstream, corev1.EnvVar{Name: envUpstreamTLS, ValueFrom: s.ValueFrom.DeepCopy()})
		w.literal(w.sslIdx, "false")
		w.r.rewritten = append(w.r.rewritten, fmt.Sprintf("%s: from %s → false (the sidecar gets the same reference: TLS to the broker is its)", envSpringSSL, refName(s.ValueFrom)))
	case w.springTLS:
		if !chosen.tls {
			w.r.upstream = append(w.r.upstream, corev1.EnvVar{Name: envUpstreamTLS, Value: "true"})
		}
		w.literal(w.sslIdx, "false")
		w.r.rewritten = append(w.r.rewritten, fmt.Sprintf("%s: %s → false (TLS to the broker moves to the sidecar)", envSpringSSL, s.Value))
	}
}

// newEnv is the app's env with the edits made, and SPRING_RABBITMQ_PORT
// added after the host var when the app did not set it.
func (w *brokerRewriter) newEnv() []corev1.EnvVar {
	env := make([]corev1.EnvVar, 0, len(w.app.Env)+1)
	for i, e := range w.app.Env {
		if v, ok := w.edits[i]; ok {
			e = v
		}
		env = append(env, e)
		if i == w.addedAfter {
			env = append(env, *w.added)
		}
	}
	return env
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
