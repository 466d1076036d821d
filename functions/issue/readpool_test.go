package issue

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/mops/coupon-api/shared/issuance"
)

// TestDryRunReadLagHeader: a dry run that the read pool answers carries the pool's lag in
// X-Read-Pool-Lag-Ms (here a read pool on the primary itself, which is in no recovery: lag
// "0.000"), and its body is the one without a read pool; an issuance, and a dry run of a handler
// without a read pool, carry no such header. (The read pool on a streaming standby, its lag and
// the fallback to the primary: shared/issuance, TestDryRunsOnTheReadPool.)
func TestDryRunReadLagHeader(t *testing.T) {
	h, pool := newTestHandler(t, issuance.Config{})
	dry, _ := json.Marshal(map[string]any{"member_id": "m1", "campaign_id": "OPEN", "dry_run": true})
	plain := post(t, h, http.MethodPost, "application/json", string(dry))
	h.svc.UseReadPool(pool)
	read := post(t, h, http.MethodPost, "application/json", string(dry))
	issued := post(t, h, http.MethodPost, "application/json", ask("m1", "OPEN"))
	if got := plain.header.Get(HeaderReadLag); got != "" {
		t.Errorf("dry run without a read pool: %s %q, want none", HeaderReadLag, got)
	}
	if got := read.header.Get(HeaderReadLag); got != "0.000" {
		t.Errorf("dry run on the read pool: %s %q, want \"0.000\"", HeaderReadLag, got)
	}
	if a, b := mustJSON(t, plain.body), mustJSON(t, read.body); plain.status != read.status || a != b {
		t.Errorf("dry run: %d %s without a read pool, %d %s with one; want the same", plain.status, a, read.status, b)
	}
	if issued.body["result"] != "ISSUED" || issued.header.Get(HeaderReadLag) != "" {
		t.Errorf("issuance: %v, %s %q; want ISSUED without the header", issued.body, HeaderReadLag, issued.header.Get(HeaderReadLag))
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
