package contract

// Per-namespace broker users. Every replay log of namespace ns is a stream
// named ns + "." + …; each namespace's sidecars connect to the stream port
// as a broker user of their own, BrokerUserPrefix + ns (by default), whose configure,
// write and read permissions on the vhost match only that prefix
// (internal/brokeruser). Its credentials are in the Secret
// BrokerUserSecret of the namespace, which the controller (or `migrator
// broker-users`) writes and the webhook points each sidecar's
// MS2M_STREAM_URI at, by reference.
const (
	// BrokerUserSecret is the Secret, in each workload namespace, that
	// holds the namespace's broker user.
	BrokerUserSecret = "ms2m-broker-user"
	// BrokerUserSecretStreamURI is its key holding the stream URI with the
	// user's credentials (rabbitmq-stream://user:password@host:5552/vhost).
	BrokerUserSecretStreamURI = "stream-uri"
	// BrokerUserSecretUsername and BrokerUserSecretPassword hold the same
	// credentials apart.
	BrokerUserSecretUsername = "username"
	BrokerUserSecretPassword = "password"

	// BrokerUserPrefix starts every per-namespace broker user's name by
	// default (clusters sharing a broker each set their own). The dot
	// cannot occur in a namespace's name, so no namespace's user is
	// another's, or a user setup made (ms2m-admin, ms2m-tls-client).
	BrokerUserPrefix = "ms2m-ns."
	// BrokerUserTag marks a broker user as made by ms2m: provisioning
	// changes or deletes only users that carry it. RabbitMQ gives the tag
	// no rights (it is none of management, monitoring, policymaker,
	// administrator), so the users cannot open the management API.
	BrokerUserTag = "ms2m-namespace"

	// ManagedByLabel and ManagedByValue mark the Secrets ms2m writes.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "ms2m"
)
