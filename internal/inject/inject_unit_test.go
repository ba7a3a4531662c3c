package inject

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// testPod is an opted-in pod whose one container has env.
func testPod(annotations map[string]string, env ...corev1.EnvVar) *corev1.Pod {
	ann := map[string]string{contract.AnnotationInject: "true"}
	for k, v := range annotations {
		ann[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: "default", Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "app",
			Image: "example.com/app:1",
			Env:   env,
		}}},
	}
}

// restoreInput is a restore of p (named app-0: a restore target has a
// name), by its annotations or by pending, signed as the controller signs
// them, for testConfig. It changes p and pending.
func restoreInput(p *corev1.Pod, pending *Migration) Input {
	p.GenerateName, p.Name = "", "app-0"
	exp := goldenNow.Add(time.Hour)
	if pending != nil {
		pending.Signature = SignRestore(testConfig.RestoreKey, p.Namespace, p.Name, *pending, exp)
	}
	if a := p.Annotations; a[contract.AnnotationRestoreImage] != "" {
		m := Migration{Name: a[contract.AnnotationMigrationName], Image: a[contract.AnnotationRestoreImage], Node: a[contract.AnnotationRestoreNode], LogName: a[contract.AnnotationLogName],
			ReplayStart: a[contract.AnnotationReplayStart], ReplayCutoff: a[contract.AnnotationReplayCutoff], ReplayEpoch: a[contract.AnnotationReplayEpoch],
			ReplaySkip: a[contract.AnnotationReplaySkip]}
		a[contract.AnnotationRestoreSignature] = SignRestore(testConfig.RestoreKey, p.Namespace, p.Name, m, exp)
	}
	return Input{Pod: p, Pending: pending}
}

func lit(name, value string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: value} }

func fromSecret(name string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k",
	}}}
}

func TestInjectLeavesInputAlone(t *testing.T) {
	pending := &Migration{Name: "m", Image: "example.com/ckpt:m", Node: "node-b", LogName: "default.app-0", ReplayStart: "1", ReplayCutoff: "marker"}
	tests := map[string]struct {
		in      Input
		wantPod bool
	}{
		"injection adds an env var": {
			in:      Input{Pod: testPod(nil, lit(envSpringHost, "rabbit"))},
			wantPod: true,
		},
		"restore from pending": {
			in:      restoreInput(testPod(nil, lit(envAMQPURL, "amqp://rabbit")), pending),
			wantPod: true,
		},
		"pod without annotations, namespace opted in": {
			in: Input{
				Pod:             &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Env: []corev1.EnvVar{lit(envAMQPURL, "amqp://rabbit")}}}}},
				NamespaceLabels: map[string]string{contract.LabelNamespaceInject: "enabled"},
			},
			wantPod: true,
		},
		"partial skip": {
			in:      Input{Pod: testPod(nil, fromSecret(envAMQPURL), lit(envRabbitMQURL, "amqp://rabbit"))},
			wantPod: true,
		},
		"from a Secret, by reference": {
			in:      Input{Pod: testPod(nil, fromSecret(envAMQPURL))},
			wantPod: true,
		},
		"total skip": {
			in: Input{Pod: testPod(nil, corev1.EnvVar{Name: envAMQPURL, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})},
		},
		"deny": {
			in: Input{Pod: testPod(map[string]string{contract.AnnotationStrategy: "x"}, lit(envAMQPURL, "amqp://rabbit"))},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			before := tt.in.Pod.DeepCopy()
			res, _ := Inject(tt.in, testConfig)
			if !apiequality.Semantic.DeepEqual(before, tt.in.Pod) {
				t.Errorf("Inject changed its input pod:\nbefore %+v\nafter  %+v", before, tt.in.Pod)
			}
			if got := res.Pod != nil; got != tt.wantPod {
				t.Fatalf("Result.Pod set = %v, want %v (skipped %q)", got, tt.wantPod, res.Skipped)
			}
			if res.Pod != nil && res.Pod == tt.in.Pod {
				t.Error("Result.Pod is the input pod, want a copy")
			}
		})
	}
}

