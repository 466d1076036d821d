package pgtest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/schema/current"
)

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// BreakFunction replaces function name, in the database db connects to as its owner, with a
// broken variant of its current definition (schema/current, [current.Definition]: the text a
// migrated database runs, whichever migration created or last replaced it): the definition with
// each pair of replacements applied, old by new, every occurrence. It is how a test keeps the
// broken form of a fix as a fixture, derived from the production definition, and shows that it
// catches it. It fails t when the definition or an old text is not found, so a fixture that no
// longer applies says so.
func BreakFunction(t testing.TB, db Execer, name string, replacements ...[2]string) {
	t.Helper()
	def, file, err := current.Definition(name)
	if err != nil {
		t.Fatalf("pgtest: break %s: %v", name, err)
	}
	for _, r := range replacements {
		if !strings.Contains(def, r[0]) {
			t.Fatalf("pgtest: break %s: %q is not in its definition in schema/current/%s", name, r[0], file)
		}
		def = strings.ReplaceAll(def, r[0], r[1])
	}
	if _, err := db.Exec(context.Background(), def); err != nil {
		t.Fatalf("pgtest: break %s: %v", name, err)
	}
}

// CallerClock makes the database that db connects to as its owner issue at the time each
// issuance call sends (the service's clock, [issuance.Config.Now]), as before migration 00021,
// instead of at its own clock with a 5 s skew allowed: issue_clock, broken by [BreakFunction].
// It is for the tests that issue on a fixed date (a Silver Week day, a month's last second);
// production never runs it, and TestForgedArgumentsRefused shows what it lets through.
func CallerClock(t testing.TB, db Execer) {
	t.Helper()
	BreakFunction(t, db, "issue_clock",
		[2]string{"IF a NOT BETWEEN v_now - issue_clock_skew() AND v_now + issue_clock_skew() THEN", "IF false THEN"},
		[2]string{"RETURN array_fill(v_now, ARRAY[cardinality(p_issued_at)]);", "RETURN p_issued_at;"})
}

// BlindToExpiry makes issue_coupons_batch_v2, in the database db connects to as its owner, the
// broken variant of 00015_expiry.sql: the campaign's state judged on its period and its pause
// alone, blind to its coupons' fixed expiry (coupons_expire_at), in the reads and on the stripes,
// as before that migration. It passes campaign_inactive_reason no expiry (NULL): the rule of
// 00010's 4-argument form, which 00029 dropped. Tests keep it to show they see an issuance past
// the expiry; production never runs it.
func BlindToExpiry(t testing.TB, db Execer) {
	t.Helper()
	BreakFunction(t, db, "issue_coupons_batch_v2",
		[2]string{"v_paused, v_until, p_issued_at[k]", "v_paused, NULL, p_issued_at[k]"},
		[2]string{"s.paused_at, s.coupons_expire_at, ", "s.paused_at, NULL, "},
		[2]string{"b.paused_at, b.coupons_expire_at, ", "b.paused_at, NULL, "})
}
