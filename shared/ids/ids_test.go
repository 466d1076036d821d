package ids_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mops/coupon-api/shared/ids"
)

func TestFormats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		member, campaign string
		ok               bool
	}{
		{"m0001", "SW-A", true},
		{strings.Repeat("m", ids.MaxMemberIDLen), strings.Repeat("c", ids.MaxCampaignIDLen), true},
		{"!~", "a_Z-9", true},
		{"", "SW-A", false},
		{strings.Repeat("m", ids.MaxMemberIDLen+1), "SW-A", false},
		{"m 1", "SW-A", false},
		{"m\x7f", "SW-A", false},
		{"mé", "SW-A", false},
		{"m0001", "", false},
		{"m0001", strings.Repeat("c", ids.MaxCampaignIDLen+1), false},
		{"m0001", "SW.A", false},
		{"m0001", "SW A", false},
	} {
		err := ids.Request(tc.member, tc.campaign)
		if (err == nil) != tc.ok {
			t.Errorf("Request(%q, %q) = %v, want ok=%v", tc.member, tc.campaign, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ids.ErrInvalid) {
			t.Errorf("Request(%q, %q) = %v, does not wrap ErrInvalid", tc.member, tc.campaign, err)
		}
	}
}
