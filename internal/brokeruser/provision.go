package brokeruser

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// StreamAddress is where sidecars reach the broker's stream port, without
// credentials: rabbitmq-stream://host:5552/vhost, or rabbitmq-stream+tls://
// (port 5551).
type StreamAddress struct{ u url.URL }

// ParseStreamAddress reads a stream address. One that carries credentials
// is refused: each namespace's come from its own user.
func ParseStreamAddress(s string) (StreamAddress, error) {
	u, err := url.Parse(s)
	if err != nil {
		return StreamAddress{}, fmt.Errorf("stream address %q: %w", s, err)
	}
	if u.Scheme != "rabbitmq-stream" && u.Scheme != "rabbitmq-stream+tls" || u.Host == "" {
		return StreamAddress{}, fmt.Errorf("stream address %q: want rabbitmq-stream://host:5552/vhost (or rabbitmq-stream+tls://host:5551/vhost)", s)
	}
	if u.User != nil {
		return StreamAddress{}, errors.New("stream address: give it without user and password (rabbitmq-stream://host:5552/vhost); each namespace's sidecars use their own broker user")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return StreamAddress{}, fmt.Errorf("stream address %q: no query or fragment", s)
	}
	if strings.Contains(strings.TrimPrefix(u.Path, "/"), "/") && u.RawPath == "" {
		return StreamAddress{}, fmt.Errorf("stream address %q: the path is the vhost, one segment (escape a / in it as %%2f)", s)
	}
	return StreamAddress{u: *u}, nil
}

// VHost is the vhost the sidecars use, as the stream client reads it from
// the URI: the path without its leading slash, "/" when empty.
func (a StreamAddress) VHost() string {
	if v := strings.TrimPrefix(a.u.Path, "/"); v != "" {
		return v
	}
	return "/"
}

// URI is the address with user's credentials in it.
func (a StreamAddress) URI(user, password string) string {
	u := a.u
	u.User = url.UserPassword(user, password)
	return u.String()
}

func (a StreamAddress) String() string { return a.u.String() }

// Provisioner makes, changes and deletes per-namespace broker users and
// their Secrets. Every step may fail halfway; each method can be run again
// and ends in the same state (a password is written to the Secret before
// the broker is told it, so it is never lost).
type Provisioner struct {
	Management *Management
	Secrets    typedcorev1.SecretsGetter
	Stream     StreamAddress
	// UserPrefix starts the name of every user this Provisioner makes;
	// default contract.BrokerUserPrefix. Clusters (or test runs) that share
	// one broker each need their own, ending in a dot (CheckUserPrefix):
	// users are named by namespace, and Namespaces, which the controller's
	// sweep deletes from, lists only this prefix's.
	UserPrefix string
	// Rand is the randomness of passwords; nil: crypto/rand.
	Rand io.Reader
}

// UserName is namespace ns's broker user.
func (p *Provisioner) UserName(ns string) string { return p.prefix() + ns }

func (p *Provisioner) prefix() string {
	if p.UserPrefix == "" {
		return contract.BrokerUserPrefix
	}
	return p.UserPrefix
}

// Result says what Ensure did.
type Result struct {
	User string
	// NewPassword: the Secret had no usable password, a new one was made.
	NewPassword bool
	// SecretWritten: the Secret was created or changed.
	SecretWritten bool
}

// NotOursError is a broker user of the reserved name that ms2m did not
// make: it is never changed or deleted.
type NotOursError struct{ User string }

func (e *NotOursError) Error() string {
	return fmt.Sprintf("broker user %s exists without the tag %s: ms2m did not make it and will not change or delete it; delete it (rabbitmqctl delete_user %s) if it is stale, or tag it to hand it over",
		e.User, contract.BrokerUserTag, e.User)
}

// Ensure gives namespace ns its broker user, confined to ^ns\., and the
// Secret with its credentials. The Secret's password is kept when it is
// one Ensure could have made; anything else in the Secret (the tenant may
// write it) is replaced.
func (p *Provisioner) Ensure(ctx context.Context, ns string) (Result, error) {
	return p.ensure(ctx, ns, false)
}

// Rotate gives namespace ns's user a new password. Sidecars keep their
// open connections; one that connects again with the old password (its pod
// started before) is refused until its pod is made again, by a migration
// or a restart (docs/security.md).
func (p *Provisioner) Rotate(ctx context.Context, ns string) (Result, error) {
	return p.ensure(ctx, ns, true)
}

