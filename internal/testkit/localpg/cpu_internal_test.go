package localpg

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// TestTreeCPU: on a fake /proc of a known tree (a postmaster, two backends, one of them with a
// child of its own, a process elsewhere, and a postmaster's child that vanished between the
// listing and the read), the server's CPU is the tree's utime+stime+cutime+cstime, nothing of
// the process outside it.
func TestTreeCPU(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []struct {
		pid, ppid                    int
		utime, stime, cutime, cstime int
	}{
		{100, 1, 10, 20, 300, 400}, // postmaster: 300+400 are backends it reaped
		{101, 100, 1, 2, 0, 0},     // backend
		{102, 100, 3, 4, 5, 6},     // backend with a reaped child
		{103, 102, 7, 8, 0, 0},     // its live child
		{200, 1, 1000, 1000, 1000, 1000},
	} {
		writeStat(t, dir, p.pid, fmt.Sprintf("%d (postgres: x (y)) S %d 0 0 0 -1 0 0 0 0 0 %d %d %d %d",
			p.pid, p.ppid, p.utime, p.stime, p.cutime, p.cstime))
	}
	if err := os.Mkdir(filepath.Join(dir, "104"), 0o755); err != nil { // ended: no stat
		t.Fatal(err)
	}
	fs, err := procfs.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := treeCPU(fs, 100)
	if err != nil {
		t.Fatal(err)
	}
	const ticks = 10 + 20 + 300 + 400 + 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8
	if want := ticks * time.Second / userHZ; got != want {
		t.Errorf("treeCPU = %s, want %s (%d ticks)", got, want, ticks)
	}
	if _, err := treeCPU(fs, 999); err == nil {
		t.Error("treeCPU of a process not in /proc: no error")
	}
}

// writeStat writes /proc/PID/stat under dir: line, then the fields procfs reads after cstime.
func writeStat(t *testing.T, dir string, pid int, line string) {
	t.Helper()
	d := filepath.Join(dir, fmt.Sprint(pid))
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	rest := " 20 0 1 0 1000 100 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
	if err := os.WriteFile(filepath.Join(d, "stat"), []byte(line+rest), 0o644); err != nil {
		t.Fatal(err)
	}
}
