package brokeruser

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// rig is a real kube-apiserver, the real broker and its management API, and
// a Provisioner over them.
type rig struct {
	cs    kubernetes.Interface
	mgmt  *Management
	prov  *Provisioner
	admin string // the stream URI of the broker's guest (loopback administrator)
}

func newRig(t *testing.T) *rig {
	t.Helper()
	m := testenv.RequireManagement(t)
	b := testenv.RequireBroker(t)
	cs, err := kubernetes.NewForConfig(testenv.ControlPlane(t))
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(b.StreamURI)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := ParseStreamAddress("rabbitmq-stream://" + u.Host + "/")
	if err != nil {
		t.Fatal(err)
	}
	mgmt := &Management{URL: m.URL, Username: m.Username, Password: m.Password}
	// A prefix of this test's own: the broker is shared with other tests
	// and the local cluster.
	prefix := testenv.UniqueName("ms2m-test") + "."
	return &rig{cs: cs, mgmt: mgmt, admin: b.StreamURI, prov: &Provisioner{Management: mgmt, Secrets: cs.CoreV1(), Stream: addr, UserPrefix: prefix}}
}

// tenant makes namespace ns, provisions it, and returns the stream URI
// from its Secret, as a tenant who reads its own Secret would.
func (r *rig) tenant(t *testing.T, ns string) string {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	if _, err := r.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.prov.Remove(context.WithoutCancel(t.Context()), ns, false); err != nil {
			t.Errorf("remove the broker user of %s: %v", ns, err)
		}
	})
	if _, err := r.prov.Ensure(ctx, ns); err != nil {
		t.Fatalf("provision %s: %v", ns, err)
	}
	s, err := r.cs.CoreV1().Secrets(ns).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(s.Data[contract.BrokerUserSecretStreamURI])
}

// dial connects to the stream port as the URI's user.
func dial(t *testing.T, uri string) *stream.Environment {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(uri).
		SetAddressResolver(stream.AddressResolver{Host: u.Hostname(), Port: port}).SetMaxProducersPerClient(1))
	if err != nil {
		t.Fatalf("connect to the stream port as %s: %v", u.User.Username(), err)
	}
	t.Cleanup(func() { _ = env.Close() })
	return env
}

// publish sends one message and waits for the broker's confirmation.
func publish(env *stream.Environment, name string) error {
	p, err := env.NewProducer(name, nil)
	if err != nil {
		return err
	}
	defer p.Close()
	confirms := p.NotifyPublishConfirmation()
	if err := p.Send(amqp.NewMessage([]byte("hello"))); err != nil {
		return err
	}
	select {
	case c := <-confirms:
		for _, m := range c {
			if !m.IsConfirmed() {
				return errors.New("publish not confirmed")
			}
		}
		return nil
	case <-time.After(20 * time.Second):
		return errors.New("no confirmation in 20s")
	}
}

// consume subscribes from the first offset and waits for one message.
func consume(env *stream.Environment, name string) error {
	got := make(chan struct{}, 1)
	c, err := env.NewConsumer(name, func(stream.ConsumerContext, *amqp.Message) {
		select {
		case got <- struct{}{}:
		default:
		}
	}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		return err
	}
	defer c.Close()
	select {
	case <-got:
		return nil
	case <-time.After(20 * time.Second):
		return errors.New("no message in 20s")
	}
}

