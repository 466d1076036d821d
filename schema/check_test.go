package schema_test

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func openPool(t testing.TB, databaseURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestCheck: the start-up check passes on a migrated database and says what is wrong, and how
// to fix it, on a closed port, a missing database, an unmigrated one and one migrated by an
// older binary.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	migrated := pgtest.URL(t)
	if err := schema.Check(ctx, openPool(t, migrated)); err != nil {
		t.Fatalf("migrated database: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := l.Addr().String()
	l.Close()
	u, _ := url.Parse(migrated)
	u.Host = closedPort
	closed := u.String()
	u, _ = url.Parse(migrated)
	u.Path = "/no_such_database"
	missing := u.String()

	older, unmigrated := pgtest.URL(t), pgtest.URL(t)
	newest, err := schema.Newest()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openPool(t, older).Exec(ctx, `DELETE FROM goose_db_version WHERE version_id = $1`, newest); err != nil {
		t.Fatal(err)
	}
	if _, err := openPool(t, unmigrated).Exec(ctx, `DROP TABLE goose_db_version`); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, url string
		want      []string
	}{
		{"closed port", closed, []string{"unreachable"}},
		{"missing database", missing, []string{"no_such_database", "does not exist"}},
		{"unmigrated", unmigrated, []string{"no coupon-api schema", "couponctl migrate"}},
		{"older schema", older, []string{"this binary needs", "couponctl migrate"}},
	} {
		err := schema.Check(ctx, openPool(t, tc.url))
		if err == nil {
			t.Errorf("%s: passed, want refused", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}
}
