package issuance_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/mops/coupon-api/shared/issuance"
)

// TestCouponIDsAreTimeOrderedV7 issues coupons one after another and checks that each id is a
// UUIDv7 and that the ids sort, as the primary key orders them, in the order they were issued:
// a new coupon lands at the right edge of issued_coupons' and notification_outbox's keys.
func TestCouponIDsAreTimeOrderedV7(t *testing.T) {
	t.Parallel()
	b := setup(t, 2, 0, issuance.Config{})
	var issued []string
	for m := range 20 {
		out := issue(t, b.svc, fmt.Sprintf("m%04d", m+1), "SW-A")
		if out.Result != issuance.ResultIssued {
			t.Fatalf("member %d: %s, want ISSUED", m+1, out.Result)
		}
		id, err := uuid.Parse(out.CouponID)
		if err != nil || id.Version() != 7 {
			t.Fatalf("coupon id %q: version %d (%v), want a UUIDv7", out.CouponID, id.Version(), err)
		}
		issued = append(issued, out.CouponID)
	}
	rows, err := b.pool.Query(context.Background(), `SELECT coupon_id::text FROM issued_coupons ORDER BY coupon_id`)
	if err != nil {
		t.Fatal(err)
	}
	var byKey []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		byKey = append(byKey, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(byKey, issued) {
		t.Fatalf("coupon ids in key order %v, want the issuing order %v", byKey, issued)
	}
}

// TestPreviousReleasesV4IDsStillServe: a coupon the previous release issued with a UUIDv4 id is
// the member's coupon for this release too (nothing in the database assumes a v7 id).
func TestPreviousReleasesV4IDsStillServe(t *testing.T) {
	t.Parallel()
	b := setup(t, 2, 0, issuance.Config{})
	ctx := context.Background()
	v4 := uuid.New().String()
	var result string
	if err := b.pool.QueryRow(ctx, `SELECT result FROM issue_coupons_batch_v3('SW-A', ARRAY[$1::uuid], ARRAY['m0001'], ARRAY[NULL::text])`,
		v4).Scan(&result); err != nil || result != string(issuance.ResultIssued) {
		t.Fatalf("the previous release's call with a v4 id: %q, %v; want ISSUED", result, err)
	}
	out := issue(t, b.svc, "m0001", "SW-A")
	if out.Result != issuance.ResultAlreadyIssued || out.CouponID != v4 {
		t.Fatalf("this release after a v4 coupon: %s %s, want ALREADY_ISSUED %s", out.Result, out.CouponID, v4)
	}
	if out := issue(t, b.svc, "m0001", "SW-B"); out.Result != issuance.ResultIssued {
		t.Fatalf("the member's next campaign: %s, want ISSUED", out.Result)
	}
}