// TestNamespaceUserConfinedToItsStreams performs, as a tenant holding its
// own namespace's credentials, what issue 20 names: reading, writing,
// declaring and deleting another namespace's replay log. Namespace A is a
// prefix of B ("shop" and "shop-eu"): the dot in ^shop\. is what keeps A
// out of B's streams. With the shared credentials of before, every one of
// these succeeded.
func TestNamespaceUserConfinedToItsStreams(t *testing.T) {
	r := newRig(t)
	nsA := testenv.UniqueName("shop")
	nsB := nsA + "-eu"
	uriA, uriB := r.tenant(t, nsA), r.tenant(t, nsB)
	logA, logB := nsA+".orders", nsB+".orders"
	ctx := context.WithoutCancel(t.Context())
	for _, name := range []string{logA, logB, nsA + "x.orders"} {
		t.Cleanup(func() {
			if err := shadowqueue.DeleteStream(context.WithoutCancel(t.Context()), r.admin, name); err != nil {
				t.Errorf("clean up: %v", err)
			}
		})
	}

	// Each tenant uses its own log as a sidecar does: declare, write, read.
	for _, c := range []struct{ uri, name string }{{uriA, logA}, {uriB, logB}} {
		l, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{URI: c.uri, Name: c.name, MaxAge: time.Hour})
		if err != nil {
			t.Fatalf("a sidecar opens its own namespace's log %s: %v", c.name, err)
		}
		if err := l.Write(ctx, []shadowqueue.Record{{Kind: shadowqueue.KindDelivery, ID: 1, Queue: "q", Body: []byte("mine")}}); err != nil {
			t.Fatalf("write own log %s: %v", c.name, err)
		}
		recs, err := l.ReadAll(ctx)
		if err != nil || len(recs) != 1 || string(recs[0].Body) != "mine" {
			t.Fatalf("read own log %s: %v %v", c.name, recs, err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// A tenant against the other's log, with its own client.
	for _, c := range []struct {
		who, uri, victim string
	}{{"A (" + nsA + ")", uriA, logB}, {"B (" + nsB + ")", uriB, logA}} {
		env := dial(t, c.uri)
		if err := publish(env, c.victim); !errors.Is(err, stream.CodeAccessRefused) {
			t.Errorf("%s writes %s: %v, want access refused", c.who, c.victim, err)
		}
		if err := consume(env, c.victim); !errors.Is(err, stream.CodeAccessRefused) {
			t.Errorf("%s reads %s: %v, want access refused", c.who, c.victim, err)
		}
		if err := env.DeclareStream(c.victim, nil); !errors.Is(err, stream.CodeAccessRefused) {
			t.Errorf("%s declares %s: %v, want access refused", c.who, c.victim, err)
		}
		if err := env.DeleteStream(c.victim); !errors.Is(err, stream.CodeAccessRefused) {
			t.Errorf("%s deletes %s: %v, want access refused", c.who, c.victim, err)
		}
		if _, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{URI: c.uri, Name: c.victim}); err == nil {
			t.Errorf("%s opens %s as a sidecar would: no error", c.who, c.victim)
		}
	}
	// Nor a name that merely starts with A's namespace.
	envA := dial(t, uriA)
	if err := envA.DeclareStream(nsA+"x.orders", nil); !errors.Is(err, stream.CodeAccessRefused) {
		t.Errorf("A declares %sx.orders: %v, want access refused", nsA, err)
	}
	// The victims' logs are untouched: still there, one record each.
	for _, name := range []string{logA, logB} {
		if err := consume(dial(t, r.admin), name); err != nil {
			t.Errorf("log %s after the attacks: %v", name, err)
		}
	}

	// Over AMQP 0-9-1 with the same credentials: B's stream as a queue.
	au, _ := url.Parse(uriA)
	amqpURL := "amqp://" + au.User.String() + "@" + au.Hostname() + ":5672/"
	conn, err := amqp091.Dial(amqpURL)
	if err != nil {
		t.Fatalf("A connects over AMQP: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	_, err = ch.Consume(logB, "", false, false, false, false, amqp091.Table{"x-stream-offset": "first"})
	var ae *amqp091.Error
	if !errors.As(err, &ae) || ae.Code != amqp091.AccessRefused {
		t.Errorf("A consumes %s over AMQP: %v, want 403 access refused", logB, err)
	}

	// Neither user may use the management API.
	for _, uri := range []string{uriA, uriB} {
		u, _ := url.Parse(uri)
		pw, _ := u.User.Password()
		m := &Management{URL: r.mgmt.URL, Username: u.User.Username(), Password: pw}
		var ae *APIError
		if _, err := m.ListUsers(ctx); !errors.As(err, &ae) || ae.Status != 401 {
			t.Errorf("%s lists broker users: %v, want 401", u.User.Username(), err)
		}
	}
}

// TestEnsureIsIdempotent provisions a namespace twice and after each kind
// of half-done or tampered state, and checks that it ends with one user,
// its permissions, and a Secret whose credentials log in.
func TestEnsureIsIdempotent(t *testing.T) {
	r := newRig(t)
	ns := testenv.UniqueName("idem")
	uri := r.tenant(t, ns)
	ctx := context.WithoutCancel(t.Context())
	user := r.prov.UserName(ns)

	res, err := r.prov.Ensure(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if res.NewPassword || res.SecretWritten {
		t.Errorf("second Ensure: %+v, want nothing new", res)
	}
	check := func(step, want string) {
		t.Helper()
		s, err := r.cs.CoreV1().Secrets(ns).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		got := string(s.Data[contract.BrokerUserSecretStreamURI])
		if want != "" && got != want {
			t.Errorf("%s: the Secret's URI changed", step)
		}
		if s.Labels[contract.ManagedByLabel] != contract.ManagedByValue {
			t.Errorf("%s: the Secret lost its label", step)
		}
		p, err := r.mgmt.GetPermissions(ctx, "/", user)
		if err != nil || p != PermissionsFor(ns) {
			t.Errorf("%s: permissions %+v (%v), want %+v", step, p, err, PermissionsFor(ns))
		}
		name := ns + ".idem"
		t.Cleanup(func() { _ = shadowqueue.DeleteStream(context.WithoutCancel(t.Context()), r.admin, name) })
		if err := dial(t, got).DeclareStream(name, nil); err != nil {
			t.Errorf("%s: the Secret's credentials: %v", step, err)
		}
	}
	check("second Ensure", uri)

	// The broker lost the user (deleted by hand): Ensure makes it again
	// with the Secret's password.
	if err := r.mgmt.DeleteUser(ctx, user); err != nil {
		t.Fatal(err)
	}
	if _, err := r.prov.Ensure(ctx, ns); err != nil {
		t.Fatal(err)
	}
	check("user deleted", uri)

	// The tenant wrote junk into its Secret: a new password replaces it.
	s, _ := r.cs.CoreV1().Secrets(ns).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{})
	s.Data[contract.BrokerUserSecretPassword] = []byte("x@y/../" + string(make([]byte, 300)))
	delete(s.Labels, contract.ManagedByLabel)
	if _, err := r.cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, err := r.prov.Ensure(ctx, ns); err != nil || !res.NewPassword {
		t.Fatalf("Ensure after junk: %+v %v, want a new password", res, err)
	}
	check("junk in the Secret", "")

	// Rotate: a new password, and the old one no longer logs in.
	before, _ := r.cs.CoreV1().Secrets(ns).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{})
	if _, err := r.prov.Rotate(ctx, ns); err != nil {
		t.Fatal(err)
	}
	check("rotated", "")
	old := string(before.Data[contract.BrokerUserSecretStreamURI])
	ou, _ := url.Parse(old)
	port, _ := strconv.Atoi(ou.Port())
	if env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(old).
		SetAddressResolver(stream.AddressResolver{Host: ou.Hostname(), Port: port}).SetMaxProducersPerClient(1)); err == nil {
		env.Close()
		t.Error("the password from before the rotation still logs in")
	}

	// A user of the reserved name that ms2m did not make is left alone.
	other := testenv.UniqueName("foreign")
	if err := r.mgmt.PutUser(ctx, r.prov.UserName(other), "not-ours-password", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.mgmt.DeleteUser(context.WithoutCancel(t.Context()), r.prov.UserName(other)) })
	if _, err := r.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var notOurs *NotOursError
	if _, err := r.prov.Ensure(ctx, other); !errors.As(err, &notOurs) {
		t.Errorf("Ensure over a foreign user: %v, want a NotOursError", err)
	}
	if err := r.prov.Remove(ctx, other, true); !errors.As(err, &notOurs) {
		t.Errorf("Remove of a foreign user: %v, want a NotOursError", err)
	}
	if _, err := r.mgmt.GetUser(ctx, r.prov.UserName(other)); err != nil {
		t.Errorf("the foreign user: %v", err)
	}
	if _, err := r.cs.CoreV1().Secrets(other).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{}); err == nil {
		t.Error("a Secret was written for a namespace whose user is not ours")
	}

	// Remove deletes the user and the Secret; twice is no error.
	for range 2 {
		if err := r.prov.Remove(ctx, ns, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.mgmt.GetUser(ctx, user); !errors.Is(err, ErrNotFound) {
		t.Errorf("user after Remove: %v, want not found", err)
	}
}
