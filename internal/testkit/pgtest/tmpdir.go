package pgtest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// tmpPrefix names the temporary directory [Main] gives each test binary; the binary's pid follows
// it, so that a later binary can tell a directory whose binary died (see [removeOrphans]). It is
// short: a throwaway server's Unix socket is made in a directory inside it, and a socket path
// may have at most 107 bytes (localpg refuses a longer one).
const tmpPrefix = "pgt-"

// ownTMPDIR makes a new directory and points TMPDIR at it for the rest of the test binary (its
// children inherit it: the servers it starts, couponctl and the functions it runs), so that
// [leftIn] sees exactly what this binary's tests left, whatever runs beside it. The directory is
// open to all: as root, the throwaway server runs as the unprivileged postgres user and must
// reach its own directory inside. It returns the directory and a function that gives TMPDIR
// back. Directories of binaries that died without cleaning up are removed first.
func ownTMPDIR() (string, func(), error) {
	parent := os.TempDir()
	removeOrphans(parent)
	dir, err := os.MkdirTemp(parent, tmpPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", nil, err
	}
	if err := os.Chmod(dir, 0o777|fs.ModeSticky); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	old, had := os.LookupEnv("TMPDIR")
	if err := os.Setenv("TMPDIR", dir); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	return dir, func() {
		if had {
			_ = os.Setenv("TMPDIR", old)
		} else {
			_ = os.Unsetenv("TMPDIR")
		}
	}, nil
}

// leftIn lists what dir holds, one entry a line with its size in bytes (a directory's, all its
// files'), or "" when it is empty.
func leftIn(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, e := range entries {
		var size int64
		_ = filepath.WalkDir(filepath.Join(dir, e.Name()), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if info, err := d.Info(); err == nil {
					size += info.Size()
				}
			}
			return nil
		})
		fmt.Fprintf(&b, "  %s (%d bytes)\n", e.Name(), size)
	}
	return b.String(), nil
}

// removeOrphans removes the directories of [ownTMPDIR] in parent whose test binary is no longer
// running: one killed (by go test's -timeout, or SIGKILL) never removed its own.
func removeOrphans(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, tmpPrefix+"*"))
	for _, d := range dirs {
		pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), tmpPrefix), "-")
		if n, err := strconv.Atoi(pid); err == nil && n != os.Getpid() && syscall.Kill(n, 0) == syscall.ESRCH {
			_ = os.RemoveAll(d)
		}
	}
}
