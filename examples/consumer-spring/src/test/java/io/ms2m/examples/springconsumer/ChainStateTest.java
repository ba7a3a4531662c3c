package io.ms2m.examples.springconsumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.Map;

import org.junit.jupiter.api.Test;

class ChainStateTest {
	private static byte[] b(String s) {
		return s.getBytes(StandardCharsets.UTF_8);
	}

	// The same steps and hashes as examples/internal/hashchain's test, which
	// were computed with Python's hashlib.
	@Test
	void foldsTheChainOfTheOtherConsumers() {
		ChainState s = new ChainState(false);
		assertEquals("0000000000000000000000000000000000000000000000000000000000000000", s.snapshot().hash());
		s.apply(b("msg-1"), "1", false, null, 0);
		assertEquals("8d04eca07af490f36bfc4da73b228dcb8c44ad8bbe8060dffeee58ef9b34a28a", s.snapshot().hash());
		s.apply(b("msg-2"), "2", false, null, 0);
		assertEquals("22ff5d847c21b44d950a6665c14e1b012abf6f4b7e8c44b66919a106600cc9c1", s.snapshot().hash());
		s.apply(b(""), null, false, null, 0);
		assertEquals("34fb2bc939245862a8c3c6b5da8d752e6a3c6c3f7b6515b52e75124bcadb58d8", s.snapshot().hash());
		assertEquals(3, s.snapshot().count());
		assertEquals("", s.snapshot().last());
	}

	@Test
	void withoutTheSkipARedeliveryIsFoldedAgain() {
		ChainState s = new ChainState(false);
		s.apply(b("msg-1"), "1", false, null, 0);
		assertTrue(s.apply(b("msg-1"), "1", true, null, 0));
		assertEquals(2, s.snapshot().count());
		assertEquals(0, s.snapshot().skipped_redeliveries());
	}

	@Test
	void theSkipDropsOnlyRedeliveriesOfFoldedIds() {
		ChainState s = new ChainState(true);
		s.apply(b("msg-1"), "1", false, null, 0);
		s.apply(b("msg-2"), "2", false, null, 0);
		assertFalse(s.apply(b("msg-2"), "2", true, null, 0));
		assertTrue(s.apply(b("msg-3"), "3", true, null, 0));
		assertTrue(s.apply(b("msg-1"), "1", false, null, 0)); // a first delivery
		assertTrue(s.apply(b("x"), "x", false, null, 0));
		assertTrue(s.apply(b("x"), "x", true, null, 0)); // no numeric id
		assertEquals(6, s.snapshot().count());
		assertEquals(1, s.snapshot().skipped_redeliveries());
	}

	@Test
	void journalAndLatency() {
		ChainState s = new ChainState(false);
		s.apply(b("a"), "1", false, 70_000_000L, 100_000_000L);
		s.apply(b("b"), "b", false, null, 100_000_000L);
		assertEquals(30.0, s.snapshot().max_latency_ms());
		assertEquals(new ChainState.Fold(1, 30.0, 100_000_000L, 70_000_000L), s.folds().folds().get(0));
		assertEquals(new ChainState.Fold(-1, -1, 100_000_000L, 0), s.folds().folds().get(1));
		for (int i = 0; i < ChainState.JOURNAL_MAX; i++) {
			s.apply(b("m"), Integer.toString(i + 3), false, null, 0);
		}
		assertEquals(ChainState.JOURNAL_MAX / 2, s.folds().dropped());
		assertEquals(ChainState.JOURNAL_MAX - ChainState.JOURNAL_MAX / 2 + 2, s.folds().folds().size());
	}

	@Test
	void connectedAndReconnects() {
		ChainState s = new ChainState(false);
		s.setConnected(true);
		s.setConnected(false);
		s.setConnected(true);
		assertTrue(s.snapshot().connected());
		assertEquals(1, s.snapshot().reconnects());
	}

	@Test
	void httpAddr() {
		assertEquals(Map.of("server.address", "0.0.0.0", "server.port", 8080), ConsumerApplication.httpAddr("0.0.0.0:8080"));
		assertEquals(Map.of("server.address", "::1", "server.port", 9), ConsumerApplication.httpAddr("[::1]:9"));
		assertEquals(Map.of("server.port", 9), ConsumerApplication.httpAddr(":9"));
		assertEquals(Map.of(), ConsumerApplication.httpAddr(""));
		assertThrows(IllegalArgumentException.class, () -> ConsumerApplication.httpAddr("nohost"));
		assertThrows(NumberFormatException.class, () -> ConsumerApplication.httpAddr("h:x"));
	}
}
