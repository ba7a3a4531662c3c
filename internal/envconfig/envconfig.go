// Package envconfig reads a binary's configuration struct from environment
// variables (with github.com/caarlos0/env) and makes every error name the
// variable at fault, not the Go field behind it.
package envconfig

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"

	"github.com/caarlos0/env/v11"
)

// Parse reads a T from the environment. Errors name the variables.
func Parse[T any]() (T, error) {
	cfg, err := env.ParseAs[T]()
	if err != nil {
		return cfg, nameVariables[T](err)
	}
	return cfg, nil
}

// nameVariables rewrites the env package's parse errors, which name the Go
// field, to name the environment variable and its value instead.
func nameVariables[T any](err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	out := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			if f, ok := reflect.TypeFor[T]().FieldByName(pe.Name); ok {
				name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
				e = fmt.Errorf("%s=%q: %w", name, os.Getenv(name), pe.Err)
			}
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// Level parses a log level held in the variable name.
func Level(name, value string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(value)); err != nil {
		return 0, fmt.Errorf("%s=%q: want debug, info, warn or error", name, value)
	}
	return l, nil
}
