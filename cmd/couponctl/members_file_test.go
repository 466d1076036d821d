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

// TestMemberFilesRefuseSpreadsheetRows: a member list saved from a spreadsheet, a heading line
// (member_id,rank, or member_id alone) and rows such as c006,gold, is refused by grant and by
// campaign audience add before anything is sent: exit 2, naming the file and the line, no
// coupon, no audience row (before: every line was granted as a member id, the budget spent on
// members who do not exist, exit 0). --csv-column reads the column of such a file, a quoted
// id holding a comma too. Judged by counting the tables with SQL. Shown red on the broken
// variant, readIDs without the row and heading check.
func TestMemberFilesRefuseSpreadsheetRows(t *testing.T) {
	checkAndBreak(t, spreadsheetRowsCheck, brokenVariant{"every line of a file read as an id",
		func(t *testing.T) {
			swap(t, &idRow, func(string) error { return nil })
			swap(t, &idHeading, func([]string) bool { return false })
		}})
}

func spreadsheetRowsCheck(t *testing.T, v *verdict) {
	d := newGrantDB(t, campaign.Campaign{ID: "OPEN", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	if code, stdout, stderr := grantCLI("campaign", "create", "--id", "GOLD", "--discount-yen", "500", "--coupons", "10", "--audience-only"); code != 0 {
		t.Fatalf("create: exit %d\n%s%s", code, stdout, stderr)
	}
	dir := t.TempDir()
	file := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct{ path, want string }{
		{file("rows.csv", "member_id,rank\nc006,gold\n"), `:1: "member_id,rank" holds ","`},
		{file("heading.txt", "\ufeffMember_ID\nm1\n"), `:1: "Member_ID" is a column heading`},
		{file("tsv.txt", "# from the CRM\nm1\nc006\tgold\n"), `:3: "c006\tgold" holds "\t"`},
		{file("semi.txt", "m1;m2\n"), `:1: "m1;m2" holds ";"`},
		{file("pipe.txt", "c005\nc006|gold\n"), `:2: "c006|gold" holds "|"`},
		{file("marker.txt", "'0012\n"), `:1: "'0012" starts with a spreadsheet's text marker`},
		{file("mail.txt", "# export\nmail_address\nc050\nc051\n"), `:2: "mail_address" has no digit, unlike the ids below it`},
		{file("email.txt", "email\nc050\n"), `:1: "email" is a column heading`},
		{file("kaiin.txt", "kaiin_id\nc050\n"), `:1: "kaiin_id" has no digit, unlike the ids below it`},
		{file("joined.txt", "c050\nmember_id\nc051\n"), `:2: "member_id" is a column heading`},
	} {
		for _, args := range [][]string{
			{"grant", "--campaign", "OPEN", "--members", c.path, "--out", filepath.Join(dir, "out.csv")},
			{"campaign", "audience", "add", "GOLD", "--members", c.path, "--reason", "tier"},
		} {
			code, stdout, stderr := grantCLI(args...)
			if code != 2 || !strings.Contains(stderr, c.path+c.want) || !strings.Contains(stderr, "--csv-column NAME") {
				v.Errorf("%s %s: exit %d, want 2 naming %q and --csv-column\n%s%s", args[0], filepath.Base(c.path), code, c.want, stdout, stderr)
			}
		}
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons`) + d.count(t, `SELECT count(*) FROM campaign_audience`); n != 0 {
		v.Errorf("%d coupons and audience rows after the refused files, want 0", n)
	}
	csvFile := file("crm.csv", "\ufeffrank, member_id\ngold,c006\nsilver,\"m,7\"\n")
	code, stdout, stderr := grantCLI("grant", "--campaign", "OPEN", "--members", csvFile, "--csv-column", "member_id", "--out", filepath.Join(dir, "g.csv"))
	if code != 0 {
		v.Errorf("grant --csv-column member_id: exit %d, want 0\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE member_id IN ('c006', 'm,7')`); n != 2 {
		v.Errorf("--csv-column member_id: %d of c006 and \"m,7\" granted, want 2", n)
	}
	for _, c := range []struct{ text, column, want string }{
		{"\ufeffrank, member_id\ngold,c006\n", "id", `:1: no column "id"; its headings are ["rank" " member_id"]`},
		{"member_id,rank,member_id\nc012,gold,c013\n", "member_id", `:1: two columns are headed "member_id"`},
		{"member_id,rank\nc014,gold\nmember_id,rank\nc015,gold\n", "member_id", `:3: the headings again (files joined?)`},
	} {
		path := file("bad.csv", c.text)
		code, _, stderr := grantCLI("grant", "--campaign", "OPEN", "--members", path, "--csv-column", c.column, "--out", filepath.Join(dir, "h.csv"))
		if code != 2 || !strings.Contains(stderr, path+c.want) {
			v.Errorf("--csv-column %s of %q: exit %d, want 2 saying %q\n%s", c.column, c.text, code, c.want, stderr)
		}
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE member_id IN ('c012', 'c013', 'c014', 'c015', 'member_id')`); n != 0 {
		v.Errorf("%d coupons issued from the refused CSV files, want 0", n)
	}
}
