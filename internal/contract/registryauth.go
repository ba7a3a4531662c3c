package contract

import "log/slog"

// RegistryAuth is one registry's credentials, from a pod's
// imagePullSecrets, that the migrator sends the target node's agent for
// the pre-pull of the pod's image (POST /v1/pulls, over TLS). It never
// prints or logs its secrets: String and LogValue say only which parts are
// set; JSON carries them (the wire).
type RegistryAuth struct {
	// Registry is the host[:port] the credentials are for, as the
	// Secret's key named it.
	Registry string `json:"registry,omitempty"`
	// Username and Password: basic authentication.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// IdentityToken is an OAuth refresh token for the registry's token
	// service; RegistryToken a bearer token sent as is.
	IdentityToken string `json:"identityToken,omitempty"`
	RegistryToken string `json:"registryToken,omitempty"`
}

// String names the registry and which credentials are set, never their
// values.
func (a RegistryAuth) String() string {
	s := "credentials for " + a.Registry + ":"
	for _, part := range []struct{ name, v string }{{"username", a.Username}, {"password", a.Password}, {"identity token", a.IdentityToken}, {"registry token", a.RegistryToken}} {
		if part.v != "" {
			s += " " + part.name
		}
	}
	return s
}

// GoString is String, so that %#v does not print the secrets either.
func (a RegistryAuth) GoString() string { return a.String() }

// LogValue is String, for slog.
func (a RegistryAuth) LogValue() slog.Value { return slog.StringValue(a.String()) }
