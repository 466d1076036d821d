package main

import (
	"time"

	"github.com/mops/coupon-api/internal/ops/refusal"
	"github.com/mops/coupon-api/shared/issuance"
)

// tokyoTime formats t in Asia/Tokyo, RFC 3339, as every verb prints times (docs/api.md).
func tokyoTime(t *time.Time) string {
	if t == nil {
		return "(none)"
	}
	return t.In(issuance.Tokyo).Format(time.RFC3339)
}

// tokyoTimes rewrites the times that SQL functions wrote into a refusal as every other time
// couponctl prints: RFC 3339 at +09:00 (refusal.TokyoTimes, which the console shares).
var tokyoTimes = refusal.TokyoTimes

// refusalTimes is [tokyoTimes] as couponctl prints its errors: a variable, so that a test can
// swap in its broken variant (newuser_test.go).
var refusalTimes = tokyoTimes
