package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// outCheck and outDefault are checkOut and defaultOut as the verbs call them: variables, so that
// a test can swap in their broken variants, kept in outfile_test.go.
var (
	outCheck   = checkOut
	outDefault = defaultOut
)

// fileKind names what a non-regular file is, for a refusal.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

// checkOut says whether path may be written as a verb's output file: absent (its directory then
// must exist), or a regular file, which is replaced whole. A symbolic link, directory, device,
// FIFO or socket is refused, naming it, because the file is written beside path and renamed over
// it: a rename would replace the link or the device node itself (/dev/stdout, /dev/full).
func checkOut(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		dir := filepath.Dir(path)
		d, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("%s: its directory: %w", path, err)
		}
		if !d.IsDir() {
			return fmt.Errorf("%s: %s is not a directory", path, dir)
		}
		return nil
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is %s: give a regular file, or a name that does not exist yet", path, fileKind(fi.Mode()))
	}
	return nil
}

// defaultOut is the output file named after input and suffix in the working directory: never
// beside input, which may be in /dev (/dev/stdin) or a directory the operator may not write.
func defaultOut(input, suffix string) string {
	base := filepath.Base(input)
	if base == "." || base == string(filepath.Separator) || base == "-" {
		base = "members"
	}
	return base + suffix
}
