package soak

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// A Mode is a kind of soak: how migrations are made and checked.
type Mode interface {
	// Name names the mode and its file in the output folder.
	Name() string
	// Chunk runs the migrations numbered c.First to c.First+c.N-1 and
	// appends one record each, in order, to c.Records (Append). When ctx
	// ends it stops after the migration under way, if it can, and
	// returns. An error says the chunk itself went wrong (its cluster did
	// not come up, say); the records it appended count all the same.
	Chunk(ctx context.Context, c Chunk) error
}

// Chunk is one piece of a run, given to a Mode.
type Chunk struct {
	ID       string // names the chunk in its records
	First, N int
	Seed     int64  // the run's seed, for modes that draw
	Records  string // the file to append to
}

// Options configure Run.
type Options struct {
	Count     int   // migrations the mode's file is to hold
	ChunkSize int   // migrations per chunk
	Seed      int64 // passed to every chunk
	// Tries is how many chunks in a row may end without a new record
	// before Run gives up.
	Tries int
	Logf  func(format string, args ...any)
	Now   func() time.Time
}

// Run appends mode's records to the folder, chunk by chunk, until its file
// holds o.Count of them. It starts from what the file holds already, so a
// run that was stopped goes on where it stopped. It returns ctx's error
// when ctx ends first, with what was recorded kept.
func Run(ctx context.Context, f *Folder, m Mode, o Options) error {
	if m.Name() != f.Mode {
		return fmt.Errorf("mode %s cannot append to the records of %s", m.Name(), f.Mode)
	}
	if o.Count < 1 || o.ChunkSize < 1 {
		return fmt.Errorf("count %d, chunk size %d: want 1 or more", o.Count, o.ChunkSize)
	}
	if o.Tries < 1 {
		o.Tries = 1
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	fruitless := 0
	for {
		done, err := f.count(o.Logf)
		if err != nil {
			return err
		}
		if done >= o.Count {
			o.Logf("%s: %d of %d migrations recorded in %s", m.Name(), done, o.Count, f.Path())
			return nil
		}
		if err := ctx.Err(); err != nil {
			o.Logf("%s: stopped at %d of %d migrations; run again to go on", m.Name(), done, o.Count)
			return err
		}
		c := Chunk{ID: o.Now().UTC().Format("20060102T150405"), First: done + 1, N: min(o.ChunkSize, o.Count-done),
			Seed: o.Seed, Records: f.Path()}
		o.Logf("%s: chunk %s: migrations %d to %d of %d", m.Name(), c.ID, c.First, c.First+c.N-1, o.Count)
		cerr := m.Chunk(ctx, c)
		after, err := f.count(o.Logf)
		if err != nil {
			return errors.Join(cerr, err)
		}
		if cerr != nil {
			o.Logf("%s: chunk %s: %v", m.Name(), c.ID, cerr)
		}
		if after > done {
			fruitless = 0
			continue
		}
		if ctx.Err() != nil {
			continue // says it stopped, above
		}
		fruitless++
		if fruitless >= o.Tries {
			return fmt.Errorf("%s: %d chunks in a row recorded nothing (the last: %w)", m.Name(), fruitless, cerr)
		}
	}
}

// count checks the records (numbered 1, 2, ... in order, of the mode)
// and returns how many there are.
func (f *Folder) count(logf func(string, ...any)) (int, error) {
	mode := f.Mode
	recs, dropped, err := f.Records()
	if err != nil {
		return 0, err
	}
	if dropped > 0 {
		logf("%s: cut an unfinished last line (%d bytes) off %s", mode, dropped, f.Path())
	}
	for i, r := range recs {
		if r.Mode != mode || r.Index != i+1 {
			return 0, fmt.Errorf("%s: line %d is record %d of mode %q, want record %d of %q: the file was written by something else", f.Path(), i+1, r.Index, r.Mode, i+1, mode)
		}
	}
	return len(recs), nil
}
