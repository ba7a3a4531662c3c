package main

import (
	"context"
	"errors"
	"flag"
	"io"

	"github.com/ms2m/ms2m/internal/soak"
)

// simOptions are the sim mode's flags.
type simOptions struct {
	chunk int
}

func (o *simOptions) register(fs *flag.FlagSet) {
	fs.IntVar(&o.chunk, "chunk", 50, "sim: migrations per chunk (one simulated cluster serves the whole run)")
}

type sim struct{}

func newSim(o simOptions, logs string, stderr io.Writer) (*sim, error) {
	return nil, errors.New("-mode sim: not yet")
}

func (s *sim) Name() string                                  { return "sim" }
func (s *sim) Chunk(ctx context.Context, c soak.Chunk) error { return errors.New("not yet") }
func (s *sim) Close() error                                  { return nil }
