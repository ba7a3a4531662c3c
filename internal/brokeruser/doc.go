// Package brokeruser gives each namespace a RabbitMQ user of its own for
// its replay logs. A namespace's logs are streams named "<namespace>.…";
// its user may configure, write and read only resources whose name matches
// ^<namespace>\. on the vhost, which is what the stream protocol asks for
// declaring and deleting (configure), publishing (write) and subscribing
// (read). The user is made through RabbitMQ's HTTP management API with an
// administrator's credentials (Management), and its credentials go into
// the Secret contract.BrokerUserSecret in the namespace (Provisioner),
// which the webhook points each sidecar at. The controller provisions every
// namespace in scope; `migrator broker-users` does the same by hand.
package brokeruser
