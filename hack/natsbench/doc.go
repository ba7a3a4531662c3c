// Command natsbench measures the NATS sidecar's cost on a JetStream
// consumer. Each round, the same unmodified nats.go pull consumer drains
// a pre-filled stream three ways: straight from the server (direct);
// through a source sidecar (sidecar.Start with MS2M_BROKER=nats: tee into
// a JetStream replay log, acks held until the log has the delivery); and
// from a target sidecar that replays that log up to its last record
// (replay). With -paths direct,relay,... it also drains through a plain
// TCP relay that copies bytes both ways with no parsing and no log
// (relay): the floor any proxy between consumer and server pays on the
// machine, so that the sidecar's own cost can be told from the hop's.
// With -log-server the sidecars' replay logs go to another nats-server,
// so that the main server's CPU leaves out what storing the log costs.
// -pubcost runs no drains: it measures a server's CPU for storing the
// same bytes in JetStream messages of each size, pipelined and one at a
// time, which is what the replay log's writes cost a server.
// It reports messages per second, the ratio to direct round by
// round, and the 95th percentile of the time per chunk of messages, and
// writes the raw figures as JSON with -out. It needs the local nats-server
// (make setup), or another one with JetStream (-server; -server-pid names
// its process for the server's CPU time when several nats-server run, as
// when one is started apart with -profile to profile the server).
package main
