package sidecar_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
)

// TestControlTokenOfAnotherNamespaceRefused is issue 20's control-token
// attack against two real sidecars on the real broker: each runs with its
// namespace's token as the webhook writes it (control.TokenFor with the
// controller's key). A tenant of team-a, who can read its own namespace's
// token, calls team-b's sidecar with it, to read its state, quiesce it or
// stop it at a cutoff: each call is refused with 401, and team-b's sidecar
// keeps serving. Before, one value could serve every namespace (the
// chart's secrets.controlToken.value, or the same Secret made everywhere):
// team-a's token was team-b's.
func TestControlTokenOfAnotherNamespaceRefused(t *testing.T) {
	key := []byte("the-controllers-signing-key-01234")
	tokenA, tokenB := control.TokenFor(key, "team-a"), control.TokenFor(key, "team-b")
	if tokenA == tokenB || tokenA == control.TokenFor([]byte("another-controllers-key-0123456"), "team-a") {
		t.Fatalf("tokens are not per namespace and key: %q, %q", tokenA, tokenB)
	}
	start := func(tok string) *sidecar.Sidecar {
		e := newEnv(t)
		cfg := e.config()
		cfg.ControlToken = tok
		return e.startConfig(cfg, sidecar.Options{})
	}
	a, b := start(tokenA), start(tokenB)
	ctx := t.Context()
	tenant := control.Client{URL: "http://" + b.ControlAddr(), Token: tokenA, HTTP: http.DefaultClient}
	refused := func(what string, err error) {
		t.Helper()
		var se *control.StatusError
		if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
			t.Errorf("%s of team-b's sidecar with team-a's token: %v; want 401", what, err)
		}
	}
	_, err := tenant.State(ctx)
	refused("state", err)
	_, err = tenant.Quiesce(ctx, time.Second)
	refused("quiesce", err)
	_, err = tenant.Stop(ctx, time.Second)
	refused("stop", err)

	// Each namespace's own token works on its own sidecar, and team-b's
	// still serves.
	st, err := control.Client{URL: "http://" + b.ControlAddr(), Token: tokenB, HTTP: http.DefaultClient}.State(ctx)
	if err != nil || st.Mode != "serving" {
		t.Errorf("team-b's sidecar with its own token: mode %q, %v; want serving", st.Mode, err)
	}
	if _, err := (control.Client{URL: "http://" + a.ControlAddr(), Token: tokenA, HTTP: http.DefaultClient}).State(ctx); err != nil {
		t.Errorf("team-a's sidecar with its own token: %v", err)
	}
}
