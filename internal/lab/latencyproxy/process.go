package latencyproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Process is a latency proxy in a child process of its own: a program that runs [Serve] on its
// standard streams (couponctl's hidden `latency-proxy` verb). Measured through a proxy inside the
// measured process, the round trips come out several milliseconds late whenever that process
// keeps both cores busy (its server and its load generator starve the proxy's goroutines), which
// a network link never does; in a process of its own the kernel schedules it beside the others.
// Its methods are safe for concurrent use.
type Process struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	addr string
	mu   sync.Mutex // one command at a time
}

// StartProcess runs exe with args, which must run [Serve], and returns once it listens. Errors:
// the program's, or its first line not being an address.
func StartProcess(exe string, args ...string) (*Process, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("latencyproxy: start %s: %w", exe, err)
	}
	p := &Process{cmd: cmd, in: in, out: bufio.NewReader(out)}
	line, err := p.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening ") {
		p.Close()
		return nil, fmt.Errorf("latencyproxy: %s did not start a proxy: %q %v", exe, line, err)
	}
	p.addr = strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	return p, nil
}

// Addr is the proxy's listen address, 127.0.0.1:port.
func (p *Process) Addr() string { return p.addr }

// SetRTT makes the added round trip d, as [Proxy.SetRTT] does, and returns once the child has.
func (p *Process) SetRTT(d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := fmt.Fprintln(p.in, d); err != nil {
		return fmt.Errorf("latencyproxy: tell the proxy process: %w", err)
	}
	line, err := p.out.ReadString('\n')
	switch {
	case err != nil:
		return fmt.Errorf("latencyproxy: the proxy process: %w", err)
	case strings.TrimSpace(line) != "ok":
		return errors.New("latencyproxy: " + strings.TrimSpace(line))
	}
	return nil
}

// Close ends the child (its standard input closes, so [Serve] returns) and waits for it.
func (p *Process) Close() {
	_ = p.in.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// Serve runs a proxy to target, writes "listening ADDR" to out, then reads one round trip per
// line from in (a Go duration: "0", "500us", "1ms") and answers each with "ok" once set, or with
// the error; it returns when in ends, closing the proxy.
func Serve(target string, in io.Reader, out io.Writer) error {
	p, err := Start(target, 0)
	if err != nil {
		return err
	}
	defer p.Close()
	if _, err := fmt.Fprintln(out, "listening", p.Addr()); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		d, err := time.ParseDuration(strings.TrimSpace(sc.Text()))
		if err == nil {
			err = p.SetRTT(d)
		}
		reply := "ok"
		if err != nil {
			reply = "error: " + err.Error()
		}
		if _, err := fmt.Fprintln(out, reply); err != nil {
			return err
		}
	}
	return sc.Err()
}
