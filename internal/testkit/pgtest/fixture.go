package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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

// SetClock makes the database that db connects to as its owner read at, standing still, where
// it reads its clock: issue_now() (schema/current/issue_now.sql), replaced with a constant. It is
// for the tests that issue on a fixed date (a Silver Week day, a month's last second); call it
// again to move the clock. Every instant the database's functions judge by comes from
// issue_now(), so the issuance, the dry run, the state, the changes and the relay's expiry see
// the moved clock; the relay's due times, sent from its own clock, are refused past it
// (outbox_claim_args_check), and column defaults (notification_outbox.next_attempt_at) keep
// the real clock.
func SetClock(t testing.TB, db Execer, at time.Time) {
	t.Helper()
	BreakFunction(t, db, "issue_now", [2]string{"RETURN clock_timestamp()",
		"RETURN " + quoteLiteral(at.UTC().Format(time.RFC3339Nano)) + "::timestamp with time zone"})
}

// AtClock runs fn with the database that db connects to as its owner reading at, standing
// still (SetClock), then gives it back its real clock (issue_now() as schema/current defines
// it). It is how a fixture makes a campaign whose releases have passed: campaign_create refuses
// a release at or before the clock (00034), as an operator is refused.
func AtClock(t testing.TB, db Execer, at time.Time, fn func()) {
	t.Helper()
	SetClock(t, db, at)
	fn()
	BreakFunction(t, db, "issue_now")
}

// ShiftClock makes the database that db connects to as its owner read its clock moved by d,
// still running: issue_now() replaced with clock_timestamp() plus d.
func ShiftClock(t testing.TB, db Execer, d time.Duration) {
	t.Helper()
	BreakFunction(t, db, "issue_now", [2]string{"RETURN clock_timestamp()",
		"RETURN clock_timestamp() + " + quoteLiteral(fmt.Sprintf("%d microseconds", d.Microseconds())) + "::interval"})
}

// BlindToExpiry makes the issuance, in the database db connects to as its owner, the broken
// variant of 00015_expiry.sql: the campaign's state judged on its period and its pause alone,
// blind to its coupons' fixed expiry (coupons_expire_at), in the judge (campaign_judge) and on
// the stripes (issue_coupons_batch_v3), as before that migration. It passes
// campaign_inactive_reason no expiry (NULL): the rule of 00010's 4-argument form, which 00029
// dropped. Tests keep it to show they see an issuance past the expiry; production never runs it.
func BlindToExpiry(t testing.TB, db Execer) {
	t.Helper()
	BreakFunction(t, db, "campaign_judge",
		[2]string{"f.paused_at, f.coupons_expire_at, campaign_judge.p_at)", "f.paused_at, NULL, campaign_judge.p_at)"})
	BreakFunction(t, db, "issue_coupons_batch_v3", [2]string{"s.paused_at, s.coupons_expire_at, greatest(", "s.paused_at, NULL, greatest("})
}

// Verdict judges a check that ran against the production code (broken false) or against a broken
// variant kept as a fixture (broken true), by the problems it found: each fails t on the
// production code; on the variant, none fails t (the check would not see what it guards), and
// they are logged.
func Verdict(t testing.TB, broken bool, problems []string) {
	t.Helper()
	switch {
	case !broken:
		for _, p := range problems {
			t.Error(p)
		}
	case len(problems) == 0:
		t.Error("the broken variant passed: the check would not see it")
	default:
		t.Logf("the broken variant, seen: %s", strings.Join(problems, "; "))
	}
}