func (p *Provisioner) ensure(ctx context.Context, ns string, rotate bool) (Result, error) {
	if err := CheckNamespace(ns); err != nil {
		return Result{}, err
	}
	if err := CheckUserPrefix(p.prefix()); err != nil {
		return Result{}, err
	}
	user := p.UserName(ns)
	res := Result{User: user}
	if err := p.checkOurs(ctx, user); err != nil && !errors.Is(err, ErrNotFound) {
		return res, err
	}
	secrets := p.Secrets.Secrets(ns)
	old, err := secrets.Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return res, fmt.Errorf("read Secret %s/%s: %w", ns, contract.BrokerUserSecret, err)
	}
	if err != nil {
		old = nil
	}
	password := ""
	if old != nil && !rotate && wellFormed(string(old.Data[contract.BrokerUserSecretPassword])) {
		password = string(old.Data[contract.BrokerUserSecretPassword])
	}
	if password == "" {
		if password, err = NewPassword(p.Rand); err != nil {
			return res, err
		}
		res.NewPassword = true
	}
	want := map[string][]byte{
		contract.BrokerUserSecretStreamURI: []byte(p.Stream.URI(user, password)),
		contract.BrokerUserSecretUsername:  []byte(user),
		contract.BrokerUserSecretPassword:  []byte(password),
	}
	if res.SecretWritten, err = p.writeSecret(ctx, ns, old, want); err != nil {
		return res, err
	}
	if err := p.Management.PutUser(ctx, user, password, []string{contract.BrokerUserTag}); err != nil {
		return res, fmt.Errorf("broker user %s of namespace %s: %w", user, ns, err)
	}
	if err := p.Management.PutPermissions(ctx, p.Stream.VHost(), user, PermissionsFor(ns)); err != nil {
		return res, fmt.Errorf("permissions of broker user %s on vhost %q: %w", user, p.Stream.VHost(), err)
	}
	return res, nil
}

// checkOurs returns ErrNotFound if user does not exist, a *NotOursError if
// it exists without ms2m's tag, nil if it is ms2m's.
func (p *Provisioner) checkOurs(ctx context.Context, user string) error {
	u, err := p.Management.GetUser(ctx, user)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return ErrNotFound
		}
		return fmt.Errorf("look up broker user %s: %w", user, err)
	}
	if !u.HasTag(contract.BrokerUserTag) {
		return &NotOursError{User: user}
	}
	return nil
}

// writeSecret makes the Secret hold exactly data, labelled as ms2m's. It
// reports whether it wrote.
func (p *Provisioner) writeSecret(ctx context.Context, ns string, old *corev1.Secret, data map[string][]byte) (bool, error) {
	secrets := p.Secrets.Secrets(ns)
	if old == nil {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name:      contract.BrokerUserSecret,
				Namespace: ns,
				Labels:    map[string]string{contract.ManagedByLabel: contract.ManagedByValue},
			},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return false, fmt.Errorf("create Secret %s/%s: %w", ns, contract.BrokerUserSecret, err)
		}
		return true, nil
	}
	if old.Labels[contract.ManagedByLabel] == contract.ManagedByValue && maps.EqualFunc(old.Data, data, func(a, b []byte) bool { return string(a) == string(b) }) {
		return false, nil
	}
	if old.Type != corev1.SecretTypeOpaque || (old.Immutable != nil && *old.Immutable) {
		return false, fmt.Errorf("the Secret %s/%s is not an Opaque, mutable Secret ms2m can write: delete it, and ms2m makes it again", ns, contract.BrokerUserSecret)
	}
	s := old.DeepCopy()
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[contract.ManagedByLabel] = contract.ManagedByValue
	s.Data, s.StringData = data, nil
	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("update Secret %s/%s: %w", ns, contract.BrokerUserSecret, err)
	}
	return true, nil
}

// Remove deletes namespace ns's broker user, if ms2m made it, and, with
// secret, the namespace's Secret (which goes with the namespace anyway).
// Nothing to delete is no error.
func (p *Provisioner) Remove(ctx context.Context, ns string, secret bool) error {
	if err := CheckNamespace(ns); err != nil {
		return err
	}
	user := p.UserName(ns)
	switch err := p.checkOurs(ctx, user); {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return err
	default:
		if err := p.Management.DeleteUser(ctx, user); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("delete broker user %s: %w", user, err)
		}
	}
	if !secret {
		return nil
	}
	err := p.Secrets.Secrets(ns).Delete(ctx, contract.BrokerUserSecret, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Secret %s/%s: %w", ns, contract.BrokerUserSecret, err)
	}
	return nil
}

// Namespaces returns the namespaces that have a broker user ms2m made.
func (p *Provisioner) Namespaces(ctx context.Context) ([]string, error) {
	users, err := p.Management.ListUsers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list broker users: %w", err)
	}
	var out []string
	for _, u := range users {
		ns, ok := strings.CutPrefix(u.Name, p.prefix())
		if ok && u.HasTag(contract.BrokerUserTag) && CheckNamespace(ns) == nil {
			out = append(out, ns)
		}
	}
	return out, nil
}
