package io.ms2m.examples.springconsumer;

import java.time.Instant;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.springframework.amqp.core.Message;
import org.springframework.amqp.core.MessageProperties;
import org.springframework.amqp.rabbit.annotation.RabbitListener;
import org.springframework.amqp.rabbit.listener.AsyncConsumerStoppedEvent;
import org.springframework.amqp.rabbit.listener.ConsumeOkEvent;
import org.springframework.amqp.rabbit.listener.ListenerContainerConsumerFailedEvent;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.event.EventListener;
import org.springframework.stereotype.Component;

/**
 * Folds each message into the chain after WORK_MS of work. The container
 * acks it when this returns (Spring's AUTO acknowledge mode); an exception,
 * such as the interrupt of a shutdown, sends it back to the queue unfolded.
 */
@Component
public class OrdersListener {
	private static final Logger log = LoggerFactory.getLogger(OrdersListener.class);

	private final ChainState state;
	private final long workMs;

	public OrdersListener(ChainState state, @Value("${orders.work-ms}") long workMs) {
		this.state = state;
		this.workMs = workMs;
	}

	@RabbitListener(id = "orders", queues = "${orders.queue}")
	public void onMessage(Message message) throws InterruptedException {
		if (workMs > 0) {
			Thread.sleep(workMs);
		}
		MessageProperties p = message.getMessageProperties();
		Boolean redelivered = p.getRedelivered();
		state.apply(message.getBody(), p.getMessageId(), redelivered != null && redelivered,
				sentAt(p.getHeader("x-sent-at")), unixNanos(Instant.now()));
	}

	/** A consumer of the container got its consume-ok: a session consumes. */
	@EventListener
	public void consuming(ConsumeOkEvent e) {
		log.info("consuming queue={} consumerTag={}", e.getQueue(), e.getConsumerTag());
		state.setConnected(true);
	}

	/** The container's consumer failed; the container starts a new one. */
	@EventListener
	public void failed(ListenerContainerConsumerFailedEvent e) {
		log.warn("consumer failed, the container restarts it: {}", e.getReason());
		state.setConnected(false);
	}

	@EventListener
	public void stopped(AsyncConsumerStoppedEvent e) {
		state.setConnected(false);
	}

	/** Reads the producer's x-sent-at header (Unix nanoseconds). */
	static Long sentAt(Object v) {
		if (v instanceof Long l) {
			return l;
		}
		if (v instanceof Integer i) {
			return i.longValue();
		}
		return null;
	}

	static long unixNanos(Instant t) {
		return t.getEpochSecond() * 1_000_000_000L + t.getNano();
	}
}
