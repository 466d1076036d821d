package localpg

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/procfs"
)

// userHZ is the unit of the CPU times in /proc/PID/stat: USER_HZ, 100 on Linux whatever the
// kernel's own tick (procfs's userHZ, proc(5)).
const userHZ = 100

// CPUTime is the CPU the server has used since it started, user and system: the utime+stime of
// the postmaster and of every live process under it (backends, WAL writer, WAL senders, ...),
// plus their cutime+cstime, which hold the times of the children they reaped (a backend that
// exited). The difference of two readings is what the server spent between them. Linux only.
func (s *Server) CPUTime() (time.Duration, error) {
	if s.cmd == nil {
		return 0, errors.New("localpg: server is not running")
	}
	fs, err := procfs.NewFS(procfs.DefaultMountPoint)
	if err != nil {
		return 0, fmt.Errorf("localpg: %w", err)
	}
	return treeCPU(fs, s.cmd.Process.Pid)
}

// treeCPU is the utime+stime+cutime+cstime of process root and all its live descendants in fs.
// A process that ends during the listing is skipped: its parent counts it once it is reaped.
func treeCPU(fs procfs.FS, root int) (time.Duration, error) {
	procs, err := fs.AllProcs()
	if err != nil {
		return 0, fmt.Errorf("localpg: list processes: %w", err)
	}
	stats := make(map[int]procfs.ProcStat, len(procs))
	children := make(map[int][]int)
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil {
			continue
		}
		stats[p.PID] = st
		children[st.PPID] = append(children[st.PPID], p.PID)
	}
	if _, ok := stats[root]; !ok {
		return 0, fmt.Errorf("localpg: process %d not found", root)
	}
	var ticks int64
	for todo := []int{root}; len(todo) > 0; {
		pid := todo[len(todo)-1]
		todo = append(todo[:len(todo)-1], children[pid]...)
		st := stats[pid]
		ticks += int64(st.UTime) + int64(st.STime) + int64(st.CUTime) + int64(st.CSTime)
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// ProcessTreeCPU is [Server.CPUTime] for any local process: the CPU that process pid and all
// its live descendants have used, user and system, their reaped children's included. A
// benchmark reads a serving process's CPU with it, and PostgreSQL's through [PostmasterOf].
// Errors: /proc unreadable, or no process pid. Linux only.
func ProcessTreeCPU(pid int) (time.Duration, error) {
	fs, err := procfs.NewFS(procfs.DefaultMountPoint)
	if err != nil {
		return 0, fmt.Errorf("localpg: %w", err)
	}
	return treeCPU(fs, pid)
}

// PostmasterOf is the postmaster of a local server, from one of its backends' pid
// (pg_backend_pid()): the backend's parent. Errors: no process backendPID on this machine.
func PostmasterOf(backendPID int) (int, error) {
	p, err := procfs.NewProc(backendPID)
	if err != nil {
		return 0, fmt.Errorf("localpg: backend %d: %w", backendPID, err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("localpg: backend %d: %w", backendPID, err)
	}
	return st.PPID, nil
}
