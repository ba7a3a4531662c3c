package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  images build -o DIR [-tag dev] [-only sidecar,pause] [-platforms linux/amd64,linux/arm64]
  images push -registry HOST:PORT -from DIR [-insecure] [-auth FILE] [-only ...]
  images inspect -ref REF [-insecure] [-auth FILE]
  images checkpoint -archive FILE -container NAME -ref REF [-insecure] [-auth FILE] [-o FILE] [-no-push]
  images registry -addr ADDR -dir DIR [-quiet]
Run "images COMMAND -h" for a command's flags.
`

// usageError is a mistake in the command line; it exits 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// run executes one subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"build":      cmdBuild,
		"push":       cmdPush,
		"inspect":    cmdInspect,
		"checkpoint": cmdCheckpoint,
		"registry":   cmdRegistry,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "images: unknown command %q\n%s", args[0], usage)
		return 2
	}
	err := cmd(ctx, args[1:], stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "images %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(stderr, "images %s: %v\n", args[0], err)
		return 1
	}
}

// parseFlags parses args into fs and turns flag errors into usage errors.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q; every input is a flag", fs.Arg(0))
	}
	return nil
}
