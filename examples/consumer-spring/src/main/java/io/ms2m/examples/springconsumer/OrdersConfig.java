package io.ms2m.examples.springconsumer;

import org.springframework.amqp.core.Queue;
import org.springframework.amqp.rabbit.config.ContainerCustomizer;
import org.springframework.amqp.rabbit.connection.ConnectionNameStrategy;
import org.springframework.amqp.rabbit.listener.SimpleMessageListenerContainer;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;

/**
 * The beans around the listener. The queue is a bean, so Spring's RabbitAdmin
 * declares it (durable, not exclusive, no auto-delete, no arguments: the
 * producer's declaration) whenever a connection opens; DECLARE=false leaves
 * it out for a queue that exists already with other settings.
 */
@Configuration
public class OrdersConfig {
	@Bean
	@ConditionalOnProperty(name = "orders.declare", havingValue = "true", matchIfMissing = true)
	Queue ordersQueue(@Value("${orders.queue}") String name) {
		return new Queue(name, true, false, false);
	}

	@Bean
	ChainState chainState(@Value("${orders.skip-redeliveries}") boolean skipRedeliveries) {
		return new ChainState(skipRedeliveries);
	}

	/**
	 * Spring Boot has no property for the listener container's
	 * channelTransacted, so orders.channel-transacted (CHANNEL_TRANSACTED,
	 * default false) sets it through the customizer Boot applies to the
	 * containers its factory makes. Transacted, the container opens the
	 * channel with tx.select and sends each ack in a transaction it
	 * commits (tx.commit) when the listener returns, or rolls back when it
	 * throws.
	 */
	@Bean
	ContainerCustomizer<SimpleMessageListenerContainer> channelTransacted(
			@Value("${orders.channel-transacted}") boolean transacted) {
		return container -> container.setChannelTransacted(transacted);
	}

	/** The client-provided connection name, which the broker's tools show. */
	@Bean
	ConnectionNameStrategy connectionName(@Value("${orders.connection-name}") String name) {
		return factory -> name;
	}
}
