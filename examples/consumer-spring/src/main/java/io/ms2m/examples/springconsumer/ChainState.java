package io.ms2m.examples.springconsumer;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;

/**
 * The consumer's state: the SHA-256 hash chain h_i = SHA256(h_(i-1) || body_i)
 * from h_0 = 32 zero bytes, the count, the last body, the connection status
 * and the journal of folds that GET /folds serves. Thread-safe: the listener
 * writes it while the HTTP server reads it.
 */
public class ChainState {
	/** Bounds the journal; when it is full the older half goes. */
	static final int JOURNAL_MAX = 100_000;

	/** One folded message, as GET /folds of the Go consumer shows it. */
	public record Fold(long id, double latency_ms, long at_ns, long sent_ns) {
	}

	/** The body of GET /state. */
	public record Snapshot(int count, String hash, String last, boolean connected, int reconnects,
			double max_latency_ms, int skipped_redeliveries) {
	}

	/** The body of GET /folds. */
	public record Folds(List<Fold> folds, int dropped) {
	}

	private final boolean skipRedeliveries;
	private byte[] hash = new byte[32];
	private int count;
	private String last = "";
	private long lastId;
	private boolean haveLastId;
	private int skipped;
	private boolean connected;
	private int sessions;
	private long maxLatencyNs;
	private final List<Fold> journal = new ArrayList<>();
	private int dropped;

	public ChainState(boolean skipRedeliveries) {
		this.skipRedeliveries = skipRedeliveries;
	}

	/**
	 * Folds one message and returns true. With the redelivery skip on, it
	 * returns false instead for a redelivered message whose numeric
	 * message-id is not above the last folded one's (examples/README.md,
	 * Redelivery). sentAtNs is the x-sent-at header in Unix nanoseconds, or
	 * null; nowNs is the fold's time in Unix nanoseconds.
	 */
	public synchronized boolean apply(byte[] body, String messageId, boolean redelivered, Long sentAtNs, long nowNs) {
		Long id = parseId(messageId);
		if (skipRedeliveries && redelivered && id != null && haveLastId && id <= lastId) {
			skipped++;
			return false;
		}
		MessageDigest d = sha256();
		d.update(hash);
		d.update(body);
		hash = d.digest();
		count++;
		last = new String(body, StandardCharsets.UTF_8);
		haveLastId = id != null;
		lastId = id != null ? id : 0;
		double latencyMs = -1;
		long sentNs = 0;
		if (sentAtNs != null) {
			long latencyNs = nowNs - sentAtNs;
			maxLatencyNs = Math.max(maxLatencyNs, latencyNs);
			latencyMs = latencyNs / 1e6;
			sentNs = sentAtNs;
		}
		if (journal.size() == JOURNAL_MAX) {
			journal.subList(0, JOURNAL_MAX / 2).clear();
			dropped += JOURNAL_MAX / 2;
		}
		journal.add(new Fold(id != null ? id : -1, latencyMs, nowNs, sentNs));
		return true;
	}

	/** Records that a consumer started (true) or stopped (false) consuming. */
	public synchronized void setConnected(boolean c) {
		connected = c;
		if (c) {
			sessions++;
		}
	}

	public synchronized Snapshot snapshot() {
		return new Snapshot(count, HexFormat.of().formatHex(hash), last, connected, Math.max(0, sessions - 1),
				maxLatencyNs / 1e6, skipped);
	}

	public synchronized Folds folds() {
		return new Folds(List.copyOf(journal), dropped);
	}

	private static Long parseId(String s) {
		if (s == null) {
			return null;
		}
		try {
			return Long.parseLong(s);
		} catch (NumberFormatException e) {
			return null;
		}
	}

	private static MessageDigest sha256() {
		try {
			return MessageDigest.getInstance("SHA-256");
		} catch (NoSuchAlgorithmException e) {
			throw new IllegalStateException("this JRE has no SHA-256", e);
		}
	}
}
