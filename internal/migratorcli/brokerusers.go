package migratorcli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/brokeruser"
	"github.com/ms2m/ms2m/internal/contract"
)

// BrokerUserConfig is how the controller and `migrator broker-users` reach
// RabbitMQ's management API and what they write into each namespace's
// Secret. The controller provisions only when ManagementURL is set.
type BrokerUserConfig struct {
	// ManagementURL is the HTTP management API, http(s)://host:15672.
	ManagementURL string `env:"MS2M_BROKER_MANAGEMENT_URL"`
	// ManagementCAFile verifies an https ManagementURL (default: the
	// system's roots).
	ManagementCAFile string `env:"MS2M_BROKER_MANAGEMENT_CA_FILE"`
	// The administrator (tag administrator) that makes the users: each
	// value directly or from a file (the chart mounts a Secret).
	AdminUsername     string `env:"MS2M_BROKER_ADMIN_USERNAME"`
	AdminUsernameFile string `env:"MS2M_BROKER_ADMIN_USERNAME_FILE"`
	AdminPassword     string `env:"MS2M_BROKER_ADMIN_PASSWORD"`
	AdminPasswordFile string `env:"MS2M_BROKER_ADMIN_PASSWORD_FILE"`
	// StreamAddress is where sidecars reach the stream port, without
	// credentials: rabbitmq-stream://host:5552/vhost.
	StreamAddress string `env:"MS2M_BROKER_STREAM_ADDRESS"`
	// UserPrefix starts each user's name; one per cluster sharing a broker.
	UserPrefix string `env:"MS2M_BROKER_USER_PREFIX" envDefault:"ms2m-ns."`
	// Namespaces, when set, are the only ones the controller provisions
	// (the chart's workloadNamespaces).
	Namespaces []string `env:"MS2M_BROKER_USER_NAMESPACES" envSeparator:","`
}

