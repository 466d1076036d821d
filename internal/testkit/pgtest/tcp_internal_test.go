package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/testkit/localpg"
)

// TestSocketURLRunsOverTCP: a TEST_DATABASE_URL of the README's socket form is logged in to
// over the socket once and turned into a TCP URL of the same server for a superuser of its own;
// a TCP URL is taken as it is.
func TestSocketURLRunsOverTCP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	if got, _, err := overTCP(ctx, srv.URL()); err != nil || got != srv.URL() {
		t.Errorf("a TCP URL: %q %v, want it as it is", got, err)
	}
	socket := fmt.Sprintf("postgres:///postgres?host=%s&port=%d&user=postgres", srv.SocketDir(), srv.Port())
	var admins []string
	for range 2 { // two test binaries side by side: a role each
		tcp, done, err := overTCP(ctx, socket)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := pgx.ParseConfig(tcp)
		if err != nil {
			t.Fatal(err)
		}
		if cc.Host != "127.0.0.1" || int(cc.Port) != srv.Port() || !strings.HasPrefix(cc.User, socketAdmin) || cc.Password == "" {
			t.Errorf("%s: want a %s... role with a password at 127.0.0.1:%d", tcp, socketAdmin, srv.Port())
		}
		admins = append(admins, cc.User)
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		var super bool
		err = conn.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super)
		conn.Close(ctx)
		if err != nil || !super {
			t.Errorf("%s: superuser %t (%v), want a superuser", cc.User, super, err)
		}
		defer done()
	}
	if admins[0] == admins[1] {
		t.Errorf("two runs share the role %s", admins[0])
	}
}

// TestSocketAdminIsDropped: what overTCP made for a run is gone once its run is done.
func TestSocketAdminIsDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	tcp, done, err := overTCP(ctx, fmt.Sprintf("postgres:///postgres?host=%s&port=%d&user=postgres", srv.SocketDir(), srv.Port()))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := pgx.ParseConfig(tcp)
	if err != nil {
		t.Fatal(err)
	}
	done()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, cc.User).Scan(&left); err != nil || left != 0 {
		t.Errorf("role %s left after its run: %d (%v)", cc.User, left, err)
	}
}
