package issue

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/issuance"
)

// The contract's id formats, written out again as an oracle independent of shared/ids
// (docs/api.md: member_id 1-128 bytes of visible ASCII, campaign_id 1-64 bytes of [A-Za-z0-9_-]).
var (
	contractMemberID   = regexp.MustCompile(`^[\x21-\x7E]{1,128}$`)
	contractCampaignID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// FuzzIDs: ids.Request never panics, and accepts exactly the ids of the contract's formats.
//
//	go test -run '^$' -fuzz FuzzIDs -fuzztime 15s ./functions/issue
func FuzzIDs(f *testing.F) {
	for _, seed := range [][2]string{
		{"m0001", "SW-A"}, {"m1", "OPEN"}, {"", "SW-A"}, {"m 1", "SW-A"}, {"会員1", "SW-A"},
		{"m1", "SW A"}, {strings.Repeat("m", 128), strings.Repeat("c", 64)},
		{strings.Repeat("m", 129), "SW-A"}, {"m1", strings.Repeat("c", 65)}, {"m\x7f", "a\x00"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, member, campaignID string) {
		err := ids.Request(member, campaignID)
		want := contractMemberID.MatchString(member) && contractCampaignID.MatchString(campaignID)
		if (err == nil) != want {
			t.Errorf("ids.Request(%q, %q) = %v; the contract says valid = %v", member, campaignID, err, want)
		}
	})
}

// FuzzIssueCoupon drives the whole handler, on a real database, with arbitrary bodies and
// headers: never a panic, never a 5xx, always a JSON answer of the contract, and an answer
// other than 201 writes nothing.
//
//	go test -run '^$' -fuzz FuzzIssueCoupon -fuzztime 15s ./functions/issue
func FuzzIssueCoupon(f *testing.F) {
	pool := pgtest.Pool(f, 4)
	h := faultHandler(f, pool, issuance.Config{})
	for _, seed := range []struct{ body, contentType, encoding string }{
		{`{"member_id": "m0001", "campaign_id": "SW-A"}`, "application/json", ""},
		{`{"member_id": "m0001", "campaign_id": "OPEN"}`, "application/json; charset=utf-8", "identity"},
		{`{"member_id": "m1",`, "application/json", ""},
		{`["m1", "OPEN"]`, "application/json", ""},
		{`{"member_id":"m1","campaign_id":"OPEN","month":"2026-01"}`, "application/json", ""},
		{`{"member_id":"m1","campaign_id":"OPEN","member_id":"m2"}`, "application/json", ""},
		{`{"member_id":"m1","campaign_id":"OPEN"} {}`, "application/json", ""},
		{`{"member_id":1,"campaign_id":"OPEN"}`, "application/json", ""},
		{`{"member_id":"m1","campaign_id":"OPEN"}` + strings.Repeat(" ", 5000), "application/json", ""},
		{`{"member_id":"m1","campaign_id":"OPEN"}`, "text/plain", ""},
		{`{"member_id":"m1","campaign_id":"OPEN"}`, "application/json", "gzip"},
		{`{"member_id":"\u0000","campaign_id":"OPEN"}`, "application/json", ""},
	} {
		f.Add(seed.body, seed.contentType, seed.encoding)
	}
	statuses := map[int]bool{200: true, 201: true, 400: true, 404: true, 409: true, 413: true, 415: true, 503: true}
	f.Fuzz(func(t *testing.T, body, contentType, encoding string) {
		before := writes(t, pool)
		req := jsonPost(strings.NewReader(body), "Content-Type", contentType)
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		r := send(t, h, req)
		if !statuses[r.status] {
			t.Fatalf("body %q: status %d %v, not in the contract", body, r.status, r.body)
		}
		if r.status != http.StatusCreated {
			if after := writes(t, pool); after != before {
				t.Fatalf("body %q: answered %d %s but wrote %d rows", body, r.status, r.result, after-before)
			}
		}
	})
}
