package shadowqueue

import (
	"context"
	"fmt"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// StreamExists reports whether the stream name exists. A target sidecar
// checks it before it opens the log, so that a wrong log name is an error
// rather than a new, empty log.
// Of o, it uses the URI, TLS and Name.
func StreamExists(ctx context.Context, o StreamOptions) (bool, error) {
	uri, name := o.URI, o.Name
	resolver, err := streamResolver(uri)
	if err != nil {
		return false, fmt.Errorf("look up stream %q: %w", name, err)
	}
	var exists bool
	env, err := newEnvironment(ctx, uri, resolver, o.TLS, func(env *stream.Environment) error {
		var err error
		exists, err = env.StreamExists(name)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("look up stream %q: %w", name, err)
	}
	env.Close()
	return exists, nil
}
