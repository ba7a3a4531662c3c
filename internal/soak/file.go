package soak

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// lockName is the file in an output folder that the holder of mode's
// records keeps locked.
func lockName(mode string) string { return ".soak-" + mode + ".lock" }

// ErrBusy is the error of Open when another process holds the records.
var ErrBusy = errors.New("another soak holds the records")

// Folder is one mode's records in an output folder, held under a lock
// until Close: no other soak can append to them meanwhile (a run of
// another mode can, to its own file).
type Folder struct {
	Dir, Mode string
	lock      *os.File
}

// Open creates dir if need be and takes the lock of mode's records,
// without waiting: records that another run holds are ErrBusy, with that
// run's process ID.
func Open(dir, mode string) (*Folder, error) {
	if mode == "" || strings.ContainsAny(mode, `/\`) || strings.HasPrefix(mode, ".") {
		return nil, fmt.Errorf("mode %q: want a plain name", mode)
	}
	dir, err := filepath.Abs(dir) // the records' path goes to child processes in other folders
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName(mode)), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w of mode %s in %s (process %s): wait for it to end, or stop it (Ctrl-C) and run again to resume", ErrBusy, mode, dir, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) // for the message of a run that finds it held
	}
	return &Folder{Dir: dir, Mode: mode, lock: f}, nil
}

// Close releases the records.
func (f *Folder) Close() error { return f.lock.Close() }

// Path is the file of the records.
func (f *Folder) Path() string { return filepath.Join(f.Dir, f.Mode+".jsonl") }

// Records reads the records. A last line cut short (a run killed in
// the middle of a write) is cut off the file, so that the next record
// starts on a line of its own; dropped says how many bytes went. Any other
// bad line is an error that names it.
func (f *Folder) Records() (recs []Record, dropped int, err error) {
	path := f.Path()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	if keep := bytes.LastIndexByte(b, '\n') + 1; keep < len(b) {
		dropped = len(b) - keep
		if err := os.Truncate(path, int64(keep)); err != nil {
			return nil, 0, fmt.Errorf("cut the unfinished last line off %s: %w", path, err)
		}
		b = b[:keep]
	}
	recs, err = ParseRecords(bytes.NewReader(b), path)
	return recs, dropped, err
}

// ParseRecords reads a soak file's lines; name is for the errors. Blank
// lines are skipped.
func ParseRecords(r io.Reader, name string) ([]Record, error) {
	var recs []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		rec, err := ParseRecord(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return recs, nil
}

// ReadDir reads the records of every *.jsonl file in dir, file by file in
// name order; it takes no lock (a summary while a run appends sees the
// records written so far; a line being written is left out).
func ReadDir(dir string) ([]Record, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.jsonl records in %s", dir)
	}
	slices.Sort(files)
	var all []Record
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		b = b[:bytes.LastIndexByte(b, '\n')+1]
		recs, err := ParseRecords(bytes.NewReader(b), path)
		if err != nil {
			return nil, err
		}
		all = append(all, recs...)
	}
	return all, nil
}

// Append appends r to the file at path as one line, in one write (what a
// run's child process does while the run holds the folder).
func Append(path string, r Record) error {
	line, err := r.Marshal()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(line)
	return errors.Join(err, f.Close())
}
