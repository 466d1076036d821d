package main

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
)

// accepts reports whether something accepts TCP connections at addr.
func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// TestServeListensOnLoopback: couponctl serve has no authentication, so by default it binds
// 127.0.0.1 only: another address of the machine (127.0.0.2 stands for one: on Linux all of
// 127/8 reaches this host, but a socket bound to 127.0.0.1 accepts on that address alone) gets
// no answer, and the output says where it listens. --listen 0.0.0.0 serves every interface, and
// --help says so.
func TestServeListensOnLoopback(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtest.URL(t))
	t.Setenv("FUNCTION_TARGET", "IssueCoupon")
	for _, c := range []struct {
		args       []string
		everyWhere bool
		says       string
	}{
		{[]string{"serve"}, false, "on 127.0.0.1:"},
		{[]string{"serve", "--listen", "0.0.0.0"}, true, "on 0.0.0.0:"},
	} {
		port := proctest.FreePort(t)
		t.Setenv("PORT", port)
		var out syncbuf.Buffer
		cmd := rootCmd()
		cmd.SetArgs(c.args)
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		ctx, stop := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- cmd.ExecuteContext(ctx) }()
		proctest.WaitServing(t, port, &out)
		if got := accepts("127.0.0.2:" + port); got != c.everyWhere {
			t.Errorf("%q: another address of the host accepts: %t, want %t\n%s", c.args, got, c.everyWhere, out.String())
		}
		stop()
		if err := <-served; err != nil {
			t.Errorf("%q: %v", c.args, err)
		}
		if !strings.Contains(out.String(), c.says+port) {
			t.Errorf("%q: the output does not say %q:\n%s", c.args, c.says+port, out.String())
		}
	}

	help, _, err := runCLI(t, "serve", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"--listen", "127.0.0.1", "0.0.0.0", "no authentication"} {
		if !strings.Contains(help, w) {
			t.Errorf("serve --help does not say %q:\n%s", w, help)
		}
	}
}

// TestServeListenTakesAHost: --listen with a port is refused as a command line (exit 2) before
// anything starts, saying that the port is PORT's; it had been joined to PORT into an address
// that could not be listened on, after the start-up banner.
func TestServeListenTakesAHost(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:18765", "[::1]:18765", ":18765"} {
		_, stderr, err := runCLI(t, "serve", "--listen", listen)
		var usage usageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), "the port is PORT's (PORT=18765") {
			t.Errorf("serve --listen %s: %v (stderr %q), want a usage error naming PORT", listen, err, stderr)
		}
	}
}