func TestInjectTwice(t *testing.T) {
	pending := &Migration{Name: "m", Image: "example.com/ckpt:m", Node: "node-b", LogName: "default.app-0", ReplayStart: "1", ReplayCutoff: "9"}
	tests := map[string]Input{
		"injection": {Pod: testPod(nil, lit(envAMQPURL, "amqp://rabbit"))},
		"restore":   restoreInput(testPod(nil, lit(envAMQPURL, "amqp://rabbit")), pending),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			first, err := Inject(in, testConfig)
			if err != nil || first.Pod == nil {
				t.Fatalf("first Inject = %+v, %v; want a pod", first, err)
			}
			in.Pod = first.Pod
			second, err := Inject(in, testConfig)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(Result{Skipped: []string{ReasonAlreadyInjected}}, second); diff != "" {
				t.Errorf("second Inject (-want +got):\n%s", diff)
			}
		})
	}
}

func TestInjectErrors(t *testing.T) {
	bad := testConfig
	bad.SidecarImage = ""
	tests := map[string]struct {
		in       Input
		cfg      Config
		wantDeny bool
		wantMsg  string
	}{
		"nil pod":          {in: Input{}, cfg: testConfig, wantMsg: "Input.Pod is nil"},
		"bad config":       {in: Input{Pod: testPod(nil)}, cfg: bad, wantMsg: "sidecarImage is empty"},
		"bad inject value": {in: Input{Pod: testPod(map[string]string{contract.AnnotationInject: "True"})}, cfg: testConfig, wantDeny: true, wantMsg: `annotation ms2m.io/inject is "True"`},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Inject(tt.in, tt.cfg)
			var deny *DenyError
			if err == nil || errors.As(err, &deny) != tt.wantDeny || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Inject error = %v; want a %s error containing %q", err, map[bool]string{true: "deny", false: "non-deny"}[tt.wantDeny], tt.wantMsg)
			}
		})
	}
}

// TestInjectPortsAndUser checks the Config's ports and user where the
// goldens (default Config values) cannot.
func TestInjectPortsAndUser(t *testing.T) {
	cfg := testConfig
	cfg.ListenPort, cfg.ControlPort, cfg.RunAsUser, cfg.LogMaxBytes = 15672, 9090, 1000, 1<<30
	res, err := Inject(Input{Pod: testPod(nil, lit(envSpringHost, "rabbit"))}, cfg)
	if err != nil || res.Pod == nil {
		t.Fatalf("Inject = %+v, %v", res, err)
	}
	wantApp := []corev1.EnvVar{lit(envSpringHost, "127.0.0.1"), lit(envSpringPort, "15672"), lit(envGoDebug, mptcpOff)}
	if diff := cmp.Diff(wantApp, res.Pod.Spec.Containers[0].Env); diff != "" {
		t.Errorf("app env (-want +got):\n%s", diff)
	}
	sc := res.Pod.Spec.InitContainers[0]
	env := map[string]string{}
	for _, e := range sc.Env {
		env[e.Name] = e.Value
	}
	for k, want := range map[string]string{
		envListen: "127.0.0.1:15672", envControlListen: ":9090", envUpstream: "rabbit:5672", envLogMaxBytes: "1073741824",
	} {
		if env[k] != want {
			t.Errorf("sidecar %s = %q, want %q", k, env[k], want)
		}
	}
	if got := sc.Ports[0].ContainerPort; got != 9090 {
		t.Errorf("control containerPort = %d, want 9090", got)
	}
	if got := *sc.SecurityContext.RunAsUser; got != 1000 {
		t.Errorf("runAsUser = %d, want 1000", got)
	}
}

