// Package natsproxy is the sidecar's NATS proxy. The app connects to it as
// if it were the NATS server; each connection is forwarded to the real
// server, and every protocol message passes through byte for byte, except
// where the proxy has to act:
//
//   - the server's INFO loses the fields that advertise other servers
//     (connect_urls, ws_connect_urls, leafnode_urls), so that the app does
//     not reconnect around the proxy;
//   - every JetStream delivery to the app (a MSG or HMSG whose reply subject
//     is a $JS.ACK subject: push consumers, and pull consumers' replies to
//     $JS.API.CONSUMER.MSG.NEXT) is teed into the replay log as it goes to
//     the app, and gets a sequence ID;
//   - the app's acks (+ACK, -NAK, +WPI, +TERM, +NXT published to a $JS.ACK
//     subject) go to the server only once the delivery they settle is
//     durable in the log (invariant I1), on whichever connection they
//     come: after a cut, the clients send the acks they buffered on their
//     new connection. An ack for a delivery this proxy did not hand out
//     (one made before the sidecar restarted, say) is absorbed: the server
//     redelivers the message after its ack wait, as a broker redelivers an
//     AMQP delivery whose connection dropped.
//
// A stop first takes the app's JetStream subscriptions off the server (UNSUB
// on its behalf) and waits for the PONG of a PING sent after them, so that
// nothing reaches a stopped proxy; while quiesced or stopped the proxy
// answers the app's pull requests itself, as the server would (a 408 at
// their expiry).
//
// On a target (Options.Replay), the records of each JetStream consumer up
// to the cutoff are fed into the app's push subscription on the
// consumer's deliver subject (kept from the server meanwhile) or into its
// pull requests, with reply subjects of the proxy's own; their acks and
// the app's publishes are absorbed (a JetStream publish ack is answered).
// Once the app has settled every record of a consumer, that consumer is
// switched to the server.
//
// Flow-control requests, idle heartbeats and other status messages pass
// untouched and are not teed. Core NATS messages (no $JS.ACK reply, on a
// subject outside _INBOX. and $) are teed best effort, as AMQP auto-ack
// deliveries are: nothing gates them, since there is no ack to gate.
//
// Each connection has two pumps. The downstream pump (server to app)
// parses what it reads, tees JetStream deliveries and writes the bytes on,
// as read unless an INFO was rewritten. The upstream pump (app to server)
// parses and queues chunks of raw bytes for a writer goroutine, which waits
// on the log before it writes a chunk that holds an ack of a delivery not
// yet durable, and writes the chunks queued behind it whose acks are
// durable too in the same write (writev). A read's deliveries and acks take
// the clock once. PONGs, the app's answers to the server's PINGs, skip that
// queue so that a slow log never gets the app disconnected as stale.
package natsproxy
