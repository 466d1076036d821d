package pgtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/localpg"
)

// TestSocketURLRunsOverTCP: a TEST_DATABASE_URL of the README's socket form is logged in to
// over the socket once and turned into a TCP URL of the same server for a role that may create
// roles and databases; a TCP URL is taken as it is.
func TestSocketURLRunsOverTCP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	if got, err := overTCP(ctx, srv.URL()); err != nil || got != srv.URL() {
		t.Errorf("a TCP URL: %q %v, want it as it is", got, err)
	}
	socket := fmt.Sprintf("postgres:///postgres?host=%s&port=%d&user=postgres", srv.SocketDir(), srv.Port())
	for range 2 { // a second run finds the role and sets a new password
		tcp, err := overTCP(ctx, socket)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := pgx.ParseConfig(tcp)
		if err != nil {
			t.Fatal(err)
		}
		if cc.Host != "127.0.0.1" || int(cc.Port) != srv.Port() || cc.User != socketAdmin || cc.Password == "" {
			t.Errorf("%s: want %s with a password at 127.0.0.1:%d", tcp, socketAdmin, srv.Port())
		}
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		var createDB, createRole bool
		err = conn.QueryRow(ctx, `SELECT rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&createDB, &createRole)
		conn.Close(ctx)
		if err != nil || !createDB || !createRole {
			t.Errorf("%s: CREATEDB %t, CREATEROLE %t (%v), want both", socketAdmin, createDB, createRole, err)
		}
	}
}