func TestRewriteBroker(t *testing.T) {
	tests := map[string]struct {
		env             []corev1.EnvVar
		brokerEnv       string
		wantEnv         []corev1.EnvVar
		wantUpstream    string
		wantUpstreamRef string
		wantTLS         bool
		wantRewritten   []string
		wantSkipped     []string
		wantFatal       string // a substring
	}{
		"Spring port from a Secret: neither is rewritten": {
			env:         []corev1.EnvVar{lit(envSpringHost, "rabbit"), fromSecret(envSpringPort)},
			wantSkipped: []string{"SPRING_RABBITMQ_PORT comes from a Secret: cannot rewrite; set it as a literal or list a literal var in ms2m.io/broker-env", "SPRING_RABBITMQ_HOST: not rewritten, because SPRING_RABBITMQ_PORT cannot be read"},
			wantFatal:   "no broker setting",
		},
		"Spring port not a number": {
			env:         []corev1.EnvVar{lit(envSpringHost, "rabbit"), lit(envSpringPort, "amqp")},
			wantSkipped: []string{`SPRING_RABBITMQ_HOST: not rewritten, because SPRING_RABBITMQ_PORT is "amqp", not a port number (1 to 65535)`},
			wantFatal:   "no broker setting",
		},
		"Spring with TLS": {
			env:          []corev1.EnvVar{lit(envSpringSSL, "true"), lit(envSpringHost, "rabbit")},
			wantEnv:      []corev1.EnvVar{lit(envSpringSSL, "false"), lit(envSpringHost, "127.0.0.1"), lit(envSpringPort, "5672")},
			wantUpstream: "rabbit:5671",
			wantTLS:      true,
			wantRewritten: []string{"SPRING_RABBITMQ_HOST: rabbit → 127.0.0.1", "SPRING_RABBITMQ_PORT: (unset) → 5672",
				"SPRING_RABBITMQ_SSL_ENABLED: true → false (TLS to the broker moves to the sidecar)"},
		},
		"Spring host with a port in it": {
			env:         []corev1.EnvVar{lit(envSpringHost, "rabbit:5672")},
			wantSkipped: []string{`SPRING_RABBITMQ_HOST is "rabbit:5672": not a host name; cannot rewrite`},
			wantFatal:   "no broker setting",
		},
		"Spring port before the host, unchanged": {
			env:           []corev1.EnvVar{lit(envSpringPort, "5672"), lit(envSpringHost, "rabbit")},
			wantEnv:       []corev1.EnvVar{lit(envSpringPort, "5672"), lit(envSpringHost, "127.0.0.1")},
			wantUpstream:  "rabbit:5672",
			wantRewritten: []string{"SPRING_RABBITMQ_HOST: rabbit → 127.0.0.1"},
		},
		"Spring addresses as URLs keep the first's vhost": {
			env:           []corev1.EnvVar{lit(envSpringAddresses, "amqp://u:p@r0:5672/v,amqp://u:p@r1:5672/v")},
			wantEnv:       []corev1.EnvVar{lit(envSpringAddresses, "amqp://u:p@127.0.0.1:5672/v")},
			wantUpstream:  "r0:5672,r1:5672",
			wantRewritten: []string{"SPRING_RABBITMQ_ADDRESSES: amqp://u:xxxxx@r0:5672/v,amqp://u:xxxxx@r1:5672/v → amqp://u:xxxxx@127.0.0.1:5672/v (the sidecar keeps all 2 brokers and fails over among them in this order)"},
		},
		"Spring addresses, one broker twice": {
			env:           []corev1.EnvVar{lit(envSpringAddresses, "r0,r0:5672")},
			wantEnv:       []corev1.EnvVar{lit(envSpringAddresses, "127.0.0.1:5672")},
			wantUpstream:  "r0:5672",
			wantRewritten: []string{"SPRING_RABBITMQ_ADDRESSES: r0,r0:5672 → 127.0.0.1:5672"},
		},
		"Spring addresses, all amqps": {
			env:           []corev1.EnvVar{lit(envSpringAddresses, "amqps://u:p@r0,amqps://u:p@r1:6671")},
			wantEnv:       []corev1.EnvVar{lit(envSpringAddresses, "amqp://u:p@127.0.0.1:5672")},
			wantUpstream:  "r0:5671,r1:6671",
			wantTLS:       true,
			wantRewritten: []string{"SPRING_RABBITMQ_ADDRESSES: amqps://u:xxxxx@r0,amqps://u:xxxxx@r1:6671 → amqp://u:xxxxx@127.0.0.1:5672 (the sidecar keeps all 2 brokers and fails over among them in this order)"},
		},
		"Spring addresses with an amqps entry": {
			env:         []corev1.EnvVar{lit(envSpringAddresses, "r0:5672,amqps://u:p@r1:5671")},
			wantSkipped: []string{"SPRING_RABBITMQ_ADDRESSES lists brokers with and without amqps:// (r0:5672,amqps://u:xxxxx@r1:5671): the sidecar uses TLS for all or none; use one"},
			wantFatal:   "no broker setting",
		},
		"already localhost": {
			env:         []corev1.EnvVar{lit(envAMQPURL, "amqp://localhost:5672/")},
			wantSkipped: []string{"AMQP_URL already points at localhost:5672, inside the pod: nothing to proxy"},
			wantFatal:   "no broker setting",
		},
		"AMQP_URL as host:port is not a URL": {
			env:         []corev1.EnvVar{lit(envAMQPURL, "rabbit:5672")},
			wantSkipped: []string{`AMQP_URL is "rabbit:5672": not an amqp:// or amqps:// URL; cannot rewrite`},
			wantFatal:   "no broker setting",
		},
		"broker-env host without port": {
			env:         []corev1.EnvVar{lit("BROKER", "rabbit")},
			brokerEnv:   "BROKER",
			wantSkipped: []string{`BROKER is "rabbit": neither an amqp:// URL nor host:port; cannot rewrite`},
			wantFatal:   "no broker setting",
		},
		"empty value": {
			env:           []corev1.EnvVar{lit(envAMQPURL, ""), lit(envRabbitMQURL, "amqp://rabbit")},
			wantEnv:       []corev1.EnvVar{lit(envAMQPURL, ""), lit(envRabbitMQURL, "amqp://127.0.0.1:5672")},
			wantSkipped:   []string{"AMQP_URL is empty: cannot rewrite"},
			wantUpstream:  "rabbit:5672",
			wantRewritten: []string{"RABBITMQ_URL: amqp://rabbit → amqp://127.0.0.1:5672"},
		},
		"same broker, two spellings of the port": {
			env:           []corev1.EnvVar{lit(envAMQPURL, "amqp://rabbit"), lit(envSpringHost, "Rabbit")},
			wantEnv:       []corev1.EnvVar{lit(envAMQPURL, "amqp://127.0.0.1:5672"), lit(envSpringHost, "127.0.0.1"), lit(envSpringPort, "5672")},
			wantUpstream:  "rabbit:5672",
			wantRewritten: []string{"AMQP_URL: amqp://rabbit → amqp://127.0.0.1:5672", "SPRING_RABBITMQ_HOST: Rabbit → 127.0.0.1", "SPRING_RABBITMQ_PORT: (unset) → 5672"},
		},
		"a ConfigMap var and nothing else": {
			env:             []corev1.EnvVar{{Name: envRabbitMQURL, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "rabbit"}, Key: "url"}}}},
			wantEnv:         []corev1.EnvVar{lit(envRabbitMQURL, "amqp://ms2m-placeholder:ms2m-placeholder@127.0.0.1:5672/")},
			wantUpstreamRef: "ConfigMap rabbit key url",
			wantRewritten:   []string{"RABBITMQ_URL: from ConfigMap rabbit key url → amqp://ms2m-placeholder:xxxxx@127.0.0.1:5672/ (the sidecar reads the URL from the same reference and puts its credentials, virtual host and TLS into the connection)"},
		},
		"a field reference": {
			env:         []corev1.EnvVar{{Name: envRabbitMQURL, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			wantSkipped: []string{"RABBITMQ_URL comes from a field reference: cannot rewrite; set it as a literal or list a literal var in ms2m.io/broker-env"},
			wantFatal:   "no broker setting",
		},
		"no broker var at all": {
			env:       []corev1.EnvVar{lit("QUEUE", "orders")},
			wantFatal: `container "app" sets none of AMQP_URL, RABBITMQ_URL, SPRING_RABBITMQ_HOST, SPRING_RABBITMQ_ADDRESSES`,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			app := &corev1.Container{Name: "app", Env: tt.env}
			before := app.DeepCopy()
			r := rewriteBroker(app, tt.brokerEnv, 5672)
			if diff := cmp.Diff(before, app); diff != "" {
				t.Errorf("rewriteBroker changed the container (-before +after):\n%s", diff)
			}
			if tt.wantFatal != "" {
				if !strings.Contains(r.fatal, tt.wantFatal) {
					t.Errorf("fatal = %q, want it to contain %q", r.fatal, tt.wantFatal)
				}
			} else if r.fatal != "" {
				t.Errorf("fatal = %q, want none", r.fatal)
			}
			if diff := cmp.Diff(tt.wantSkipped, r.skipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
			if tt.wantFatal != "" {
				return
			}
			if diff := cmp.Diff(tt.wantEnv, r.env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			var gotUp, gotRef string
			gotTLS := false
			for _, e := range r.upstream {
				switch {
				case e.Name == envUpstream && e.ValueFrom == nil:
					gotUp = e.Value
				case e.Name == envUpstream:
					gotRef = refName(e.ValueFrom)
				case e.Name == envUpstreamTLS:
					gotTLS = e.Value == "true"
				}
			}
			if gotUp != tt.wantUpstream || gotRef != tt.wantUpstreamRef || gotTLS != tt.wantTLS {
				t.Errorf("upstream = %q, by reference %q, TLS %v; want %q, %q, %v", gotUp, gotRef, gotTLS, tt.wantUpstream, tt.wantUpstreamRef, tt.wantTLS)
			}
			if diff := cmp.Diff(tt.wantRewritten, r.rewritten); diff != "" {
				t.Errorf("rewritten (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCheckpointable: Go's default Multipath TCP listeners are turned off
// through GODEBUG, without overriding what the app chose.
func TestCheckpointable(t *testing.T) {
	for name, tc := range map[string]struct {
		env        []corev1.EnvVar
		want       []corev1.EnvVar
		wantLine   string
		wantReason string
	}{
		"unset":            {want: []corev1.EnvVar{lit(envGoDebug, mptcpOff)}, wantLine: "GODEBUG: (unset) → multipathtcp=0"},
		"empty":            {env: []corev1.EnvVar{lit(envGoDebug, "")}, want: []corev1.EnvVar{lit(envGoDebug, mptcpOff)}, wantLine: "GODEBUG: (unset) → multipathtcp=0"},
		"other settings":   {env: []corev1.EnvVar{lit(envGoDebug, "http2client=0")}, want: []corev1.EnvVar{lit(envGoDebug, "http2client=0,multipathtcp=0")}, wantLine: "GODEBUG: http2client=0 → http2client=0,multipathtcp=0"},
		"app chose mptcp":  {env: []corev1.EnvVar{lit(envGoDebug, "x=1, multipathtcp=1")}, want: []corev1.EnvVar{lit(envGoDebug, "x=1, multipathtcp=1")}},
		"from a reference": {env: []corev1.EnvVar{fromSecret(envGoDebug)}, want: []corev1.EnvVar{fromSecret(envGoDebug)}, wantReason: "GODEBUG: comes from a reference"},
	} {
		t.Run(name, func(t *testing.T) {
			app := &corev1.Container{Env: tc.env}
			line, reason := checkpointable(app)
			if diff := cmp.Diff(tc.want, app.Env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if !strings.HasPrefix(line, tc.wantLine) || (tc.wantLine == "" && line != "") {
				t.Errorf("line = %q, want it to start with %q", line, tc.wantLine)
			}
			if !strings.HasPrefix(reason, tc.wantReason) || (tc.wantReason == "" && reason != "") {
				t.Errorf("reason = %q, want it to start with %q", reason, tc.wantReason)
			}
		})
	}
}

// TestNATSAppNeedsNATSURL: a NATS app is left alone, with the reason, when
// the webhook has no natsURL for the replay log; a natsURL with only one of
// name and key is a bad Config.
func TestNATSAppNeedsNATSURL(t *testing.T) {
	cfg := testConfig
	cfg.NATSURL = SecretKey{}
	pod := testPod(map[string]string{contract.AnnotationInject: "true"})
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NATS_URL", Value: "nats://nats.messaging:4222"}}
	res, err := Inject(Input{Pod: pod}, cfg)
	if err != nil || res.Pod != nil || len(res.Skipped) == 0 || !strings.Contains(res.Skipped[len(res.Skipped)-1], "no natsURL configured") {
		t.Errorf("Inject = %+v, %v; want the pod left alone for want of natsURL", res, err)
	}
	cfg.NATSURL = SecretKey{Name: "ms2m-nats"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "natsURL") {
		t.Errorf("Validate of a natsURL without key = %v", err)
	}
}
