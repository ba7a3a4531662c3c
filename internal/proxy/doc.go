// Package proxy is the sidecar's AMQP 0-9-1 proxy. The app connects to it as
// if it were the broker; each connection is forwarded to the real broker, and
// every frame passes through byte for byte, except where the proxy has to
// act:
//
//   - basic.deliver and basic.get-ok, with their content, are teed into the
//     replay log as they go to the app, and each gets a sequence ID;
//   - the app's basic.ack, basic.nack and basic.reject go upstream only once
//     every delivery they cover is durable in the log (invariant I1);
//   - while quiesced or stopped, new deliveries are held back from the app;
//     a stop cancels the app's consumers upstream, gives the app what was
//     held, and writes a cutoff marker once the app acked it all;
//   - when the broker's connection goes, or the broker closes it
//     (connection.close, held back from the app meanwhile), the app's stays
//     open a moment for the app to ack what it holds, and the broker's
//     redeliveries of what it acked then are acked by the sidecar and kept
//     from the app (drain.go).
//
// Each connection has two pumps. The downstream pump (broker to app) parses
// what it reads, records deliveries and writes the frames on. The upstream
// pump (app to broker) parses, settles acks and queues segments of raw bytes
// for a writer goroutine, which waits on the log before it writes a segment
// that starts with a gated ack. Heartbeats skip that queue so that a slow log
// never starves a connection of them.
//
// # Reading the code
//
// Each pump dispatches a method frame by its amqpwire.MethodKey, in a switch
// of one-liners (onUpMethod in conn_up.go, downMethod in conn_down.go), to a
// small handler per method the proxy acts on: upConsume, upAck, downDeliver,
// downConsumeOk and so on. Each handler's comment says what it does in each
// mode: serving, quiesced and stopped are the connection's Mode; replaying is
// a target's state while a queue is still served from the log (replay.go),
// whatever the Mode. The mode changes themselves (holding, releasing,
// cancelling and consuming again) are in modes.go. Every method not listed
// passes through untouched.
//
// The tests in pipe_test.go drive one connection over net.Pipe between a
// fake app and a fake broker through each mode change; the sidecar package's
// tests run the same against a real broker. alloc_test.go holds the
// pass-through path (a delivery to the app, an ack to the broker) to its
// allocation count.
package proxy
