package io.ms2m.examples.springconsumer;

import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;

/** GET /state, /folds and /healthz, as the Go consumer serves them. */
@RestController
public class StateController {
	private final ChainState state;

	public StateController(ChainState state) {
		this.state = state;
	}

	@GetMapping("/state")
	public ChainState.Snapshot state() {
		return state.snapshot();
	}

	@GetMapping("/folds")
	public ChainState.Folds folds() {
		return state.folds();
	}

	@GetMapping(value = "/healthz", produces = "text/plain")
	public String healthz() {
		return "ok\n";
	}
}
