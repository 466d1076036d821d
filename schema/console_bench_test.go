package schema_test

import (
	"context"
	"testing"
)

// BenchmarkConsolePauseResume is what the console's person costs a change: one pause and one
// resume per iteration, through console_pause (the role read, the change function, the history
// rows marked with the email) or through campaign_change_state alone (couponctl's), as the console's login or as the owner,
// on campaign C
// of 4 stripes, with nothing else running in the database.
func BenchmarkConsolePauseResume(b *testing.B) {
	for _, v := range []struct{ name, pause, resume string }{
		{"console", `SELECT count(*) FROM console_pause('C', true, 'op@example.com', 'b')`, `SELECT count(*) FROM console_pause('C', false, 'op@example.com', 'b')`},
		{"cli", `SELECT count(*) FROM campaign_change_state('C', 'pause', NULL, NULL, false, false, 'b')`, `SELECT count(*) FROM campaign_change_state('C', 'resume', NULL, NULL, false, false, 'b')`},
	} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			db := newConsoleDB(b)
			d := db.console
			if v.name == "cli" {
				d = db.owner // coupon_console may not call it
			}
			var n int
			for b.Loop() {
				for _, sql := range []string{v.pause, v.resume} {
					if err := d.QueryRow(ctx, sql).Scan(&n); err != nil || n != 1 {
						b.Fatalf("%s: %d rows, %v", sql, n, err)
					}
				}
			}
		})
	}
}