// provisioner checks c and builds the Provisioner it describes.
func (c BrokerUserConfig) provisioner(cs kubernetes.Interface) (*brokeruser.Provisioner, error) {
	var errs []error
	if c.ManagementURL == "" {
		errs = append(errs, errors.New("MS2M_BROKER_MANAGEMENT_URL (--management-url): the RabbitMQ management API, http(s)://host:15672"))
	}
	user, err := valueOrFile("MS2M_BROKER_ADMIN_USERNAME", c.AdminUsername, c.AdminUsernameFile)
	if err != nil {
		errs = append(errs, err)
	}
	password, err := valueOrFile("MS2M_BROKER_ADMIN_PASSWORD", c.AdminPassword, c.AdminPasswordFile)
	if err != nil {
		errs = append(errs, err)
	}
	addr, err := brokeruser.ParseStreamAddress(c.StreamAddress)
	if err != nil {
		errs = append(errs, fmt.Errorf("MS2M_BROKER_STREAM_ADDRESS (--stream-address): %w", err))
	}
	if err := brokeruser.CheckUserPrefix(c.UserPrefix); err != nil {
		errs = append(errs, fmt.Errorf("MS2M_BROKER_USER_PREFIX (--user-prefix): %w", err))
	}
	for _, ns := range c.Namespaces {
		if err := brokeruser.CheckNamespace(ns); err != nil {
			errs = append(errs, fmt.Errorf("MS2M_BROKER_USER_NAMESPACES: %w", err))
		}
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if c.ManagementCAFile != "" {
		pem, err := os.ReadFile(c.ManagementCAFile)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			errs = append(errs, fmt.Errorf("MS2M_BROKER_MANAGEMENT_CA_FILE %s: no PEM certificate could be read (%v)", c.ManagementCAFile, err))
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &brokeruser.Provisioner{
		Management: &brokeruser.Management{URL: c.ManagementURL, Username: user, Password: password, Client: hc},
		Secrets:    cs.CoreV1(),
		Stream:     addr,
		UserPrefix: c.UserPrefix,
	}, nil
}

// valueOrFile is the variable's value, or its file's content.
func valueOrFile(name, value, file string) (string, error) {
	switch {
	case value != "" && file != "":
		return "", fmt.Errorf("%s and %s_FILE are both set: set one", name, name)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s_FILE: %w", name, err)
		}
		value = strings.TrimSpace(string(b))
	}
	if value == "" {
		return "", fmt.Errorf("%s or %s_FILE: required", name, name)
	}
	return value, nil
}

const brokerUsersUsage = `migrator broker-users ensure|rotate|remove <namespace>... [flags]

Gives each namespace a RabbitMQ user of its own whose permissions match only
its replay logs (^<namespace>\.), and writes its credentials into the Secret
` + contract.BrokerUserSecret + ` of the namespace, which the webhook points each sidecar at
(MS2M_WEBHOOK_BROKER_USERS=true). For operators who provision themselves
instead of letting the controller hold the broker's administrator.

  ensure   make the user and the Secret, or bring them back in line (idempotent)
  rotate   give the user a new password (running sidecars keep their
           connections; a pod started before connects again only once made
           again, e.g. by a migration)
  remove   delete the user and the Secret

Flags default to the controller's MS2M_BROKER_* variables.
`

func brokerUsersCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "ensure" && args[0] != "rotate" && args[0] != "remove") {
		fmt.Fprint(stderr, brokerUsersUsage)
		return 2
	}
	verb := args[0]
	fs := flag.NewFlagSet("broker-users "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, brokerUsersUsage); fs.PrintDefaults() }
	env := func(k string) string { return os.Getenv(k) }
	var c BrokerUserConfig
	kubeconfig := fs.String("kubeconfig", env("KUBECONFIG"), "kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	fs.StringVar(&c.ManagementURL, "management-url", env("MS2M_BROKER_MANAGEMENT_URL"), "RabbitMQ management API, http(s)://host:15672")
	fs.StringVar(&c.ManagementCAFile, "management-ca-file", env("MS2M_BROKER_MANAGEMENT_CA_FILE"), "CA that signs an https management API's certificate")
	fs.StringVar(&c.AdminUsername, "admin-user", env("MS2M_BROKER_ADMIN_USERNAME"), "the broker administrator")
	fs.StringVar(&c.AdminPasswordFile, "admin-password-file", env("MS2M_BROKER_ADMIN_PASSWORD_FILE"), "file holding its password (or $MS2M_BROKER_ADMIN_PASSWORD)")
	fs.StringVar(&c.StreamAddress, "stream-address", env("MS2M_BROKER_STREAM_ADDRESS"), "where sidecars reach the stream port, without credentials: rabbitmq-stream://host:5552/vhost")
	prefix := env("MS2M_BROKER_USER_PREFIX")
	if prefix == "" {
		prefix = contract.BrokerUserPrefix
	}
	fs.StringVar(&c.UserPrefix, "user-prefix", prefix, "start of each user's name; one per cluster that shares the broker")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if c.AdminPasswordFile == "" {
		c.AdminPassword = env("MS2M_BROKER_ADMIN_PASSWORD")
	}
	if fs.NArg() == 0 {
		fmt.Fprintf(stderr, "migrator broker-users %s: name at least one namespace\n", verb)
		return 2
	}
	cs, err := kubeClient(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "migrator broker-users: %v\n", err)
		return 1
	}
	p, err := c.provisioner(cs)
	if err != nil {
		fmt.Fprintf(stderr, "migrator broker-users: %v\n", err)
		return 2
	}
	code := 0
	for _, ns := range fs.Args() {
		var res brokeruser.Result
		switch verb {
		case "ensure":
			res, err = p.Ensure(ctx, ns)
		case "rotate":
			res, err = p.Rotate(ctx, ns)
		case "remove":
			err = p.Remove(ctx, ns, true)
		}
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "%s: %v\n", ns, err)
			code = 1
		case verb == "remove":
			fmt.Fprintf(stdout, "%s: broker user %s and Secret %s removed\n", ns, p.UserName(ns), contract.BrokerUserSecret)
		default:
			what := "unchanged"
			if res.NewPassword {
				what = "new password"
			}
			fmt.Fprintf(stdout, "%s: broker user %s confined to %s, Secret %s (%s)\n", ns, res.User, brokeruser.PermissionsFor(ns).Read, contract.BrokerUserSecret, what)
		}
	}
	return code
}
