// Package upstream is the sidecar's side of the connection to the broker:
// an ordered list of broker addresses tried in turn (the next one when one
// is down, as the app's client would), TLS with the CA, client certificate
// and server name the app had (verification on), and the handshake rewrite
// that puts the real credentials, virtual host and SASL mechanism into the
// connection when the app's are the placeholders the webhook gave it. The
// app speaks plain AMQP to the sidecar on loopback; the sidecar owns the
// connection to the broker. Passwords never appear in its errors or logs.
package upstream
