package main

import (
	"regexp"
	"strings"
	"time"

	"github.com/mops/coupon-api/shared/issuance"
)

// tokyoTime formats t in Asia/Tokyo, RFC 3339, as every verb prints times (docs/api.md).
func tokyoTime(t *time.Time) string {
	if t == nil {
		return "(none)"
	}
	return t.In(issuance.Tokyo).Format(time.RFC3339)
}

// pgTimestamp matches a timestamptz as PostgreSQL writes it in text (DateStyle ISO), in the
// session's TimeZone: 2026-12-05 13:24:30.123456+00, +05:30 or +05:30:15 for odd offsets.
var pgTimestamp = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?[+-]\d{2}(?::\d{2}){0,2}\b`)

// tokyoTimes rewrites the times that SQL functions wrote into msg (a refusal raised with
// format('%s', timestamptz)) as every other time couponctl prints: RFC 3339 at +09:00, the
// fraction of a second kept when there is one.
func tokyoTimes(msg string) string {
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

// refusalTimes is [tokyoTimes] as couponctl prints its errors: a variable, so that a test can
// swap in its broken variant (newuser_test.go).
var refusalTimes = tokyoTimes
