// Package refusal writes the database's refusals as the operator tools show them: couponctl's
// error lines and the console's messages.
package refusal

import (
	"regexp"
	"strings"
	"time"

	"github.com/mops/coupon-api/shared/issuance"
)

// pgTimestamp matches a timestamptz as PostgreSQL writes it in text (DateStyle ISO), in the
// session's TimeZone: 2026-12-05 13:24:30.123456+00, +05:30 or +05:30:15 for odd offsets.
var pgTimestamp = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?[+-]\d{2}(?::\d{2}){0,2}\b`)

// TokyoTimes rewrites the times that SQL functions wrote into msg (a refusal raised with
// format('%s', timestamptz)) as every other time the tools print: RFC 3339 at +09:00, the
// fraction of a second kept when there is one.
func TokyoTimes(msg string) string {
	return pgTimestamp.ReplaceAllStringFunc(msg, func(s string) string {
		layout := "2006-01-02 15:04:05-07"
		switch strings.Count(s[len("2006-01-02 15:04:05"):], ":") {
		case 1:
			layout += ":00"
		case 2:
			layout += ":00:00"
		}
		t, err := time.Parse(layout, s)
		if err != nil {
			return s
		}
		return t.In(issuance.Tokyo).Format(time.RFC3339Nano)
	})
}
