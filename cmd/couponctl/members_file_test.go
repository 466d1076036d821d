package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// TestGrantMemberFileWords: a member file saved with a UTF-8 BOM (Excel's "CSV UTF-8") is read,
// with a note that the BOM was skipped (before: refused as "byte 0 is 0xEF"), and member ids
// starting with "#", which IssueCoupon accepts, are granted: only "# " and "#\t" start a comment
// (before: every line starting with "#" was skipped silently). Judged by the coupons counted
// with SQL. Shown red on the two broken variants, readIDs blind to the BOM and every "#" line a
// comment.
func TestGrantMemberFileWords(t *testing.T) {
	checkAndBreak(t, grantMemberFileCheck,
		brokenVariant{"the BOM read as part of the first line", func(t *testing.T) {
			swap(t, &idTrimBOM, func(line string) (string, bool) { return line, false })
		}},
		brokenVariant{`every line starting with "#" a comment`, func(t *testing.T) {
			swap(t, &idComment, func(line string) bool { return strings.HasPrefix(line, "#") })
		}})
}

func grantMemberFileCheck(t *testing.T, v *verdict) {
	d := newGrantDB(t, campaign.Campaign{ID: "WORDS", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	members := filepath.Join(t.TempDir(), "members.txt")
	if err := os.WriteFile(members, []byte("\ufeff# the outage of 2026-12-01\nm1\n#vip\n\n#\n#\tleft by support\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := grantCLI("grant", "--campaign", "WORDS", "--members", members, "--out", filepath.Join(t.TempDir(), "a.csv"))
	if code != 0 || !strings.Contains(stderr, members+": skipped the UTF-8 byte order mark (BOM) before line 1") {
		v.Errorf("grant: exit %d, want 0 noting the BOM\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'WORDS' AND member_id IN ('m1', '#vip', '#')`); n != 3 {
		v.Errorf("%d of m1, #vip and # hold a coupon, want 3", n)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons`); n > 3 {
		v.Errorf("%d coupons, want 3: a comment was granted as a member", n)
	}
}
