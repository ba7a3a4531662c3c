package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// The host's broker, as the demo reaches it over loopback. The producer's
// default URL is amqpURL too.
const (
	amqpURL   = "amqp://guest:guest@127.0.0.1:5672/"
	streamURI = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
)

// natsAddr is the host's NATS server (with JetStream), as the demo reaches
// it over loopback; pods reach it through the cluster's forwarder.
const (
	natsAddr = "127.0.0.1:4222"
	natsURL  = "nats://" + natsAddr
)

// checkNATS fails early, with what to do, when the NATS server the NATS
// row's consumer and its replay log use is not ready.
func checkNATS() error {
	if err := lab.CheckNATS(natsAddr); err != nil {
		return fmt.Errorf("%w; the demo's NATS row needs it: run `make setup` as root, which installs nats-server and starts it with JetStream", err)
	}
	return nil
}

// checkBroker fails early, with what to do, when the broker the pods will
// use is not ready: AMQP with the lab's user (guest may use loopback only,
// and pods are not on it) and the stream port for the replay logs.
func checkBroker() error {
	u := fmt.Sprintf("amqp://%s:%s@127.0.0.1:5672/", lab.BrokerUser, lab.BrokerPassword)
	c, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return fmt.Errorf("the broker at 127.0.0.1:5672 does not accept the user %s that the pods use (%w); run `make setup` as root, which starts RabbitMQ and adds the user", lab.BrokerUser, err)
	}
	c.Close()
	s, err := net.DialTimeout("tcp", "127.0.0.1:5552", 5*time.Second)
	if err != nil {
		return fmt.Errorf("nothing listens on the broker's stream port 127.0.0.1:5552, where the replay logs live (%w); run `make setup` as root, which enables the rabbitmq_stream plugin", err)
	}
	return s.Close()
}

// deleteQueue deletes a primary queue the producer declared.
func deleteQueue(queue string) error {
	c, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return fmt.Errorf("delete queue %s: %w", queue, err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return fmt.Errorf("delete queue %s: %w", queue, err)
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		return fmt.Errorf("delete queue %s: %w", queue, err)
	}
	return nil
}

// deleteBrokerObjects deletes a migration's primary queue and replay log.
func deleteBrokerObjects(ctx context.Context, queue, log string) error {
	err := deleteQueue(queue)
	if log != "" {
		err = errors.Join(err, shadowqueue.DeleteStream(ctx, streamURI, log))
	}
	return err
}

// deleteNATSObjects deletes a NATS migration's stream (nil when it was
// never made) and replay log.
func deleteNATSObjects(ctx context.Context, stream *lab.NATSStream, log string) error {
	var err error
	if stream != nil {
		err = stream.Delete(ctx)
	}
	if log != "" {
		err = errors.Join(err, shadowqueue.DeleteJetStream(ctx, natsURL, log))
	}
	return err
}
