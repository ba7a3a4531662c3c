package io.ms2m.examples.springconsumer;

import java.util.HashMap;
import java.util.Map;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;

/**
 * The sample consumer as a Spring Boot service: a {@code @RabbitListener}
 * folds the hash chain of examples/README.md over the message bodies and a
 * {@code @RestController} serves it. The broker comes from Spring's own
 * settings (SPRING_RABBITMQ_HOST, SPRING_RABBITMQ_ADDRESSES, ...); the
 * listener container runs with Spring's defaults (prefetch 250, automatic
 * acks after the listener returns, its own consumer restart after a channel
 * or connection loss).
 */
@SpringBootApplication
public class ConsumerApplication {
	public static void main(String[] args) {
		SpringApplication app = new SpringApplication(ConsumerApplication.class);
		app.setDefaultProperties(httpAddr(System.getenv("HTTP_ADDR")));
		app.run(args);
	}

	/**
	 * Turns the HTTP_ADDR of the other sample consumers (host:port) into
	 * Spring's server.address and server.port; SERVER_PORT and
	 * SERVER_ADDRESS still win, as Spring's own settings do.
	 */
	static Map<String, Object> httpAddr(String addr) {
		Map<String, Object> props = new HashMap<>();
		if (addr == null || addr.isEmpty()) {
			return props;
		}
		int colon = addr.lastIndexOf(':');
		if (colon < 0) {
			throw new IllegalArgumentException("HTTP_ADDR=" + addr + ": want host:port");
		}
		String host = addr.substring(0, colon);
		if (host.startsWith("[") && host.endsWith("]")) {
			host = host.substring(1, host.length() - 1);
		}
		if (!host.isEmpty()) {
			props.put("server.address", host);
		}
		props.put("server.port", Integer.parseInt(addr.substring(colon + 1)));
		return props;
	}
}
